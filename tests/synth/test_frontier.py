"""Selection keeps a frontier per head (explanation, replacement, budgets), rounding, programs.json with
the new fields (small, tables in a side file, old files still load), replace_heads(which=...), fingerprints, cards."""
from __future__ import annotations

import json
import random
import re
import warnings

import numpy as np
import pytest

from headsurgeon.surgery.corpus import make_sequences
from headsurgeon.surgery.swap.replace import SurgeryError, replace_heads
from headsurgeon.surgery.patterns.store import AttentionStore
from headsurgeon.synth import dsl
from headsurgeon.core.scores import Scores
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import BUDGETS, READABLE_CHARS, Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.select import ROUND_TOLERANCE, select_programs
from headsurgeon.synth.vocab import Vocabulary
from headsurgeon.synth.splits import StoreSplits

# the truth of head (0, 0) is a long positional profile: only a program over 200 characters fits it exactly
WEIGHTS = [round(0.9 ** d + 0.013 * ((7 * d) % 5), 6) for d in range(40)]
BIG = "profile(w=[" + ", ".join(str(w) for w in WEIGHTS) + "], tail=0.01)"
TRUTH = {(0, 0): BIG, (0, 1): "0.7123456*prev(1) + 0.2876544*first()", (1, 0): "decay(0.9849)", (1, 1): "first()"}


def _round_by_text(node, digits):
    """A stand-in for dsl.round_numbers (another change adds it): round every float literal of the text."""
    text = re.sub(r"\d+\.\d+(?:e-?\d+)?", lambda m: f"{float(m.group()):.{digits}g}", dsl.to_text(node))
    return dsl.parse(text)


@pytest.fixture(autouse=True)
def rounding(monkeypatch):
    if not hasattr(dsl, "round_numbers"):
        monkeypatch.setattr(dsl, "round_numbers", _round_by_text, raising=False)


@pytest.fixture(scope="module")
def store(stories, documents):
    seqs = make_sequences(stories, documents[:40], max_len=32)[:24]
    store = AttentionStore(seqs, 2, 2)
    progs = {h: Program.parse(t) for h, t in TRUTH.items()}
    for i, s in enumerate(seqs):
        store.put(i, np.stack([np.stack([progs[(l, h)].evaluate([s])[0] for h in range(2)]) for l in range(2)]))
    return store


@pytest.fixture(scope="module")
def vocab(stories):
    return Vocabulary.from_tokenizer(stories.tokenizer)


def _select(store, vocab=None):
    cands = {h: [ScoredProgram(Program.parse(t), "enumerative") for t in ("prev(2)", "decay(0.8)", "window(0, 3)")]
             for h in TRUTH}
    for h, t in TRUTH.items():
        cands[h].append(ScoredProgram(Program.parse(t), "llm", hypothesis="the truth"))
    return select_programs(store, cands, StoreSplits(range(8), range(8, 16), range(16, 24)),
                           progress=False, vocab=vocab), cands


def test_frontier_keeps_a_readable_explanation_and_a_larger_replacement(store, vocab):
    ps, _ = _select(store, vocab)
    assert ps.vocab_fingerprint == vocab.fingerprint
    e = ps.entries[(0, 0)]
    assert e.program == Program.parse(BIG) and e.chars > READABLE_CHARS and e.scores["test"]["iou"] > 0.999
    assert e.explanation is not None and e.explanation.chars <= READABLE_CHARS
    assert e.explanation.program != e.program and e.explanation.gloss
    assert e.explanation.scores["test"]["iou"] < e.scores["test"]["iou"]
    for h, entry in ps.entries.items():
        assert [c.budget for c in entry.frontier] == list(BUDGETS)
        for c in entry.frontier:
            assert c.budget is None or c.chars <= c.budget
            assert c.chars == len(c.program.render(vocab)) and c.size == c.program.size
            assert set(c.scores) == {"synth", "select", "test"}
        ious = [c.scores["select"]["iou"] for c in entry.frontier]
        assert ious[0] <= ious[1] + ROUND_TOLERANCE and ious[1] <= ious[2] + ROUND_TOLERANCE
        assert entry.frontier[-1].program == entry.program
        assert entry.explanation == entry.frontier[BUDGETS.index(READABLE_CHARS)]
    assert ps.programs("explanation")[(1, 1)] == Program.parse("first()")
    rep = ps.entries[(0, 1)].replacement
    assert rep.budget is None and rep.size == ps.entries[(0, 1)].program.size and rep.text and rep.gloss


def test_rounding_keeps_select_iou_within_tolerance(store):
    ps, cands = _select(store)
    proposed = {(h, c.program.hash): c.scores["select"]["iou"] for h, cs in cands.items() for c in cs}
    x = ps.entries[(0, 1)].explanation
    assert x.digits == 2 and "0.71" in x.text and "0.7123456" not in x.text
    rounded_any = False
    for h, entry in ps.entries.items():
        for c in entry.frontier:
            if c.digits is None:
                continue
            rounded_any = True
            original = next(cs.program for cs in cands[h] if cs.source == c.source
                            and dsl.round_numbers(cs.program.node, c.digits) == c.program.node)
            assert abs(c.scores["select"]["iou"] - proposed[(h, original.hash)]) <= ROUND_TOLERANCE
    assert rounded_any
    assert ps.entries[(0, 1)].program == Program.parse(TRUTH[(0, 1)])  # the replacement stays as proposed


def test_programs_json_round_trip_with_the_new_fields(tmp_path, store, vocab):
    ps, _ = _select(store, vocab)
    path = ps.save(tmp_path / "programs.json")
    obj = json.loads(path.read_text())
    assert list(obj)[:5] == ["format", "version", "model", "meta", "vocab_fingerprint"]
    item = obj["programs"][0]
    for key in ("head", "program", "kind", "text", "size", "chars", "gloss", "source", "scores", "explanation",
                "frontier"):
        assert key in item
    ex = item["explanation"]
    assert set(ex["iou"]) == {"synth", "select", "test"} and set(ex["jsd"]) == {"synth", "select", "test"}
    assert [f["budget"] for f in item["frontier"]] == list(BUDGETS)
    again = ProgramSet.load(path)
    assert again.vocab_fingerprint == vocab.fingerprint and again.keys() == ps.keys()
    for h, e in ps.entries.items():
        a = again.entries[h]
        assert (a.program, a.scores, a.text, a.gloss, a.chars) == (e.program, e.scores, e.text, e.gloss, e.chars)
        assert a.explanation == e.explanation and a.frontier == e.frontier


def test_old_programs_json_still_loads(tmp_path):
    old = {"format": "headsurgeon.programset", "version": 1, "model": "m", "meta": {},
           "programs": [{"head": "L0H1", "kind": "dsl", "text": "prev(1)", "program": {"prev": 1},
                         "source": "enumerative", "hypothesis": "", "scores": {"test": {"iou": 0.9, "jsd": 0.1}}}]}
    (tmp_path / "programs.json").write_text(json.dumps(old, indent=1))
    ps = ProgramSet.load(tmp_path / "programs.json")
    e = ps.entries[(0, 1)]
    assert e.program == Program.parse("prev(1)") and e.explanation is None and e.frontier == []
    assert ps.vocab_fingerprint is None and ps.programs("explanation") == {}
    rep = e.replacement
    assert rep.text == "prev(1)" and rep.chars == 7 and rep.size == 2 and rep.scores["test"]["iou"] == 0.9


def _table_program(rng: random.Random) -> str:
    """A fitted table like stories260K's replacements: 8 gated branches of profile × key weights × class table."""
    def w() -> str:
        return str(round(rng.uniform(0.3, 2.5), 4))

    def branch() -> str:
        profile = "profile(w=[" + ", ".join(w() for _ in range(48)) + f"], tail={w()}, bos=1)"
        ids = rng.sample(range(1, 512), 175)
        keys = "key_weight(w=[" + ", ".join(f"[{i}, {w()}]" for i in sorted(ids)) + "])"
        pool = rng.sample(range(1, 512), 62)
        q = "[" + ", ".join(f"[{i}]" for i in pool[:31]) + "]"
        k = "[" + ", ".join(f"[{i}]" for i in pool[31:]) + "]"
        table = "[" + ", ".join("[" + ", ".join(w() for _ in range(31)) + "]" for _ in range(31)) + "]"
        return f"mul({profile}, {keys}, class_weight(q={q}, k={k}, w={table}))"

    text = branch()
    for _ in range(7):
        text = f"gate(ids=[{rng.randrange(1, 512)}], {branch()}, {text})"
    return text


def test_programs_json_stays_under_a_megabyte_for_40_table_programs(tmp_path):
    rng = random.Random(0)
    ps = ProgramSet(model="stories260K", vocab_fingerprint="f" * 64)
    scores = {s: {"iou": 0.6, "jsd": 0.3, "topq": 0.5} for s in ("synth", "select", "test")}
    for i in range(40):
        big = Program.parse(_table_program(rng))
        small = Program.parse(f"0.{i + 10}*prev(1) + 0.3*first()")
        ps.add((i // 8, i % 8), big, "enumerative", scores, explanation=ScoredProgram.of(small, "enumerative", scores, budget=200),
               frontier=[ScoredProgram.of(Program.parse("prev(1)"), "baseline", scores, budget=60),
                         ScoredProgram.of(small, "enumerative", scores, budget=200), ScoredProgram.of(big, "enumerative", scores)])
    assert 80_000 < len(ps.entries[(0, 0)].program.text) < 120_000
    path = ps.save(tmp_path / "programs.json")
    side = tmp_path / "programs.tables.safetensors"
    assert path.stat().st_size <= 1_000_000 and side.exists()
    assert json.loads(path.read_text())["version"] == 2  # readers that know no side file refuse it clearly
    again = ProgramSet.load(path)
    for h in ps:
        assert again[h].hash == ps[h].hash
        assert again.entries[h].chars == ps.entries[h].replacement.chars == len(ps[h].render())
        assert [c.program for c in again.entries[h].frontier] == [c.program for c in ps.entries[h].frontier]
        frontier = again.entries[h].frontier  # a program in several slots is read once: one object
        assert frontier[2].program is again[h] and frontier[1].program is again.entries[h].explanation.program
        assert frontier[0].program is not frontier[1].program
    side.write_bytes(side.read_bytes()[:-1] + b" ")
    with pytest.raises(Exception, match="sha256"):
        ProgramSet.load(path)


def _two_heads(fingerprint=None) -> ProgramSet:
    ps = ProgramSet(model="stories260K", vocab_fingerprint=fingerprint)
    ps.add((0, 0), Program.parse("0.7*prev(1) + 0.3*first()"), explanation=ScoredProgram.of(Program.parse("prev(1)"), "x", budget=200))
    ps.add((0, 1), Program.parse("decay(0.5)"))
    return ps


def test_replace_heads_uses_replacements_by_default_and_explanations_on_request(stories):
    ps = _two_heads(Vocabulary.from_tokenizer(stories.tokenizer).fingerprint)
    with replace_heads(stories, ps) as hybrid:
        assert hybrid.replaced == {(0, 0): Program.parse("0.7*prev(1) + 0.3*first()"), (0, 1): Program.parse("decay(0.5)")}
    with pytest.warns(UserWarning, match="L0H1"):
        hybrid = replace_heads(stories, ps, which="explanation")
    with hybrid:
        assert hybrid.replaced == {(0, 0): Program.parse("prev(1)")}
    with replace_heads(stories, {"L0H1": Program.parse("first()")}) as hybrid:
        assert hybrid.replaced == {(0, 1): Program.parse("first()")}
    with pytest.raises(SurgeryError, match="which"):
        replace_heads(stories, ps, which="best")


def test_a_program_set_from_another_tokenizer_is_refused(stories):
    ps = _two_heads("0123456789ab" + "0" * 52)
    mine = Vocabulary.from_tokenizer(stories.tokenizer).fingerprint
    with pytest.raises(SurgeryError, match="tokenizer") as err:
        replace_heads(stories, ps)
    assert "0123456789ab" in str(err.value) and mine[:12] in str(err.value)


def test_the_model_card_shows_glosses_and_sizes(tmp_path, stories):
    from headsurgeon.hub.checkpoint import save_hybrid

    ps = _two_heads()
    ps.entries[(0, 0)].replacement.scores = Scores({"test": {"iou": 0.75, "jsd": 0.2}})
    with replace_heads(stories, ps) as hybrid:
        folder = save_hybrid(hybrid, tmp_path / "hybrid", programs=ps)
    card = (folder / "README.md").read_text()
    assert "attends to the previous token (70%) and to the first token (30%)" in card
    row = next(line for line in card.splitlines() if line.startswith("| L0H0 |"))
    assert "| 0.75 | 0.2 | unknown | 6 | attends to the previous token (70%)" in row
    assert "what it attends to" in card


def test_the_card_shows_no_absolute_path_caps_glosses_and_labels_scores_measured_before_fine_tuning(tmp_path, stories):
    import torch

    from headsurgeon.hub.card import GLOSS_CHARS
    from headsurgeon.hub.checkpoint import save_hybrid

    ps = _two_heads()
    entry = ps.entries[(0, 1)]
    entry.replacement = ScoredProgram(entry.program, text="decay(0.5)",
                                      gloss="weighs each key by its token: " + ", ".join(f"#{i} 0.5" for i in range(136)))
    ps.entries[(0, 0)].replacement.scores = Scores({"test": {"iou": 0.75, "jsd": 0.2}})
    hybrid = replace_heads(stories, ps, copy=True)
    folder = save_hybrid(hybrid, tmp_path / "as-loaded", metrics={"corpus": str(tmp_path / "corpus.txt")}, programs=ps)
    card = (folder / "README.md").read_text()
    assert str(tmp_path) not in card and "/" + tmp_path.name not in card  # no absolute path of this machine
    assert 'hs.load_hybrid("as-loaded")' in card and "| corpus | corpus.txt |" in card
    assert "before fine-tuning" not in card  # the weights are the base's: nothing to label
    row = next(line for line in card.splitlines() if line.startswith("| L0H1 |"))
    gloss = row.rstrip(" |").rsplit("| ", 1)[1].strip("`")  # a code span: "#" is not plain Markdown
    assert gloss.endswith("…") and len(gloss) <= GLOSS_CHARS and "#135" not in row
    with torch.no_grad():  # a step of "fine-tuning": the checkpoint now embeds weights that differ from the base
        next(p for n, p in hybrid.named_parameters() if "mlp" in n).add_(0.01)
    card = (save_hybrid(hybrid, tmp_path / "tuned", programs=ps) / "README.md").read_text()
    metrics, heads = card.split("## Metrics")[1].split("## Replaced heads")
    assert "Measured before fine-tuning" in metrics and "Measured before fine-tuning" in heads
    assert "weight tensors differ from the base model" in metrics and str(tmp_path) not in card
    hybrid.restore()
