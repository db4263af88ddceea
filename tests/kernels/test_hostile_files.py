"""Hostile files: every reader of a file someone else may have written refuses symlinks (to /dev/zero) and oversized
files before reading (headsurgeon/core/fileio.py ``read_bounded``); the explain journal refuses forged, edited and orphaned
records (headsurgeon/scaleout/journal.py); and the CLI reports file-system failures in one line."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from conftest import CORPUS, need
from headsurgeon.cli import main
from headsurgeon.core.fileio import UnsafeFileError, read_bounded
from headsurgeon.scaleout.journal import HeadJournal, JournalError
from headsurgeon.synth.errors import ProgramError
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import Entry, ProgramSet
from headsurgeon.synth.scored import ScoredProgram

PY = Program.python("def f(seq):\n    return np.ones((seq.n, seq.n))\n")


def zero_link(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/zero")
    return path


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that occupies no disk (truncate), to stand for an oversized one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# ------------------------------------------------------------------------------------------ the bounded reader


def test_read_bounded_refuses_links_devices_and_oversized_files(tmp_path):
    (tmp_path / "ok").write_bytes(b"abc")
    assert read_bounded(tmp_path / "ok", 3) == b"abc"
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        read_bounded(zero_link(tmp_path / "z"), 1 << 20)
    with pytest.raises(UnsafeFileError, match="not a regular file"):
        read_bounded("/dev/zero", 1 << 20)
    with pytest.raises(UnsafeFileError, match="at most 4 bytes"):
        read_bounded(sparse(tmp_path / "big", 1 << 40), 4)  # a terabyte, refused by its size alone
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "absent", 4)


def test_programs_file_and_tables(tmp_path, monkeypatch):
    from headsurgeon.synth import programs_file, programtables

    with pytest.raises(ProgramError, match="symbolic link"):
        ProgramSet.load(zero_link(tmp_path / "programs.json"))
    monkeypatch.setattr(programs_file, "MAX_PROGRAMS_BYTES", 1000)
    with pytest.raises(ProgramError, match="at most 1000 bytes"):
        ProgramSet.load(sparse(tmp_path / "big.json", 1001))
    zero_link(tmp_path / "p.tables.safetensors")
    with pytest.raises(ProgramError, match="symbolic link"):
        programtables.load_tables(tmp_path / "p.json", {"file": "p.tables.safetensors", "sha256": "0" * 64})
    monkeypatch.setattr(programtables, "MAX_TABLES_BYTES", 1000)
    sparse(tmp_path / "q.tables.safetensors", 1001)
    with pytest.raises(ProgramError, match="at most 1000 bytes"):
        programtables.load_tables(tmp_path / "q.json", {"file": "q.tables.safetensors", "sha256": "0" * 64})


def test_store_manifest_and_sequences(tmp_path, monkeypatch):
    from headsurgeon.surgery.patterns import store
    from headsurgeon.surgery.patterns.store import StoreError, read_manifest, read_sequences

    with pytest.raises(StoreError, match="symbolic link.*capture again"):
        read_manifest(zero_link(tmp_path / "a" / "manifest.json"))
    zero_link(tmp_path / "a" / "sequences.json")
    with pytest.raises(StoreError, match="symbolic link.*capture again"):
        read_sequences(tmp_path / "a")
    monkeypatch.setattr(store, "MAX_MANIFEST_BYTES", 100)
    monkeypatch.setattr(store, "MAX_SEQUENCES_BYTES", 100)
    with pytest.raises(StoreError, match="at most 100 bytes"):
        read_manifest(sparse(tmp_path / "b" / "manifest.json", 101))
    sparse(tmp_path / "b" / "sequences.json", 101)
    with pytest.raises(StoreError, match="at most 100 bytes"):
        read_sequences(tmp_path / "b")


def test_store_shards_are_read_only_up_to_their_recorded_size(stories, documents, tmp_path):
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences
    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    seqs = make_sequences(stories, documents[:4], max_len=16)
    capture(stories, seqs, out=tmp_path / "s", shard_size=len(seqs), progress=False)
    shard = next((tmp_path / "s").glob("shard_*.safetensors"))
    size = shard.stat().st_size
    with open(shard, "ab") as f:  # grown past its manifest record: refused by size, never read whole
        f.truncate(size + (1 << 40))
    with pytest.raises(StoreError, match=f"at most {size} bytes|has {size + (1 << 40)} bytes, the manifest recorded {size}"):
        AttentionStore.load(tmp_path / "s").patterns(0)
    shard.unlink()
    zero_link(shard)
    with pytest.raises(StoreError, match="symbolic link|shard_00000.safetensors missing"):  # never followed
        AttentionStore.load(tmp_path / "s").patterns(0)


def test_head_store(tmp_path, monkeypatch):
    from headsurgeon.scaleout import headstore
    from headsurgeon.surgery.patterns.store import StoreError

    zero_link(tmp_path / "a" / "manifest.json")
    with pytest.raises(StoreError, match="symbolic link"):
        headstore.HeadStore(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("{}")
    zero_link(tmp_path / "b" / "sequences.json")
    with pytest.raises(StoreError, match="symbolic link"):
        headstore.HeadStore(tmp_path / "b")
    monkeypatch.setattr(headstore, "MAX_MANIFEST_BYTES", 100)
    sparse(tmp_path / "c" / "manifest.json", 101)
    with pytest.raises(StoreError, match="at most 100 bytes"):
        headstore.HeadStore(tmp_path / "c")


def test_tp_run_folder(tmp_path):
    from headsurgeon.tp.rundir import load_program, load_run

    zero_link(tmp_path / "run" / "config.json")
    (tmp_path / "run" / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        load_run(tmp_path / "run")
    zero_link(tmp_path / "run" / "program.json")
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        load_program(tmp_path / "run")
    sparse(tmp_path / "big" / "program.json", (256 << 20) + 1)
    with pytest.raises(UnsafeFileError, match="at most"):
        load_program(tmp_path / "big")


def test_tp_training_state_is_read_bounded(tmp_path, monkeypatch):
    import torch

    from headsurgeon.tp import resume

    (tmp_path / "real.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / resume.STATE_FILE).symlink_to(tmp_path / "real.safetensors")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        resume.load_state(tmp_path / "run", model, opt, torch.Generator())
    monkeypatch.setattr(resume, "MAX_WEIGHTS_BYTES", 1000)
    sparse(tmp_path / "big" / resume.STATE_FILE, 1001)
    with pytest.raises(UnsafeFileError, match="at most 1000 bytes"):
        resume.load_state(tmp_path / "big", model, opt, torch.Generator())


# ------------------------------------------------------------------------------------------ the journal


@pytest.fixture
def keys(tmp_path, monkeypatch) -> Path:
    """Run keys in a folder of this test (outside OUT, as in real runs)."""
    monkeypatch.setenv("HEADSURGEON_JOURNAL_KEYS", str(tmp_path / "keys"))
    return tmp_path / "keys"


def journal(tmp_path) -> HeadJournal:
    book = HeadJournal(tmp_path / "out" / "heads")
    book.start({"seed": 0})
    book.write({"head": "L0H0", "entry": Entry(ScoredProgram(Program.parse("prev(1)"), scores={"test": {"iou": 0.5}})).to_json((0, 0))})
    return book


def test_journal_resumes_its_own_records_and_keeps_the_key_private(tmp_path, keys):
    journal(tmp_path)
    again = HeadJournal(tmp_path / "out" / "heads")
    assert list(again.start({"seed": 0})) == [(0, 0)]
    assert again.programset([(0, 0)], trust=frozenset())[(0, 0)] == Program.parse("prev(1)")
    fresh = HeadJournal(tmp_path / "out" / "heads")  # as explain_store reads it back: run.json gives the key
    assert fresh.programset([(0, 0)], trust=frozenset())[(0, 0)] == Program.parse("prev(1)")
    (key,) = keys.iterdir()
    assert key.stat().st_mode & 0o777 == 0o600 and not (tmp_path / "out" / "heads" / key.name).exists()


def test_journal_refuses_a_forged_python_record(tmp_path, keys):
    journal(tmp_path)
    forged = {"head": "L0H1", "entry": Entry(ScoredProgram(PY, scores={"test": {"iou": 1.0}})).to_json((0, 1)), "mac": "0" * 64}
    (tmp_path / "out" / "heads" / "L0H1.json").write_text(json.dumps(forged))
    with pytest.raises(JournalError, match=r"L0H1\.json was not written by this run.*delete .*heads to start over"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})


def test_journal_refuses_a_record_edited_after_writing(tmp_path, keys):
    journal(tmp_path)
    path = tmp_path / "out" / "heads" / "L0H0.json"
    path.write_text(path.read_text().replace("0.5", "0.99"))
    with pytest.raises(JournalError, match=r"L0H0\.json .*altered.*start over"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})


def test_journal_refuses_records_without_run_json(tmp_path, keys):
    journal(tmp_path)
    (tmp_path / "out" / "heads" / "run.json").unlink()
    with pytest.raises(JournalError, match="no run.json.*start over"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})


def test_journal_refuses_a_run_whose_key_is_elsewhere(tmp_path, keys, monkeypatch):
    journal(tmp_path)
    monkeypatch.setenv("HEADSURGEON_JOURNAL_KEYS", str(tmp_path / "other-machine"))
    with pytest.raises(JournalError, match="key .* is not on this machine.*start over"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})


def test_journal_python_needs_the_runs_own_trust(tmp_path, keys):
    from headsurgeon.scaleout.stage import run_trust
    from headsurgeon.synth.trust import UntrustedProgramError

    book = HeadJournal(tmp_path / "heads")
    book.start({})
    book.write({"head": "L0H0", "entry": Entry(ScoredProgram(PY)).to_json((0, 0))})
    with pytest.raises(UntrustedProgramError, match="L0H0 replacement.*start over"):
        book.programset([(0, 0)], trust=run_trust(["enumerative", "learned"], {}))
    assert book.programset([(0, 0)], trust=run_trust(["enumerative", "library"], {"library": [PY]}))
    assert book.programset([(0, 0)], trust=run_trust(["enumerative", "llm"], {}))


def test_journal_refuses_a_symlinked_or_huge_record(tmp_path, keys, monkeypatch):
    from headsurgeon.scaleout import journal as jr

    journal(tmp_path)
    zero_link(tmp_path / "out" / "heads" / "L0H2.json")
    with pytest.raises(JournalError, match=r"L0H2\.json .*symbolic link.*start over"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})
    (tmp_path / "out" / "heads" / "L0H2.json").unlink()
    monkeypatch.setattr(jr, "MAX_RECORD_BYTES", 10)
    with pytest.raises(JournalError, match="at most 10 bytes"):
        HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})


# ------------------------------------------------------------------------------------------ one-line CLI errors


def one_line(capsys, argv: list[str], command: str) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"headsurgeon {command}: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def test_cli_explain_out_is_a_file(capsys, tmp_path):
    (tmp_path / "out").write_text("a file")
    line = one_line(capsys, ["explain", "tiny-stories", str(need(CORPUS)), str(tmp_path / "out")], "explain")
    assert "out is a file" in line and "folder" in line


def test_cli_capture_into_a_file_and_a_read_only_place(capsys, tmp_path, monkeypatch):
    (tmp_path / "out").write_text("a file")
    argv = ["capture", "tiny-stories", str(need(CORPUS)), "--max-sequences", "4", "--max-len", "16"]
    line = one_line(capsys, [*argv, str(tmp_path / "out")], "capture")
    assert "out" in line and "another output path" in line
    if os.geteuid() == 0:  # root writes through chmod 0500: /sys refuses even root
        one_line(capsys, [*argv, "/sys/headsurgeon-test/out"], "capture")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        one_line(capsys, [*argv, str(tmp_path / "ro" / "out")], "capture")

    def read_only(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)  # a read-only file system, which root cannot get here otherwise
    line = one_line(capsys, [*argv, str(tmp_path / "new")], "capture")
    assert "Read-only file system" in line and "new" in line


def test_cli_explain_reports_a_forged_journal_in_one_line(capsys, tmp_path, keys):
    (tmp_path / "out" / "heads").mkdir(parents=True)
    (tmp_path / "out" / "heads" / "L0H0.json").write_text(json.dumps({"head": "L0H0", "entry": None}))
    line = one_line(capsys, ["explain", "tiny-stories", str(need(CORPUS)), str(tmp_path / "out"),
                             "--max-sequences", "12", "--max-len", "16", "--searchers", "enumerative"], "explain")
    assert "L0H0.json" in line and "no run.json" in line and "start over" in line


def test_cli_explain_checks_task_names_before_capture(capsys, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from headsurgeon.surgery.measure import downstream

    monkeypatch.setattr(downstream, "task_manager",
                        lambda include_path=None, tasks=None: SimpleNamespace(all_tasks={"eaps6"}))
    line = one_line(capsys, ["explain", "tiny-stories", str(need(CORPUS)), str(tmp_path / "out"),
                             "--tasks", "no_such_task_xyz"], "explain")
    assert "no_such_task_xyz" in line
    assert not (tmp_path / "out" / "store").exists()  # refused before the capture


def test_a_truncated_record_is_dropped_and_the_rest_kept(tmp_path, keys):
    book = journal(tmp_path)
    book.write({"head": "L0H1", "entry": None})
    path = tmp_path / "out" / "heads" / "L0H1.json"
    path.write_bytes(path.read_bytes()[:20])  # a disk that lost the end of one record
    with pytest.warns(UserWarning, match=r"L0H1\.json is damaged.*dropped it, so that head is searched again"):
        again = HeadJournal(tmp_path / "out" / "heads").start({"seed": 0})
    assert list(again) == [(0, 0)] and not path.exists()
