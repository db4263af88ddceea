"""EAPS-style program libraries: ``prog(sentence, tokenizer) -> (label, matrix)`` files run in the sandbox with the
tokenizer facade, aligned to real stories260K windows, their labels as hypotheses, through ``explain --library``."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from conftest import CORPUS, STORIES, need
from headsurgeon.synth.eaps import LibraryProgram, load_library_file, split_library_source
from headsurgeon.synth.errors import ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.sandbox.facade import TokenizerFacade
from headsurgeon.synth.splits import StoreSplits

# Written in EAPS's style (type hints, typing/transformers imports, len(input_ids) sizing, a label), by hand.
LIBRARY = '''
"""A handful of attention hypotheses for stories260K."""
from typing import Tuple
import numpy as np
from transformers import PreTrainedTokenizerBase

PUNCTUATION = set('!"#$%&\\'()*+,-./:;<=>?@[\\\\]^_`{|}~')


def prog_previous(sentence: str, tokenizer: PreTrainedTokenizerBase) -> Tuple[str, np.ndarray]:
    toks = tokenizer([sentence], return_tensors="pt")
    len_seq = len(toks.input_ids[0])
    out = np.zeros((len_seq, len_seq))
    out[0, 0] = 1.0  # the first token has nothing before it
    for i in range(1, len_seq):
        out[i, i - 1] = 1.0
    return "Previous-token head", out


def prog_first(sentence: str, tokenizer: PreTrainedTokenizerBase) -> Tuple[str, np.ndarray]:
    ids = tokenizer(sentence)["input_ids"]
    n = len(ids)
    out = np.zeros((n, n))
    out[:, 0] = 1.0
    return "Attention sink on the first token (BOS)", out


def prog_same_token(sentence: str, tokenizer: PreTrainedTokenizerBase) -> Tuple[str, np.ndarray]:
    toks = tokenizer([sentence], return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(toks.input_ids[0])
    len_seq = len(tokens)
    out = np.zeros((len_seq, len_seq))
    last_occurrence = {}
    for i, token in enumerate(tokens):
        if token in last_occurrence:
            out[i, last_occurrence[token]] = 1.0
        else:
            out[i, 0] = 1.0  # no earlier occurrence: rest on the first token
        last_occurrence[token] = i
    return "Repeated-token lookup", out


def prog_punctuation(sentence: str, tokenizer: PreTrainedTokenizerBase) -> Tuple[str, np.ndarray]:
    toks = tokenizer([sentence], return_tensors="pt")
    words = tokenizer.convert_ids_to_tokens(toks.input_ids[0])
    len_seq = len(words)
    out = np.zeros((len_seq, len_seq))
    last = -1
    for i, tok in enumerate(words):
        visible = tok.replace("\\u2581", "")
        if i > 0 and visible and all(c in PUNCTUATION for c in visible):
            last = i
        out[i, max(last, 0)] = 1.0
    return "Most recent punctuation mark", out


def prog_dependency(sentence: str, tokenizer: PreTrainedTokenizerBase) -> Tuple[str, np.ndarray]:
    n = len(tokenizer(sentence)["input_ids"])
    heads = tokenizer.features.dep_head  # spaCy's parse, aligned to the window by the library
    out = np.zeros((n, n))
    for i in range(n):
        if heads[i] >= 0:
            out[i, heads[i]] = 1.0
    return "Syntactic head (spaCy dependency parse)", out
'''
# the DSL program each one should equal on every window (causal normalization included)
EQUIVALENT = {
    "prog_previous": "prev(1)",
    "prog_first": "first()",
    "prog_same_token": "same_token_recent()",
    "prog_punctuation": "recent(punct)",
    "prog_dependency": "dep_head()",
}
LABELS = {
    "prog_previous": "Previous-token head",
    "prog_first": "Attention sink on the first token (BOS)",
    "prog_same_token": "Repeated-token lookup",
    "prog_punctuation": "Most recent punctuation mark",
    "prog_dependency": "Syntactic head (spaCy dependency parse)",
}


@pytest.fixture(scope="module")
def windows(stories):
    from headsurgeon.surgery.corpus import make_sequences, read_documents

    docs = read_documents(need(CORPUS))[:40]
    return make_sequences(stories, docs, max_len=48, max_sequences=12)


@pytest.fixture(scope="module")
def library_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lib") / "eaps_lib.py"
    path.write_text(LIBRARY)
    return path


def test_library_file_splits_into_validated_programs(library_file):
    import headsurgeon as hs

    assert hs.load_library_file is load_library_file  # public API
    progs = load_library_file(library_file)
    assert [p.name for p in progs] == list(EQUIVALENT)
    for p in progs:
        assert isinstance(p, LibraryProgram) and p.program.kind == "python"
        assert "typing" not in p.program.text and "PreTrainedTokenizerBase" not in p.program.text
        # each program takes the top-level statements it reads, no others (headsurgeon/synth/eaps.py)
        assert ("PUNCTUATION = " in p.program.text) == (p.name == "prog_punctuation")
        assert p.program.text.count("def ") == 1 and "import numpy as np" in p.program.text


def test_programs_align_with_their_dsl_equivalents(library_file, windows):
    from headsurgeon.synth.sandbox import get_pool

    assert any(s.has_bos for s in windows) and all(s.ids[0] == windows[0].ids[0] for s in windows)
    for p in load_library_file(library_file):
        mine = p.program.evaluate(windows, causal=True)
        ref = Program.parse(EQUIVALENT[p.name]).evaluate(windows, causal=True)
        np.testing.assert_allclose(mine, ref, atol=1e-6, err_msg=p.name)
        _, labels = get_pool().run_labeled(p.program.text, windows[:3])
        assert labels == [LABELS[p.name]] * 3


def test_facade_reproduces_the_window(windows):
    seq = windows[0]
    tok = TokenizerFacade(seq.text, seq.ids, seq.tokens, seq.offsets, seq.has_bos)
    enc = tok(seq.text)
    assert enc["input_ids"] == seq.ids.tolist() and enc.input_ids == seq.ids.tolist()  # BOS included
    assert enc["attention_mask"] == [1] * seq.n and enc["offset_mapping"] == [tuple(o) for o in seq.offsets.tolist()]
    assert tok.tokenize(seq.text) == seq.tokens[1:] and tok.encode(seq.text, add_special_tokens=False) == seq.ids[1:].tolist()
    assert tok.bos_token == tok.cls_token == seq.tokens[0] and tok.bos_token_id == int(seq.ids[0])
    assert tok.all_special_ids == [int(seq.ids[0])] and tok.pad_token is None
    batch = tok([seq.text], return_tensors="pt")
    assert batch.input_ids.shape == (1, seq.n) and batch.input_ids.dtype == np.int64
    assert tok.convert_ids_to_tokens(batch.input_ids[0]) == seq.tokens
    assert tok.convert_tokens_to_ids(seq.tokens[3]) == int(seq.ids[tok.tokenize(seq.text).index(seq.tokens[3]) + 1])
    assert tok.decode(seq.ids, skip_special_tokens=True) == seq.text.strip()
    word = seq.text.split()[1]  # a word of the window on token boundaries: its tokens there, after BOS
    ids = tok(word)["input_ids"]
    assert ids[0] == seq.ids[0] and tok.decode(ids[1:]).strip() == word
    with pytest.raises(ValueError, match="knows only this window"):
        tok("Zebras quarrel over quantum chromodynamics.")
    with pytest.raises(ValueError, match="does not occur in this window"):
        tok.convert_ids_to_tokens(10**6)


def test_sequence_programs_may_return_labels_too(windows):
    from headsurgeon.synth.sandbox import get_pool

    src = "import numpy as np\ndef attend_self(seq):\n    return 'Self attention', np.eye(seq.n)\n"
    results, labels = get_pool().run_labeled(src, windows[:2])
    assert labels == ["Self attention"] * 2 and all(r.shape == (s.n, s.n) for r, s in zip(results, windows))
    assert get_pool().run_labeled("def f(seq):\n    return [[1.0]]\n", windows[:1])[1] == [None]


def test_labels_become_hypotheses_and_compete(stories, library_file, windows):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.synth.search.library import LibrarySearcher
    from headsurgeon.synth.select import select_programs

    store = capture(stories, windows, progress=False)
    searcher = LibrarySearcher(load_library_file(library_file) + ["prev(2)"])
    cands = searcher.search(store, StoreSplits(list(range(6)), list(range(6, 9))), progress=False)
    assert len(cands) == 40 and searcher.report() == ""
    for cs in cands.values():
        hyp = {c.program.text.split("def ")[1].split("(")[0] if c.program.kind == "python" else c.program.text:
               c.hypothesis for c in cs}
        assert {hyp[k] for k in LABELS} == set(LABELS.values())
        assert all(0 <= c.scores["select"]["iou"] <= 1 for c in cs)
    chosen = select_programs(store, cands, StoreSplits((), range(6, 9), range(9, 12)), progress=False)
    lib = [e for e in chosen.entries.values() if e.source == "library" and e.program.kind == "python"]
    assert lib and all(e.hypothesis in LABELS.values() for e in lib)
    # a readable program tied with the winning library program explains the head under the user's label
    tied = [e for e in lib if e.explanation is not None and e.explanation.program != e.program
            and e.explanation.scores["select"]["iou"] == e.scores["select"]["iou"]
            and e.explanation.scores["select"]["jsd"] == e.scores["select"]["jsd"]]
    assert tied and all(e.explanation.hypothesis == e.hypothesis for e in tied)


HOSTILE = {
    "escape": ("def prog(sentence, tokenizer):\n    return ().__class__.__bases__[0].__subclasses__()\n",
               "dunder"),
    "import": ("import os\ndef prog(sentence, tokenizer):\n    return os.listdir('/')\n", "import of 'os'"),
    "spacy_load_numpy": ("import spacy\nimport numpy as spacy\ndef prog(sentence, tokenizer):\n"
                         "    return spacy.load('x')\n", "other than by 'import spacy'"),
    "helper": ("import os\ndef helper(x):\n    return os.getcwd()\ndef prog(sentence, tokenizer):\n"
               "    return helper(1)\n", "import of 'os'"),
    "class": ("class T:\n    pass\ndef prog(sentence, tokenizer):\n    return T()\n", "not allowed"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_library_files_are_refused_before_running(tmp_path, case):
    source, needle = HOSTILE[case]
    path = tmp_path / f"{case}.py"
    path.write_text(source)
    with pytest.raises(ProgramValidationError) as ei:
        load_library_file(path)
    assert needle in str(ei.value) and str(path) in str(ei.value)


BAD_LABELS = textwrap.dedent('''
    import numpy as np
    def prog_huge(sentence, tokenizer):
        n = len(tokenizer(sentence)["input_ids"])
        return "x" * 100000, np.eye(n)
    def prog_number(sentence, tokenizer):
        n = len(tokenizer(sentence)["input_ids"])
        return 42, np.eye(n)
    def prog_lines(sentence, tokenizer):
        n = len(tokenizer(sentence)["input_ids"])
        return "two\\nlines", np.eye(n)
    def prog_good(sentence, tokenizer):
        n = len(tokenizer(sentence)["input_ids"])
        return "Self", np.eye(n)
''')


def test_bad_labels_are_refused_and_dropped(stories, windows, tmp_path):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.synth.sandbox import get_pool
    from headsurgeon.synth.search.library import LibrarySearcher

    path = tmp_path / "bad.py"
    path.write_text(BAD_LABELS)
    progs = {p.name: p for p in load_library_file(path)}
    why = {"prog_huge": "at most 200", "prog_number": "must be a str, got int", "prog_lines": "one line"}
    for name, needle in why.items():
        results, labels = get_pool().run_labeled(progs[name].program.text, windows[:1])
        assert needle in str(results[0]) and labels == [None]
    searcher = LibrarySearcher(list(progs.values()))
    cands = searcher.search(capture(stories, windows[:6], progress=False), StoreSplits([0, 1, 2], [3, 4, 5]), progress=False)
    assert {c.hypothesis for cs in cands.values() for c in cs} == {"Self"}
    assert all(f"{name} ({path})" in searcher.report() for name in why)


@pytest.mark.e2e
def test_explain_cli_runs_library_files(library_file, tmp_path, capsys):
    from headsurgeon.cli import main

    need(STORIES / "stories260K.bin")
    out = tmp_path / "out"
    code = main(["explain", f"llama2c:{STORIES / 'stories260K.bin'}", str(need(CORPUS)), str(out),
                 "--tokenizer", str(STORIES / "tok512.model"), "--max-len", "24", "--max-sequences", "30",
                 "--searchers", "library", "--library", str(library_file)])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "programs.json").read_text())
    entries = doc["programs"]
    lib = [e for e in entries if e["source"] == "library"]
    assert lib and all(e["hypothesis"] in LABELS.values() for e in lib)


def test_explain_cli_refuses_a_hostile_library(tmp_path, capsys):
    from headsurgeon.cli import main

    path = tmp_path / "evil.py"
    path.write_text(HOSTILE["escape"][0])
    code = main(["explain", "tiny-stories", "--library", str(path)])
    err = capsys.readouterr().err
    assert code == 1 and "evil.py" in err and "dunder" in err and err.count("\n") == 1


def test_split_keeps_every_function_when_none_is_named_prog():
    src = "import numpy as np\ndef a(sentence, tokenizer):\n    return 1\ndef a(sentence, tokenizer):\n    return 2\n"
    assert [n for n, _ in split_library_source(src)] == ["a", "a#2"]
