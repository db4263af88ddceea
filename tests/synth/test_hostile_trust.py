"""The one trust gate (headsurgeon/synth/trust.py): a programs.json whose replacement is DSL but whose explanation or a
frontier point is Python is refused on every path without trust, naming the head, the slot and the flag, and
accepted with trust (True, or the set of program hashes)."""
from __future__ import annotations

import json

import pytest

from conftest import CORPUS, STORIES, need
from headsurgeon.cli import main
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.trust import UntrustedProgramError, trust_value

PY_SOURCE = ("def f(seq):\n    w = np.arange(seq.n, dtype=float)\n"
             "    return np.ones((seq.n, seq.n)) * (1.0 + w[None, :])\n")
PY = Program.python(PY_SOURCE)
DSL = Program.parse("prev(1)")
SLOTS = ("explanation", "frontier")


def hidden_python(tmp_path, slot: str) -> str:
    """programs.json with a DSL replacement for L1H2 and a Python program in ``slot`` only."""
    ps = ProgramSet(model="stories260K")
    python = ScoredProgram.of(PY, "someone", budget=200 if slot == "explanation" else None)
    ps.add("L1H2", DSL, explanation=python if slot == "explanation" else None,
           frontier=[ScoredProgram.of(DSL, "someone", budget=60), python] if slot == "frontier" else [])
    path = tmp_path / f"{slot}.json"
    ps.save(path)
    return str(path)


def refusal(error: BaseException, slot: str, flag: str) -> None:
    text = str(error)
    assert "L1H2" in text and slot in text and flag in text and PY.hash in text, text


@pytest.fixture(scope="module")
def handle():
    from headsurgeon.surgery.models.loading import load_model

    need(STORIES / "stories260K.bin")
    return load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")


@pytest.mark.parametrize("slot", SLOTS)
def test_programset_gate_covers_every_slot(tmp_path, slot):
    path = hidden_python(tmp_path, slot)
    with pytest.raises(UntrustedProgramError) as e:
        ProgramSet.load(path).require_trusted()
    refusal(e.value, slot, "trust_programs=True")
    ProgramSet.load(path).require_trusted(True)
    ProgramSet.load(path).require_trusted({PY.hash})
    assert ProgramSet.load(path, trust_programs={PY.hash}).origin is None  # trusted once, marked as such
    with pytest.raises(UntrustedProgramError):
        ProgramSet.load(path, trust_programs={"0" * 64})


def test_programs_built_in_process_are_your_own_code():
    ps = ProgramSet()
    ps.add("L1H2", PY, explanation=ScoredProgram.of(PY, "me", budget=200))
    ps.require_trusted()  # no origin: Program.python(...) in this process is like your own code
    ps.subset(["L1H2"]).require_trusted()


@pytest.mark.parametrize("slot", SLOTS)
def test_replace_heads_gates_sets_and_paths(handle, tmp_path, slot):
    from headsurgeon.surgery.swap.replace import replace_heads

    path = hidden_python(tmp_path, slot)
    for programs in (path, ProgramSet.load(path)):
        with pytest.raises(UntrustedProgramError) as e:
            replace_heads(handle, programs)
        refusal(e.value, slot, "trust_programs=True")
    with pytest.raises(UntrustedProgramError):
        replace_heads(handle, ProgramSet.load(path), which="explanation")
    for trust in (True, {PY.hash}):
        with replace_heads(handle, ProgramSet.load(path), trust_programs=trust) as hybrid:
            assert hybrid.replaced
    with replace_heads(handle, ProgramSet.load(path, trust_programs=True)) as hybrid:
        assert hybrid.replaced


def test_ablate_gates_a_programset(handle, tmp_path):
    from headsurgeon.surgery.measure.ablate import ablate

    path = hidden_python(tmp_path, "explanation")
    with pytest.raises(UntrustedProgramError) as e:
        ablate(handle, ["L1H2"], "program", programs=ProgramSet.load(path))
    refusal(e.value, "explanation", "trust_programs=True")
    with ablate(handle, ["L1H2"], "program", programs=ProgramSet.load(path), trust_programs={PY.hash}) as hybrid:
        assert hybrid.replaced


@pytest.mark.parametrize("slot", SLOTS)
def test_lm_eval_model_and_downstream_gate_every_slot(handle, tmp_path, slot, monkeypatch):
    pytest.importorskip("lm_eval")
    from headsurgeon.surgery.measure import downstream as ds
    from headsurgeon.surgery.measure.lm_eval_model import HeadsurgeonLM

    path = hidden_python(tmp_path, slot)
    for trust in (False, "false"):
        with pytest.raises(UntrustedProgramError) as e:
            HeadsurgeonLM(handle, programs=path, trust_programs=trust)
        refusal(e.value, slot, "--model_args")
    for trust in ("true", True, PY.hash, {PY.hash}):
        assert HeadsurgeonLM(handle, programs=path, trust_programs=trust).model.replaced
    ran = []
    monkeypatch.setattr(ds, "evaluate_tasks", lambda *a, **k: ran.append(a) or {"results": {}, "samples": {}})
    with pytest.raises(UntrustedProgramError):
        ds.downstream(handle, ["eaps6"], programs=path)
    assert not ran, "the base run went first: the gate must refuse before any task runs"
    with pytest.raises(UntrustedProgramError):
        ds.downstream(handle, ["eaps6"], programs=ProgramSet.load(path))
    assert ds.downstream(handle, ["eaps6"], programs=path, trust_programs={PY.hash})["hybrid_heads"] == 1


@pytest.mark.parametrize("slot", SLOTS)
def test_measurements_gate_a_programset(handle, tmp_path, slot, monkeypatch):
    from headsurgeon.surgery.measure import downstream_sweep as dsw
    from headsurgeon.surgery.corpus import make_sequences
    from headsurgeon.surgery.measure.evaluate import per_head_delta_ppl
    from headsurgeon.surgery.measure.sweep import sweep_programs

    path = hidden_python(tmp_path, slot)
    seqs = make_sequences(handle, ["Once upon a time there was a girl. She liked the park."], max_len=16)
    for measure in (lambda **k: per_head_delta_ppl(handle, ProgramSet.load(path), seqs, progress=False, **k),
                    lambda **k: sweep_programs(handle, ProgramSet.load(path), seqs, steps=(0.0, 1.0),
                                                  progress=False, **k)):
        with pytest.raises(UntrustedProgramError) as e:
            measure()
        refusal(e.value, slot, "trust_programs=True")
        assert measure(trust_programs={PY.hash})
    monkeypatch.setattr(dsw, "evaluate_tasks", lambda *a, **k: pytest.fail("ran a task before the trust gate"))
    with pytest.raises(UntrustedProgramError):
        dsw.downstream_sweep(handle, ProgramSet.load(path), ["eaps6"], progress=False)


def test_harness_gates_programs(tmp_path):
    pytest.importorskip("lm_eval")
    from headsurgeon.harness import HarnessLM

    need(STORIES / "stories260K.bin")
    path = hidden_python(tmp_path, "frontier")
    spec = dict(model=f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=str(STORIES / "tok512.model"))
    with pytest.raises(UntrustedProgramError) as e:
        HarnessLM(programs=path, **spec)
    refusal(e.value, "frontier", "--model_args")
    assert HarnessLM(programs=path, trust_programs="true", **spec).model.replaced


def cli(*extra: str) -> list[str]:
    need(STORIES / "stories260K.bin")
    return [f"llama2c:{STORIES / 'stories260K.bin'}", str(need(CORPUS)), "--tokenizer", str(STORIES / "tok512.model"),
            "--max-sequences", "30", "--max-len", "24", "--json", *extra]


@pytest.mark.parametrize("slot", SLOTS)
@pytest.mark.parametrize("which", ("replacement", "explanation"))
def test_cli_eval_refuses_python_in_any_slot(capsys, tmp_path, slot, which):
    path = hidden_python(tmp_path, slot)
    assert main(["eval", *cli("--programs", path, "--which", which)]) == 1
    err = capsys.readouterr().err
    assert err.count("headsurgeon eval: error:") == 1 and "Traceback" not in err
    refusal(err, slot, "--trust-programs")


def test_cli_ablate_refuses_python_in_any_slot(capsys, tmp_path):
    path = hidden_python(tmp_path, "frontier")
    assert main(["ablate", *cli("--kind", "program", "--heads", "L1H2", "--programs", path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    refusal(err, "frontier", "--trust-programs")
    assert main(["ablate", *cli("--kind", "program", "--heads", "L1H2", "--programs", path,
                                "--trust-programs")]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][1]["heads"] == "L1H2"


def test_checkpoints_use_the_same_rule(handle, tmp_path):
    from headsurgeon.hub.checkpoint import UntrustedProgramError, load_hybrid, save_hybrid
    from headsurgeon.surgery.swap.replace import replace_heads

    save_hybrid(replace_heads(handle, {"L1H2": PY}), tmp_path / "ckpt")
    with pytest.raises(UntrustedProgramError, match="L1H2.*trust_programs"):
        load_hybrid(tmp_path / "ckpt")
    for trust in (True, PY.hash, {PY.hash}, "true"):
        assert load_hybrid(tmp_path / "ckpt", trust_programs=trust).replaced


def test_trust_values():
    assert trust_value(True) is True and trust_value(None) is False and trust_value("no") is False
    assert trust_value("ABC+def") == frozenset({"abc", "def"}) and trust_value(["A"]) == frozenset({"a"})
    with pytest.raises(TypeError, match="trust_programs"):
        trust_value(3)
