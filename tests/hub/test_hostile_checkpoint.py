"""Hostile checkpoints and careless saves: tampered manifests, symlinks, special files, user files.

The attacker controls the whole checkpoint folder, so every tampered file is listed in the manifest
with its true sha256 and size (the integrity check alone cannot catch these); what must stop them is
the loader's rules: kind, suffix and content agree; no symlink, no special file, no path outside the
folder; sizes are required and never read past. Saving must never delete a file it did not write.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from headsurgeon.hub import checkpoint as ck
from headsurgeon.hub.checkpoint import CheckpointError, IntegrityError, load_hybrid, read_manifest, save_hybrid
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.errors import ProgramError, ProgramValidationError
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet

PROGRAMS = {(0, 1): Program.parse("prev(1)"), (2, 3): Program.parse("first()")}
STORY = "Once upon a time, there was a little girl named Lily."


# ------------------------------------------------------------------------------------------ helpers


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _write_manifest(path: Path, manifest: dict) -> None:
    (path / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _relist(path: Path, manifest: dict, rel: str, data: bytes) -> None:
    """List ``rel`` in the manifest with the true sha256 and size of ``data`` (what an attacker would do)."""
    manifest["files"][rel] = {"sha256": _sha(data), "size": len(data)}


def _python_hash(source: str) -> str:
    """The program hash Program.python would give this source (computed without validating it)."""
    from headsurgeon.synth.backends import normalize_source

    return _sha(("python:" + normalize_source(source)).encode())


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail the test (instead of hanging the suite) if the block runs longer than ``seconds``."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: the load hangs")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base_ck(stories, tmp_path_factory) -> Path:
    """A stories260K checkpoint with two DSL heads that references its base."""
    hybrid = replace_heads(stories, PROGRAMS)
    hybrid.restore()
    return save_hybrid(hybrid, tmp_path_factory.mktemp("hostile") / "ck")


@pytest.fixture(scope="module")
def embedded_ck(tmp_path_factory) -> Path:
    """A checkpoint with embedded weights (one weight of a private stories260K nudged)."""
    from headsurgeon.surgery.models.loading import load_model

    from conftest import STORIES, need

    need(STORIES / "stories260K.bin")
    handle = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")
    with torch.no_grad():
        next(handle.hf_model.parameters()).add_(0.01)
    hybrid = replace_heads(handle, {(1, 2): Program.parse("prev(1)")})
    hybrid.restore()
    return save_hybrid(hybrid, tmp_path_factory.mktemp("hostile") / "emb")


@pytest.fixture()
def copy(tmp_path):
    def make(src: Path, name: str = "") -> Path:
        dst = tmp_path / "copy" / (name or src.name)
        shutil.copytree(src, dst, symlinks=True)
        return dst
    return make


@pytest.fixture()
def no_python(monkeypatch):
    """Record (and neutralize) every way a Python program could be validated or run."""
    import headsurgeon.synth.sandbox as sandbox

    calls: list[str] = []
    monkeypatch.setattr(sandbox, "validate_source", lambda *a, **k: calls.append("validate_source"))
    monkeypatch.setattr(sandbox, "get_pool", lambda *a, **k: calls.append("get_pool") or (_ for _ in ()).throw(
        AssertionError("the sandbox pool was asked for while loading")))
    return calls


def _l0h1(path: Path) -> tuple[dict, str]:
    m = _manifest(path)
    return m, m["heads"]["L0H1"]["program"]


# ------------------------------------------------------------------------------------------ finding 2


ESCAPE = """def f(seq):
    b = np.random.rand.func_globals["_" * 2 + "builtins" + "_" * 2]
    b["open"]({marker!r}, "w").write("ran")
    return np.ones((seq.n, seq.n))
"""


@pytest.mark.parametrize("trust", [False, True])
def test_python_inside_dsl_json_is_refused_and_never_runs(base_ck, copy, tmp_path, no_python, stories, trust):
    path = copy(base_ck)
    marker = tmp_path / "pwned"
    source = ESCAPE.format(marker=str(marker))
    m, rel = _l0h1(path)
    data = json.dumps({"python": source}).encode()
    (path / rel).write_bytes(data)
    _relist(path, m, rel, data)
    m["heads"]["L0H1"]["hash"] = _python_hash(source)  # kind stays "dsl"
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=rf"{rel} \(head L0H1\).*DSL.*Python") as err:
        hybrid = load_hybrid(path, trust_programs=trust)
        try:  # a vulnerable build got this far: the first forward pass runs the program
            hybrid(torch.tensor([stories.tokenizer(STORY).input_ids]))
        finally:
            hybrid.restore()
    assert "trust" not in type(err.value).__name__.lower()
    assert not marker.exists()
    assert no_python == []  # never even validated as Python, let alone run


@pytest.mark.parametrize("kind,suffix,content,message", [
    ("dsl", ".py", json.dumps({"prev": 1}), r"declares a dsl program but its file .*\.py"),
    ("python", ".json", json.dumps({"python": "def f(seq):\n    return np.ones((seq.n, seq.n))\n"}),
     r"declares a python program but its file .*\.json"),
    ("python", ".py", json.dumps({"prev": 1}), r"is not a valid Python program"),
    ("dsl", ".json", "def f(seq):\n    return np.ones((seq.n, seq.n))\n", r"is not a valid DSL program"),
    ("dsl", "", json.dumps({"prev": 1}), r"declares a dsl program but its file"),
])
def test_kind_suffix_and_content_must_agree(base_ck, copy, kind, suffix, content, message):
    path = copy(base_ck)
    m, old = _l0h1(path)
    rel = f"programs/planted{suffix}"
    data = content.encode()
    (path / old).unlink()
    del m["files"][old]
    (path / rel).write_bytes(data)
    _relist(path, m, rel, data)
    m["heads"]["L0H1"].update({"program": rel, "kind": kind})
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=message) as err:
        load_hybrid(path, trust_programs=True).restore()
    assert "L0H1" in str(err.value) and rel in str(err.value)


def test_program_outside_programs_folder_is_refused(base_ck, copy):
    path = copy(base_ck)
    m, old = _l0h1(path)
    data = (path / old).read_bytes()
    (path / "elsewhere.json").write_bytes(data)
    _relist(path, m, "elsewhere.json", data)
    m["heads"]["L0H1"]["program"] = "elsewhere.json"
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=r"head L0H1.*elsewhere\.json.*programs/"):
        load_hybrid(path).restore()


def test_dsl_json_path_cannot_return_python(no_python):
    source = "def f(seq):\n    return np.ones((seq.n, seq.n))\n"
    for doc in ({"python": source}, json.dumps({"python": source}), json.dumps({"python": source}).encode()):
        with pytest.raises(ProgramValidationError, match="DSL.*Python"):
            Program.from_dsl_json(doc)
        with pytest.raises(ProgramValidationError, match="DSL.*Python"):
            Program.from_json(doc, kind="dsl")
    assert no_python == []
    assert Program.from_dsl_json({"dsl": "prev(1)"}) == Program.from_dsl_json('{"prev": 1}') == PROGRAMS[(0, 1)]
    with pytest.raises(ProgramValidationError, match="Python program"):
        Program.from_json({"prev": 1}, kind="python")
    # the record form (programs.json, agent journals) still holds Python: AST validation only
    record = Program.from_json({"python": source})
    assert record.kind == "python" and no_python == ["validate_source"]


def test_programs_json_kind_must_match_content(tmp_path):
    ps = ProgramSet()
    ps.add((0, 1), PROGRAMS[(0, 1)], source="test")
    obj = ps.to_json()
    assert ProgramSet.from_json(json.loads(json.dumps(obj)))[(0, 1)] == PROGRAMS[(0, 1)]
    obj["programs"][0]["program"] = {"python": "def f(seq):\n    return np.ones((seq.n, seq.n))\n"}
    with pytest.raises(ProgramError, match="L0H1.*DSL.*Python"):
        ProgramSet.from_json(obj)
    obj["programs"][0]["kind"] = "x" * 100_000
    with pytest.raises(ProgramError, match="L0H1") as err:
        ProgramSet.from_json(obj)
    assert len(str(err.value)) < 1000


def test_programset_python_programs_need_trust():
    ps = ProgramSet()
    ps.add((0, 1), PROGRAMS[(0, 1)])
    ps.require_trusted()  # DSL only: nothing to trust
    py = Program.python("def f(seq):\n    return np.ones((seq.n, seq.n))\n")
    ps.add((1, 1), py)
    ps.require_trusted()  # built in this process: your own code (headsurgeon/synth/trust.py)
    ps = ProgramSet.from_json(ps.to_json())  # a document from someone else
    with pytest.raises(ProgramError, match=rf"L1H1 replacement \(python, hash {py.hash}\).*trust"):
        ps.require_trusted()
    ps.require_trusted(True)
    ps.require_trusted({py.hash})


def test_replace_heads_with_a_dict_is_dsl_json_only(no_python):
    from headsurgeon.surgery.swap.providers import as_provider

    with pytest.raises(ProgramValidationError, match="Program.python"):
        as_provider({"python": "def f(seq):\n    return np.ones((seq.n, seq.n))\n"})
    assert no_python == []
    assert as_provider({"prev": 1}).program == PROGRAMS[(0, 1)]


# ------------------------------------------------------------------------------------------ finding 5


def test_symlinked_program_file_is_refused(base_ck, copy, tmp_path):
    path = copy(base_ck)
    _, rel = _l0h1(path)
    outside = tmp_path / "outside.json"
    shutil.copy(path / rel, outside)  # identical bytes: the hash check alone would pass
    (path / rel).unlink()
    (path / rel).symlink_to(outside)
    with pytest.raises(IntegrityError, match=rf"{rel} in .* is a symbolic link"):
        load_hybrid(path).restore()


def test_symlinked_programs_folder_is_refused(base_ck, copy, tmp_path):
    path = copy(base_ck)
    shutil.move(path / "programs", tmp_path / "elsewhere")
    (path / "programs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(IntegrityError, match=r"programs in .* is a symbolic link"):
        load_hybrid(path).restore()


def test_symlinked_manifest_is_refused(base_ck, copy, tmp_path):
    path = copy(base_ck)
    shutil.move(path / "manifest.json", tmp_path / "manifest.json")
    (path / "manifest.json").symlink_to(tmp_path / "manifest.json")
    with pytest.raises(IntegrityError, match=r"manifest\.json in .* is a symbolic link"):
        load_hybrid(path).restore()


def test_symlink_to_proc_pagemap_without_size_fails_fast(base_ck, copy):
    pagemap = Path("/proc/self/pagemap")
    if not pagemap.exists():
        pytest.skip("no /proc/self/pagemap here")
    path = copy(base_ck)
    m, rel = _l0h1(path)
    (path / rel).unlink()
    (path / rel).symlink_to(pagemap)
    del m["files"][rel]["size"]
    _write_manifest(path, m)
    start = time.monotonic()
    with _deadline(30), pytest.raises(IntegrityError, match=rel):
        load_hybrid(path).restore()
    assert time.monotonic() - start < 10


def test_size_is_required(base_ck, copy):
    path = copy(base_ck)
    m, rel = _l0h1(path)
    del m["files"][rel]["size"]
    _write_manifest(path, m)
    with pytest.raises(IntegrityError, match=rf"no size for {rel}.*save the checkpoint again"):
        load_hybrid(path).restore()
    for bad in (True, -1, "12", 1.5):
        m["files"][rel]["size"] = bad
        _write_manifest(path, m)
        with pytest.raises(IntegrityError, match=rf"size for {rel}"):
            load_hybrid(path).restore()


@pytest.mark.parametrize("rel", ["../outside.json", "programs/../../outside.json", "/tmp/outside.json",
                                 "programs/./x.json", "programs//x.json", "C:\\x.json"])
def test_paths_leaving_the_checkpoint_are_refused(base_ck, copy, tmp_path, rel):
    path = copy(base_ck)
    m, old = _l0h1(path)
    data = (path / old).read_bytes()
    (tmp_path / "outside.json").write_bytes(data)
    _relist(path, m, rel, data)
    m["heads"]["L0H1"]["program"] = rel
    _write_manifest(path, m)
    with pytest.raises(IntegrityError, match="unsafe path"):
        load_hybrid(path).restore()


def test_fifo_is_refused_without_blocking(base_ck, copy):
    path = copy(base_ck)
    _, rel = _l0h1(path)
    (path / rel).unlink()
    os.mkfifo(path / rel)
    with _deadline(30), pytest.raises(IntegrityError, match=rf"{rel} in .* is not a regular file"):
        load_hybrid(path).restore()
    # an unlisted FIFO (never opened) is refused by name too
    path2 = copy(base_ck, "two")
    os.mkfifo(path2 / "pipe")
    with _deadline(30), pytest.raises(IntegrityError, match=r"pipe in .* (is not a regular file|is not listed)"):
        load_hybrid(path2).restore()


def test_oversize_file_is_refused_before_reading(base_ck, copy, monkeypatch):
    path = copy(base_ck)
    _, rel = _l0h1(path)
    with open(path / rel, "ab") as f:
        f.truncate(1 << 34)  # a 16 GiB sparse file where the manifest says a few bytes
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    start = time.monotonic()
    with _deadline(30), pytest.raises(IntegrityError, match=rf"{rel} in .* is longer than saved"):
        load_hybrid(path).restore()
    assert time.monotonic() - start < 10
    assert sum(reads) < 1 << 26


def test_huge_program_file_is_refused_even_when_listed(base_ck, copy):
    path = copy(base_ck)
    m, rel = _l0h1(path)
    with open(path / rel, "ab") as f:
        f.truncate(1 << 30)
    m["files"][rel] = {"sha256": "0" * 64, "size": 1 << 30}
    _write_manifest(path, m)
    with _deadline(30), pytest.raises(CheckpointError, match=rf"{rel}.*too large"):
        load_hybrid(path).restore()


def test_symlink_anywhere_in_the_folder_is_refused(base_ck, copy, tmp_path):
    path = copy(base_ck)
    (path / "extra").symlink_to("/")  # unlisted: never followed, still refused
    with pytest.raises(IntegrityError, match=r"extra in .* is a symbolic link"):
        load_hybrid(path).restore()


# ------------------------------------------------------------------------------------------ finding 6


def _hybrid(stories, programs):
    hybrid = replace_heads(stories, programs)
    hybrid.restore()
    return hybrid


def test_resave_keeps_user_files(stories, tmp_path):
    target = tmp_path / "ck"
    save_hybrid(_hybrid(stories, {(0, 0): Program.parse("prev(1)")}), target)
    (target / "results.csv").write_text("head,iou\nL0H0,0.9\n")
    (target / "notes").mkdir()
    (target / "notes" / "todo.md").write_text("- try prev(2)\n")
    (target / "notes" / "empty").mkdir()
    (target / "programs" / "mine.txt").write_text("my own notes on the programs\n")
    (target / ".git").mkdir()
    (target / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    save_hybrid(_hybrid(stories, {(1, 1): Program.parse("first()")}), target)
    assert (target / "results.csv").read_text() == "head,iou\nL0H0,0.9\n"
    assert (target / "notes" / "todo.md").read_text() == "- try prev(2)\n"
    assert (target / "notes" / "empty").is_dir()
    assert (target / "programs" / "mine.txt").read_text() == "my own notes on the programs\n"
    assert (target / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    m = read_manifest(target)
    assert set(m["heads"]) == {"L1H1"}
    # the previous program file is gone (it was ours), the new one is there
    assert sorted(p.name for p in (target / "programs").iterdir()) == sorted(
        ["mine.txt", Path(m["heads"]["L1H1"]["program"]).name])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    # user files are not part of the checkpoint: load names them
    with pytest.raises(IntegrityError, match="is not listed in the manifest"):
        load_hybrid(target)
    for extra in ("results.csv", "notes", "programs/mine.txt"):
        p = target / extra
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    load_hybrid(target).restore()


def test_user_file_in_the_way_needs_overwrite(stories, tmp_path):
    target = tmp_path / "ck"
    first = save_hybrid(_hybrid(stories, {(0, 0): Program.parse("prev(1)")}), target)
    new = Program.parse("first()")
    clash = first / "programs" / f"{new.hash[:16]}.json"
    clash.write_text("mine")
    with pytest.raises(CheckpointError, match=r"programs/.*\.json.*overwrite=True"):
        save_hybrid(_hybrid(stories, {(1, 1): new}), target)
    assert clash.read_text() == "mine"
    save_hybrid(_hybrid(stories, {(1, 1): new}), target, overwrite=True)
    load_hybrid(target).restore()


def test_foreign_folder_with_fake_manifest_is_refused(stories, tmp_path):
    target = tmp_path / "thesis"
    target.mkdir()
    (target / "thesis.tex").write_text("\\documentclass{article}\n")
    (target / "manifest.json").write_text(json.dumps({
        "format": ck.FORMAT, "format_version": 1, "heads": {}, "weights": {}, "base": {},
        "files": {"thesis.tex": {"sha256": "0" * 64, "size": 3}}}))
    before = _tree(target)
    hybrid = _hybrid(stories, {(0, 0): Program.parse("prev(1)")})
    with pytest.raises(CheckpointError, match=rf"{target}.*not a headsurgeon checkpoint; refusing.*overwrite=True"):
        save_hybrid(hybrid, target)
    assert _tree(target) == before
    save_hybrid(hybrid, target, overwrite=True)
    assert (target / "thesis.tex").read_text() == "\\documentclass{article}\n"  # kept, never ours
    assert set(read_manifest(target)["heads"]) == {"L0H0"}


def test_plain_foreign_folder_with_overwrite_keeps_its_files(stories, tmp_path):
    target = tmp_path / "photos"
    target.mkdir()
    (target / "cat.jpg").write_bytes(b"\xff\xd8 not ours")
    hybrid = _hybrid(stories, {(0, 0): Program.parse("prev(1)")})
    with pytest.raises(CheckpointError, match="overwrite=True"):
        save_hybrid(hybrid, target)
    save_hybrid(hybrid, target, overwrite=True)
    assert (target / "cat.jpg").read_bytes() == b"\xff\xd8 not ours"


def test_tampered_previous_checkpoint_needs_overwrite(stories, tmp_path):
    target = tmp_path / "ck"
    save_hybrid(_hybrid(stories, {(0, 0): Program.parse("prev(1)")}), target)
    (target / "README.md").write_text("my edited card\n")
    hybrid = _hybrid(stories, {(1, 1): Program.parse("first()")})
    with pytest.raises(CheckpointError, match=r"README\.md.*overwrite=True"):
        save_hybrid(hybrid, target)
    assert (target / "README.md").read_text() == "my edited card\n"
    save_hybrid(hybrid, target, overwrite=True)
    load_hybrid(target).restore()


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_stale_old_copies_are_cleaned_up(stories, tmp_path):
    target = tmp_path / "ck"
    hybrid = _hybrid(stories, {(0, 1): Program.parse("prev(1)")})
    save_hybrid(hybrid, target)
    (target / "results.csv").write_text("mine\n")
    # a save killed after the new folder was in place, before the old one was deleted
    stale = tmp_path / f".ck.old-{_dead_pid()}-deadbeef"
    shutil.copytree(target, stale)
    os.unlink(stale / "results.csv")
    os.link(target / "results.csv", stale / "results.csv")
    save_hybrid(hybrid, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert (target / "results.csv").read_text() == "mine\n"


def test_stale_old_copy_is_restored_when_the_checkpoint_is_gone(stories, tmp_path):
    target = tmp_path / "ck"
    hybrid = _hybrid(stories, {(0, 1): Program.parse("prev(1)")})
    save_hybrid(hybrid, target)
    (target / "results.csv").write_text("mine\n")
    stale = tmp_path / f".ck.old-{_dead_pid()}-deadbeef"
    os.rename(target, stale)  # killed between the two renames of the swap
    save_hybrid(_hybrid(stories, {(1, 1): Program.parse("first()")}), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert (target / "results.csv").read_text() == "mine\n"
    assert set(read_manifest(target)["heads"]) == {"L1H1"}


def test_stale_old_copy_with_unique_user_files_is_kept(stories, tmp_path):
    target = tmp_path / "ck"
    hybrid = _hybrid(stories, {(0, 1): Program.parse("prev(1)")})
    save_hybrid(hybrid, target)
    stale = tmp_path / f".ck.old-{_dead_pid()}-deadbeef"
    shutil.copytree(target, stale)
    (stale / "only-here.csv").write_text("not anywhere else\n")
    with pytest.warns(UserWarning, match=rf"{stale.name}.*only-here\.csv"):
        save_hybrid(hybrid, target)
    assert (stale / "only-here.csv").read_text() == "not anywhere else\n"


def test_symlinked_target_is_refused(stories, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CheckpointError, match="symbolic link"):
        save_hybrid(_hybrid(stories, {(0, 1): Program.parse("prev(1)")}), tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and list(real.iterdir()) == []


# ------------------------------------------------------------------------------------------ finding 8


@pytest.mark.parametrize("damage", ["truncate", "garbage", "huge_header"])
def test_bad_safetensors_names_the_file(embedded_ck, copy, damage):
    path = copy(embedded_ck)
    m = _manifest(path)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garbage":
        data = b"\x00" * 64
    else:
        data = (1 << 60).to_bytes(8, "little") + data[8:]
    weights.write_bytes(data)
    _relist(path, m, "model.safetensors", data)  # consistent manifest: only the format check can tell
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=r"model\.safetensors") as err:
        load_hybrid(path).restore()
    assert "SafetensorError" not in type(err.value).__name__


def test_llama2c_base_without_path(base_ck, copy):
    path = copy(base_ck)
    m = _manifest(path)
    del m["base"]["path"]
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=r"base.*llama2c.*no 'path'"):
        load_hybrid(path).restore()
    m["base"]["path"] = ["not", "a", "path"]
    _write_manifest(path, m)
    with pytest.raises(CheckpointError, match=r"'path'"):
        load_hybrid(path).restore()


def test_huge_values_are_not_echoed(base_ck, copy):
    path = copy(base_ck)
    m = _manifest(path)
    m["heads"]["L0H1"]["kind"] = "k" * 1_000_000
    _write_manifest(path, m)
    with pytest.raises(CheckpointError) as err:
        load_hybrid(path).restore()
    assert len(str(err.value)) < 2000
    path2 = copy(base_ck, "two")
    m = _manifest(path2)
    m["base"]["kind"] = "b" * 1_000_000
    _write_manifest(path2, m)
    with pytest.raises(CheckpointError) as err:
        load_hybrid(path2).restore()
    assert len(str(err.value)) < 2000


# ------------------------------------------------------------------------------------------ Hub cache layout


def _hub_layout(src: Path, tmp_path: Path) -> Path:
    """``src`` laid out like a huggingface_hub cache snapshot: every file a link into the repo's blobs/."""
    repo = tmp_path / "models--acme--ck"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    for p in sorted(src.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            (blobs / _sha(data)).write_bytes(data)
            link = snap / p.relative_to(src)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blobs / _sha(data), link.parent))
    return snap


def test_hub_cache_links_are_followed_only_into_blobs(base_ck, tmp_path):
    snap = _hub_layout(base_ck, tmp_path)
    from conftest import STORIES

    load_hybrid(snap, base_model=STORIES / "stories260K.bin").restore()  # moved: the base is named where it is
    _, rel = _l0h1(snap)
    outside = tmp_path / "outside.json"
    shutil.copy(snap / rel, outside)
    (snap / rel).unlink()
    (snap / rel).symlink_to(outside)
    with pytest.raises(IntegrityError, match=rf"{rel} in .* is a symbolic link"):
        load_hybrid(snap).restore()
    # a blob that is itself a link out of blobs/ (here to /proc/self/pagemap) is refused too, without reading it
    evil = snap.parent.parent / "blobs" / "evil"
    evil.symlink_to("/proc/self/pagemap")
    (snap / rel).unlink()
    (snap / rel).symlink_to(os.path.relpath(evil, (snap / rel).parent))
    with _deadline(30), pytest.raises(IntegrityError, match=rf"{rel} in .* is a symbolic link"):
        load_hybrid(snap).restore()


@pytest.mark.parametrize("named", ["/proc/self/pagemap", "../../../../../../proc/self/pagemap", "/dev/zero"])
def test_a_base_path_into_the_kernel_is_never_followed(base_ck, copy, tmp_path, monkeypatch, named):
    from headsurgeon.hub.checkpoint.errors import BaseModelError

    path = copy(base_ck)
    m = _manifest(path)
    m["base"]["path"] = named  # reduced to its name ("pagemap", "zero"), looked up where bases are looked up
    _write_manifest(path, m)
    monkeypatch.setenv("HEADSURGEON_CACHE", str(tmp_path / "empty-cache"))
    with _deadline(30), pytest.raises(BaseModelError, match=r"was found neither in the checkpoint's folder"):
        load_hybrid(path)
    monkeypatch.setenv("HEADSURGEON_BASE_PATH", str(Path(named).parent if named.startswith("/") else "/proc/self"))
    with _deadline(30), pytest.raises(BaseModelError, match=r"is under /(proc|dev), not a file on disk"):
        load_hybrid(path)


@pytest.mark.parametrize("kind", ["fifo", "empty", "folder"])
def test_a_base_that_is_not_a_regular_file_is_named_for_what_it_is(base_ck, copy, tmp_path, monkeypatch, kind):
    from headsurgeon.hub.checkpoint.errors import BaseModelError

    path = copy(base_ck)
    name = _manifest(path)["base"]["path"]
    planted = tmp_path / "bases" / name
    planted.parent.mkdir()
    {"fifo": lambda: os.mkfifo(planted), "empty": planted.touch, "folder": planted.mkdir}[kind]()
    monkeypatch.setenv("HEADSURGEON_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HEADSURGEON_BASE_PATH", str(planted.parent))
    want = {"fifo": "not a regular file \\(a FIFO", "empty": "is empty", "folder": "not a regular file \\(a folder"}
    with _deadline(30), pytest.raises(BaseModelError, match=want[kind]):
        load_hybrid(path)


def test_named_files_are_regular_non_empty_and_outside_the_kernel(tmp_path):
    from headsurgeon.core.fileio import UnsafeFileError, named_file, sha256_file

    good = tmp_path / "model.bin"
    good.write_bytes(b"weights")
    assert named_file(good, "a model") == good.resolve()
    link = tmp_path / "link.bin"
    link.symlink_to(good)
    assert named_file(link, "a model") == good.resolve()  # a link is judged by what it resolves to
    for bad, why in (("/proc/self/pagemap", "under /proc"), ("/sys/kernel/notes", "under /sys"),
                     ("/dev/zero", "under /dev"), (str(tmp_path), "a folder")):
        with pytest.raises(UnsafeFileError, match=why):
            named_file(bad, "a model")
    with _deadline(10):  # hashed no further than its size, which procfs reports as 0
        assert sha256_file("/proc/self/pagemap") == hashlib.sha256(b"").hexdigest()
