"""Hostile input to the CLI and the capture store: bad numbers, malformed programs.json, untrusted Python
programs, missing model files, damaged shards and huge values all end in one clean library error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import CORPUS, STORIES, need
from headsurgeon.cli import main

PY_SOURCE = ("def f(seq):\n    w = np.arange(seq.n, dtype=float)\n"
             "    return np.ones((seq.n, seq.n)) * (1.0 + w[None, :])\n")
HUGE = "x" * (10 << 20)


def model_args() -> list[str]:
    need(STORIES / "stories260K.bin")
    return [f"llama2c:{STORIES / 'stories260K.bin'}", "--tokenizer", str(STORIES / "tok512.model")]


def eval_args(*extra: str) -> list[str]:
    """``eval`` on stories260K with a handful of short windows (seconds)."""
    model, *tok = model_args()
    return ["eval", model, str(need(CORPUS)), *tok, "--max-sequences", "30", "--max-len", "24", "--json", *extra]


def one_clean_error(capsys, argv: list[str], command: str, rc: int = 1) -> str:
    """Run the CLI in-process; require exit code ``rc`` and one ``headsurgeon CMD: error:`` line, no traceback."""
    assert main(argv) == rc
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"headsurgeon {command}: error:")]
    assert len(lines) == 1, err[-2000:]
    assert "Traceback" not in err
    return lines[0]


def argparse_error(capsys, argv: list[str]) -> str:
    """An argparse refusal: exit code 2 and a one-line ``error: argument ...`` message."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = next(line for line in err.splitlines() if ": error: " in line)
    assert len(line) < 400
    return line


# ------------------------------------------------------------------------------------------ numeric arguments


CAPTURE = ["capture", "tiny-stories", "corpus.txt", "out"]
EVAL = ["eval", "tiny-stories", "corpus.txt"]


@pytest.mark.parametrize("argv, flag", [
    (CAPTURE + ["--shard-size", "0"], "--shard-size"),
    (CAPTURE + ["--shard-size", "-3"], "--shard-size"),
    (CAPTURE + ["--batch-size", "0"], "--batch-size"),
    (CAPTURE + ["--q", "5"], "--q"),
    (CAPTURE + ["--q", "0"], "--q"),
    (CAPTURE + ["--q", "nan"], "--q"),
    (CAPTURE + ["--max-len", "1"], "--max-len"),
    (CAPTURE + ["--max-sequences", "0"], "--max-sequences"),
    (CAPTURE + ["--shard-size", "9" * 5000], "--shard-size"),
    (EVAL + ["--max-len", "0"], "--max-len"),
    (EVAL + ["--max-sequences", "-1"], "--max-sequences"),
    (EVAL + ["--seed", "-1"], "--seed"),
    (["ablate", "tiny-stories", "corpus.txt", "--heads", "L0H0", "--max-len", "x"], "--max-len"),
    (["explain", "--max-sequences", "0"], "--max-sequences"),
    (["explain", "--llm-cost-cap", "-1"], "--llm-cost-cap"),
    (["explain", "--tasks", "hs_cloze", "--limit", "1.5"], "--limit"),
    (EVAL + ["--tasks", "hs_cloze", "--limit", "nan"], "--limit"),
    (EVAL + ["--tasks", "hs_cloze", "--limit", "0"], "--limit"),
    (["demo", "--max-len", "0"], "--max-len"),
    (["tp", "train", "hist", "--epochs", "0"], "--epochs"),
    (["tp", "train", "hist", "--batch-size", "0"], "--batch-size"),
    (["tp", "train", "hist", "--lr", "inf"], "--lr"),
])
def test_bad_numbers_are_refused_by_the_parser(capsys, argv, flag):
    line = argparse_error(capsys, argv)
    assert f"argument {flag}:" in line


def test_bad_numbers_are_refused_by_the_api(stories, documents):
    from headsurgeon.surgery.patterns.capture import CaptureError, capture
    from headsurgeon.surgery.corpus import CorpusError, make_sequences
    from headsurgeon.surgery.measure.evaluate import EvaluationError, perplexity
    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    seqs = make_sequences(stories, documents[:2], max_len=16)
    with pytest.raises(StoreError, match="shard_size"):
        AttentionStore(seqs, 5, 8, shard_size=0)
    with pytest.raises(StoreError, match="q_frac"):
        AttentionStore(seqs, 5, 8, mode="topq", q_frac=5)
    with pytest.raises(CaptureError, match="batch_size"):
        capture(stories, seqs, batch_size=0, progress=False)
    with pytest.raises(StoreError, match="shard_size"):
        capture(stories, seqs, shard_size=0, progress=False)
    with pytest.raises(StoreError, match="q_frac"):
        capture(stories, seqs, mode="topq", q_frac=float("nan"), progress=False)
    with pytest.raises(EvaluationError, match="batch_size"):
        perplexity(stories, seqs, batch_size=0, progress=False)
    with pytest.raises(CorpusError, match="max_sequences"):
        make_sequences(stories, documents[:2], max_len=16, max_sequences=0)
    for error in (CaptureError, EvaluationError, StoreError, CorpusError):
        assert issubclass(error, ValueError)


# ------------------------------------------------------------------------------------------ error handler


def test_unexpected_exceptions_still_raise(monkeypatch):
    import headsurgeon.cli as cli

    def buggy(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "cmd_info", buggy)
    with pytest.raises(ZeroDivisionError):
        main(["info"])


def test_library_errors_print_one_line(capsys, monkeypatch):
    import headsurgeon.cli as cli
    from headsurgeon.synth.errors import ProgramError

    def raises(args):
        raise ProgramError("bad program\n" + HUGE)

    monkeypatch.setattr(cli, "cmd_info", raises)
    line = one_clean_error(capsys, ["info"], "info")
    assert "bad program" in line and len(line) < 2000


def test_info_on_a_missing_llama2c_file_names_the_file(capsys, tmp_path):
    missing = tmp_path / "missing.bin"
    line = one_clean_error(capsys, ["info", f"llama2c:{missing}"], "info")
    assert str(missing) in line and "tokenizer" not in line
    line = one_clean_error(capsys, ["info", f"llama2c:{missing}", "--tokenizer", "tok.model"], "info")
    assert str(missing) in line and "tokenizer" not in line


def test_error_exit_code_from_a_subprocess(tmp_path):
    r = subprocess.run([sys.executable, "-m", "headsurgeon.cli", "capture", "tiny-stories", "c.txt", str(tmp_path),
                        "--shard-size", "0"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--shard-size" in r.stderr
    r = subprocess.run([sys.executable, "-m", "headsurgeon.cli", "info", f"llama2c:{tmp_path / 'nope.bin'}"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and "nope.bin" in r.stderr


# ------------------------------------------------------------------------------------------ programs.json


def programset(*items: dict) -> dict:
    return {"format": "headsurgeon.programset", "version": 1, "programs": list(items)}


def write(tmp_path, obj, name: str = "programs.json") -> str:
    path = tmp_path / name
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(path)


MALFORMED = {
    "bad_json": "{bad",
    "empty": "",
    "a_list": [1, 2],
    "programs_not_a_list": {"format": "headsurgeon.programset", "version": 1, "programs": 5},
    "version_not_a_number": {"format": "headsurgeon.programset", "version": "x", "programs": []},
    "item_not_an_object": programset("L0H0"),
    "item_without_head": programset({"program": {"first": {}}}),
    "item_without_program": programset({"head": "L0H0"}),
    "bad_head": programset({"head": "layer zero", "program": {"first": {}}}),
    "invalid_dsl": programset({"head": "L0H0", "program": {"dsl": "nonsense(("}}),
    "unknown_primitive": programset({"head": "L0H0", "program": {"nope": {}}}),
    "python_that_imports": programset({"head": "L0H0", "program": {"python": "import os\ndef f(s):\n    return 1\n"}}),
    "deep_nesting": "[" * 100000 + "]" * 100000,
    "many_digits": '{"format": "headsurgeon.programset", "version": ' + "9" * 5000 + ', "programs": []}',
    "digits_in_program": programset({"head": "L0H0", "program": {"dsl": "prev(" + "9" * 5000 + ")"}}),
    "huge_head": programset({"head": "L0H0" + HUGE, "program": {"first": {}}}),
    "huge_dsl_value": programset({"head": "L0H0", "program": {"dsl": HUGE}}),
    "huge_primitive_name": programset({"head": "L0H0", "program": {HUGE: {}}}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_programs_json_is_one_clean_error(capsys, tmp_path, case):
    path = write(tmp_path, MALFORMED[case])
    line = one_clean_error(capsys, eval_args("--programs", path), "eval")
    assert "programs.json" in line
    assert len(line) < 1200  # never echoes a 10 MB value


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_programs_json_through_the_api_is_a_program_error(tmp_path, case):
    """ProgramSet.load is the same checked reader the CLI uses (headsurgeon/synth/programs_file.py): no raw exception escapes."""
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.programset import ProgramSet

    path = write(tmp_path, MALFORMED[case])
    with pytest.raises(ProgramError) as caught:
        ProgramSet.load(path)
    assert "programs.json" in str(caught.value) and len(str(caught.value)) < 1200


def test_missing_programs_file(capsys, tmp_path):
    line = one_clean_error(capsys, eval_args("--programs", str(tmp_path / "none.json")), "eval")
    assert "none.json" in line and "--programs" in line


def python_programs(tmp_path) -> str:
    return write(tmp_path, programset(
        {"head": "L0H0", "kind": "python", "program": {"python": PY_SOURCE}},
        {"head": "L1H2", "kind": "dsl", "program": {"first": {}}},
        {"head": "L2H3", "kind": "python", "program": {"python": PY_SOURCE}}))


def test_eval_refuses_python_programs_without_trust(capsys, tmp_path):
    line = one_clean_error(capsys, eval_args("--programs", python_programs(tmp_path)), "eval")
    assert "L0H0" in line and "L2H3" in line and "L1H2" not in line and "--trust-programs" in line


def test_eval_runs_python_programs_with_trust(capsys, tmp_path):
    assert main(eval_args("--programs", python_programs(tmp_path), "--trust-programs")) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hybrid_ppl"] > 0


def test_eval_runs_dsl_programs_without_trust(capsys, tmp_path):
    path = write(tmp_path, programset({"head": "L1H2", "program": {"first": {}}}))
    assert main(eval_args("--programs", path)) == 0
    assert json.loads(capsys.readouterr().out)["hybrid_ppl"] > 0


def ablate_args(*extra: str) -> list[str]:
    model, *tok = model_args()
    return ["ablate", model, str(need(CORPUS)), *tok, "--max-sequences", "30", "--max-len", "24", "--json",
            "--kind", "program", *extra]


def test_ablate_refuses_python_programs_without_trust(capsys, tmp_path):
    path = python_programs(tmp_path)
    line = one_clean_error(capsys, ablate_args("--heads", "L0H0,L1H2", "--programs", path), "ablate")
    assert "L0H0" in line and "--trust-programs" in line
    assert main(ablate_args("--heads", "L1H2", "--programs", path)) == 0  # only DSL programs run: no trust needed
    assert json.loads(capsys.readouterr().out)["rows"][1]["heads"] == "L1H2"


def test_ablate_with_malformed_programs(capsys, tmp_path):
    path = write(tmp_path, MALFORMED["programs_not_a_list"])
    one_clean_error(capsys, ablate_args("--heads", "L0H0", "--programs", path), "ablate")
    one_clean_error(capsys, ablate_args("--heads", "L0H0"), "ablate")  # --kind program without --programs


# ------------------------------------------------------------------------------------------ damaged shards


@pytest.fixture(scope="module")
def small_seqs(stories, documents):
    from headsurgeon.surgery.corpus import make_sequences

    return make_sequences(stories, documents[:10], max_len=24, max_sequences=8)


def damage(path, how: str) -> None:
    """Truncate, flip one bit in, or delete a shard file."""
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "bitflip":
        data = bytearray(path.read_bytes())
        data[-3] ^= 0x10
        path.write_bytes(bytes(data))
    else:
        path.unlink()


def assert_same_store(a, b) -> None:
    assert len(a) == len(b)
    for i in range(len(a)):
        assert np.array_equal(a.patterns(i), b.patterns(i))


@pytest.mark.parametrize("how", ["truncate", "bitflip", "delete"])
def test_resume_recomputes_a_damaged_shard(stories, small_seqs, tmp_path, how):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.patterns.store import AttentionStore

    reference = capture(stories, small_seqs, progress=False)
    out = tmp_path / "store"
    capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    damage(out / "shard_00001.safetensors", how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    if how != "delete":
        assert any("shard_00001" in str(w.message) for w in caught)
    assert_same_store(AttentionStore.load(out), reference)
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


@pytest.mark.parametrize("how", ["truncate", "bitflip", "delete"])
def test_reading_a_damaged_shard_names_it(stories, small_seqs, tmp_path, how):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    out = tmp_path / "store"
    capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    damage(out / "shard_00001.safetensors", how)
    with pytest.raises(StoreError, match="shard_00001") as e:
        store = AttentionStore.load(out)
        for i in range(len(store)):
            store.patterns(i)
    assert "capture" in str(e.value)  # the fix: re-run the capture to recompute it


def test_resume_checks_shards_of_a_manifest_without_hashes(stories, small_seqs, tmp_path):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.patterns.store import AttentionStore

    reference = capture(stories, small_seqs, progress=False)
    out = tmp_path / "store"
    capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    meta = json.loads((out / "manifest.json").read_text())
    meta.pop("shards", None)
    (out / "manifest.json").write_text(json.dumps(meta))
    damage(out / "shard_00000.safetensors", "truncate")
    with pytest.warns(UserWarning, match=r"shard_00000\.safetensors is damaged or missing .*recomputing it"):
        capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    assert_same_store(AttentionStore.load(out), reference)


def test_resume_with_a_corrupted_manifest_is_a_store_error(stories, small_seqs, tmp_path):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.patterns.store import StoreError

    out = tmp_path / "store"
    capture(stories, small_seqs, out=out, shard_size=3, progress=False)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="manifest.json"):
        capture(stories, small_seqs, out=out, shard_size=3, progress=False)


def test_cli_capture_resume_with_a_damaged_shard(capsys, tmp_path):
    from headsurgeon.surgery.patterns.store import AttentionStore

    model, *tok = model_args()
    out = tmp_path / "store"
    argv = ["capture", model, str(need(CORPUS)), str(out), *tok, "--max-sequences", "6", "--max-len", "24",
            "--shard-size", "2", "--batch-size", "2"]
    assert main(argv) == 0
    first = AttentionStore.load(out)
    before = [first.patterns(i) for i in range(len(first))]
    damage(out / "shard_00002.safetensors", "bitflip")
    with pytest.warns(UserWarning, match=r"shard_00002\.safetensors is damaged or missing \(its sha256 differs"):
        assert main(argv) == 0
    again = AttentionStore.load(out)
    for i, pattern in enumerate(before):
        assert np.array_equal(again.patterns(i), pattern)


# ------------------------------------------------------------------------------------------ checked before loading


def _no_model_loads(monkeypatch):
    import headsurgeon.pipeline as pipeline
    import headsurgeon.surgery.models.loading as loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(pipeline, "load_model", refuse)
    monkeypatch.setattr(loading, "load_model", refuse)


@pytest.mark.parametrize("extra, corpus, message", [
    (["--searchers", "enumerativ"], None, r"unknown searcher 'enumerativ'; choose from \(.*'enumerative'"),
    ([], "missing.txt", r"corpus file not found: .*missing\.txt"),
    ([], "folder", r"the corpus .*folder is not a regular file"),
    (["--store-url", "file:///tmp/store"], None, r"store_url tells Ray workers where the store is.*drop --store-url"),
    (["--separator="], None, r"the document separator must be a non-empty string, got ''"),
])
def test_explain_checks_its_arguments_before_any_model_loads(capsys, monkeypatch, tmp_path, extra, corpus, message):
    _no_model_loads(monkeypatch)
    (tmp_path / "folder").mkdir()
    path = str(tmp_path / corpus) if corpus else str(need(CORPUS))
    line = one_clean_error(capsys, ["explain", "tiny-stories", path, str(tmp_path / "out"), *extra], "explain")
    assert __import__("re").search(message, line), line


@pytest.mark.parametrize("argv", [["score", "--head", "L9H9", "--program", "first()"],
                                  ["ablate", "--heads", "L0H1,L9H9", "--kind", "mean"]])
@pytest.mark.smoke
def test_a_head_the_model_lacks_is_refused_from_its_config(capsys, monkeypatch, argv):
    _no_model_loads(monkeypatch)
    command, *flags = argv
    model, *tok = model_args()
    line = one_clean_error(capsys, [command, model, str(need(CORPUS)), *tok, *flags], command)
    assert "layer 9 does not exist: stories260K.bin has layers 0..4" in line


def test_a_head_a_hugging_face_folder_lacks_is_refused_from_its_config(capsys, monkeypatch, tmp_path):
    _no_model_loads(monkeypatch)
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                                    "num_attention_heads": 4}))
    line = one_clean_error(capsys, ["ablate", str(folder), str(need(CORPUS)), "--heads", "L1H4"], "ablate")
    assert "head 4 does not exist: tiny-llama has query heads 0..3 per layer" in line
