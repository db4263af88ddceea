"""GGUF files and a GGUF conversion cache from others (headsurgeon/surgery/models/gguf.py, gguf_header.py, gguf_cache.py; SECURITY.md).

A cache entry changed by another writer of the cache folder (its entry.json rewritten to match) or holding files
it does not list is rebuilt with a warning; the cache folders are private; a build killed with SIGKILL leaves a
folder that the next load removes, saying how much it freed; a damaged GGUF file is reported as damaged, at its
byte offset, with advice to compare its size and sha256 with the publisher's, before transformers parses it.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")

from safetensors.torch import load_file, save_file  # noqa: E402

from headsurgeon.core.fileio import sha256_file  # noqa: E402
from headsurgeon.surgery.models import gguf as hs_gguf  # noqa: E402
from headsurgeon.surgery.models.gguf_cache import ConversionCacheWarning, building, sweep_dead_builds  # noqa: E402
from headsurgeon.surgery.models.gguf_header import GGUFFileError, read_gguf_header  # noqa: E402
from headsurgeon.surgery.models.loading import ModelLoadError, load_model  # noqa: E402
from support.gguf_files import IDS, cache, fake_parts, same_state, state, tiny, write_tiny_gguf  # noqa: E402,F401 - fixtures

ADVICE = r"Compare its size \(\d+ bytes\) and sha256 \([0-9a-f]{64}\) with the publisher's"


def built(tiny: Path, cache: Path) -> tuple[Path, str]:
    """Convert ``tiny`` into the cache; returns its entry folder and the file's sha256."""
    _, _, sha = hs_gguf.read_gguf(tiny)
    return cache / "gguf" / sha, sha


def rewrite_entry(folder: Path, change) -> None:
    """Change the entry's record as someone who can write the folder would: sizes and sha256s made to match."""
    entry = json.loads((folder / "entry.json").read_text())
    change(entry)
    entry["files"] = {f.name: {"size": f.stat().st_size, "sha256": sha256_file(f)}
                      for f in sorted(folder.iterdir()) if f.name != "entry.json"}
    (folder / "entry.json").write_text(json.dumps(entry))


# --- the conversion cache does not vouch for itself ---------------------------------------------------------


def test_replaced_weights_with_a_rewritten_entry_json_are_rebuilt(tiny, cache):
    fresh, _, _ = hs_gguf.read_gguf(tiny, cache=False)
    folder, _ = built(tiny, cache)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    name = next(k for k in tensors if "q_proj" in k)
    tensors[name] = tensors[name] * 3.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    rewrite_entry(folder, lambda entry: None)
    with pytest.warns(ConversionCacheWarning, match="its digest does not verify under your key.*rebuilding"):
        h = load_model(str(tiny))
    with torch.no_grad():
        assert torch.equal(h(IDS), fresh(IDS).logits)
    assert same_state(state(hs_gguf.read_gguf(tiny)[0]), state(fresh))  # the rebuilt entry is the file's


def test_a_digest_recomputed_with_another_key_is_refused(tiny, cache):
    """The digest is keyed: a writer who knows the format cannot make a valid one without the user's key."""
    from headsurgeon.surgery.models.gguf_cache import sign_entry

    folder, _ = built(tiny, cache)
    entry = json.loads((folder / "entry.json").read_text())
    entry.pop("hmac_sha256")
    entry["source"] = "/elsewhere/tiny.gguf"
    (folder / "entry.json").write_text(json.dumps(sign_entry(os.urandom(32), entry)))
    with pytest.warns(ConversionCacheWarning, match="digest does not verify"):
        hs_gguf.read_gguf(tiny)
    assert json.loads((folder / "entry.json").read_text())["source"] == str(tiny)


def test_an_entry_holding_a_file_it_does_not_list_is_refused(tiny, cache):
    """A planted added_tokens.json changed the tokenizer: now the entry is rebuilt and the tokenizer is the file's."""
    _, fresh_tok, _ = hs_gguf.read_gguf(tiny, cache=False)
    folder, _ = built(tiny, cache)
    (folder / "added_tokens.json").write_text(json.dumps({"the cat": 5}))
    with pytest.warns(ConversionCacheWarning, match=r"holds files it does not list \(added_tokens.json\)"):
        _, tok, _ = hs_gguf.read_gguf(tiny)
    text = "the cat sat"
    assert tok(text)["input_ids"] == fresh_tok(text)["input_ids"]
    assert not (folder / "added_tokens.json").exists()


def test_a_listed_file_swapped_for_a_symlink_is_refused(tiny, cache, tmp_path):
    folder, _ = built(tiny, cache)
    config = folder / "config.json"
    outside = tmp_path / "config.json"
    outside.write_bytes(config.read_bytes())
    config.unlink()
    config.symlink_to(outside)
    with pytest.warns(ConversionCacheWarning, match="config.json is not a regular file"):
        hs_gguf.read_gguf(tiny)
    assert not config.is_symlink()


def test_an_entry_folder_swapped_for_a_symlink_is_refused(tiny, cache, tmp_path):
    folder, _ = built(tiny, cache)
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(ConversionCacheWarning, match="cannot be used: it is a symbolic link"):
        hs_gguf.read_gguf(tiny)
    assert folder.is_dir() and not folder.is_symlink() and hs_gguf._entry_valid(folder, hs_gguf.sha256_file(tiny))


def test_the_cache_folders_are_created_private(tiny, cache):
    folder, _ = built(tiny, cache)
    for d in (cache, cache / "gguf"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    key = cache / "gguf" / ".cache-key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32


@pytest.mark.parametrize("which", ["root", "gguf"])
def test_a_cache_folder_other_users_can_write_is_warned_about(tiny, cache, which):
    built(tiny, cache)
    shared = cache if which == "root" else cache / "gguf"
    shared.chmod(0o777)
    with pytest.warns(ConversionCacheWarning, match=rf"{shared} can be written by other users.*chmod 700"):
        hs_gguf.read_gguf(tiny)


def test_a_key_file_others_can_read_is_not_used(tiny, cache):
    folder, _ = built(tiny, cache)
    (cache / "gguf" / ".cache-key").chmod(0o644)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, _, _ = hs_gguf.read_gguf(tiny)
    said = [str(w.message) for w in caught if w.category is ConversionCacheWarning]
    assert any("cache key" in m and "cannot be used: it is not a private" in m for m in said)
    assert any("digest does not verify" in m for m in said)  # the entry is rebuilt under a key for this process
    fresh, _, _ = hs_gguf.read_gguf(tiny, cache=False)
    assert same_state(state(model), state(fresh))


# --- a killed first load leaves nothing behind for good -----------------------------------------------------


WRITER = """
import os, sys, time
from pathlib import Path
from headsurgeon.surgery.models.gguf_cache import building
with building(Path(sys.argv[1]), "ab" * 32) as tmp:
    (tmp / "model.safetensors").write_bytes(b"\\0" * 1048576)
    print(tmp, flush=True)
    time.sleep(600)
"""


def test_a_build_killed_with_sigkill_is_removed_by_the_next_load_which_says_what_it_freed(tiny, cache):
    gguf_dir = cache / "gguf"
    gguf_dir.mkdir(parents=True, mode=0o700)
    cache.chmod(0o700)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(gguf_dir)], stdout=subprocess.PIPE, text=True)
    try:
        leftover = Path(proc.stdout.readline().strip())
        assert leftover.name.startswith(".build-") and leftover.is_dir()
        assert sweep_dead_builds(gguf_dir) == (0, 0)  # its writer is alive and holds the lock
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert leftover.is_dir()
    with pytest.warns(ConversionCacheWarning, match=r"removed 1 unfinished GGUF cache build left in .* by writers that died; 1048576 bytes .* freed"):
        hs_gguf.read_gguf(tiny)
    assert not leftover.exists()
    assert [p.name for p in gguf_dir.iterdir() if p.name.startswith(".build-")] == []


def test_a_build_in_progress_in_this_process_is_not_removed(cache):
    gguf_dir = cache / "gguf"
    gguf_dir.mkdir(parents=True)
    with building(gguf_dir, "cd" * 32) as tmp:
        (tmp / "x").write_bytes(b"1" * 100)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sweep_dead_builds(gguf_dir) == (0, 0)
        assert tmp.is_dir()
    assert not tmp.exists()


def test_leftovers_of_dead_pids_and_of_earlier_versions_are_removed(cache):
    gguf_dir = cache / "gguf"
    gguf_dir.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)
    dead = gguf_dir / f".build-{'ef' * 8}-{socket.gethostname()}-{dead_pid}-0a0b0c0d"
    old = gguf_dir / f".{'01' * 8}.k3j_x9zq"  # an earlier version's mkdtemp folder, no lock and no pid
    recent = gguf_dir / f".{'02' * 8}.a8f_2kq1"
    for d in (dead, old, recent):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"\0" * 1000)
    day_old = time.time() - 2 * 86400
    os.utime(old, (day_old, day_old))
    with pytest.warns(ConversionCacheWarning, match="removed 2 unfinished GGUF cache builds .* 2000 bytes"):
        assert sweep_dead_builds(gguf_dir) == (2, 2000)
    assert not dead.exists() and not old.exists() and recent.exists()  # a recent one may still be written


def test_an_assembly_of_parts_killed_midway_is_removed_by_the_next_one(tmp_path, cache, monkeypatch):
    """Gemma 3 is assembled from installed parts into gguf-files/ (headsurgeon/surgery/models/gguf.py assemble_parts), the same way."""
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    parts = fake_parts(tmp_path / "site", [b"GGUF" + bytes(300), b"rest" * 100])
    files = cache / "gguf-files"
    files.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = files / f".build-{parts.sha256[:16]}-{socket.gethostname()}-{int(done.stdout)}-01020304"
    dead.mkdir()
    (dead / parts.name).write_bytes(b"GGUF" + bytes(96))
    with pytest.warns(ConversionCacheWarning, match="removed 1 unfinished GGUF cache build .* 100 bytes"):
        out = hs_gguf.assemble_parts(parts)
    assert out.read_bytes() == b"GGUF" + bytes(300) + b"rest" * 100 and not dead.exists()
    assert [p.name for p in files.iterdir() if p.name.startswith(".")] == []


# --- a damaged GGUF file is called damaged -----------------------------------------------------------------


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv_str(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(value)


def tensor_info(name: str, dims, ggml_type: int = 0, offset: int = 0) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def raw_gguf(kvs=None, tensors=None, n_tensors=None, n_kv=None, version=3, data=b"\0" * 64) -> bytes:
    """A GGUF built byte by byte (one F32 tensor of 16 values by default), so any field can be made hostile."""
    kvs = [kv_str("general.architecture", "llama")] if kvs is None else kvs
    tensors = [tensor_info("w", [16])] if tensors is None else tensors
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


HUGE = 1 << 63
CASES = {
    "random bytes": (random.Random(0).randbytes(5000), r"not a GGUF file: no magic \(it starts with"),
    "empty": (b"", r"not a GGUF file: no magic \(the file is empty\)"),
    "truncated header": (raw_gguf()[:12], r"truncated at byte 12 of 16: tensor count at byte 8"),
    "truncated key/values": (raw_gguf()[:66], r"truncated at byte 66 of at least 69: the value of 'general."
                             r"architecture' \(its length at byte 56\) needs 5 bytes from byte 64, 2 are left"),
    "truncated key string": (raw_gguf()[:40], r"truncated at byte 40 of at least 52: a metadata key \(its length "
                                              r"at byte 24\) needs 20 bytes from byte 32"),
    "truncated tensor infos": (raw_gguf()[:85], r"truncated at byte 85 of 90: the dimensions of tensor 'w'"),
    "truncated tensor count": (raw_gguf()[:24], r"truncated at byte 24 of at least \d+: tensor count 1 at byte 8"),
    "truncated data": (raw_gguf()[:-10], r"truncated at byte 182 of 192: the data of 1 of its 1 tensors lies past "
                                         r"the end of the file \(the last, 'w', ends at byte 192\)"),
    "tensor count 2^63": (raw_gguf(n_tensors=HUGE), r"tensor count 2\^63 at byte 8 exceeds what the \d+ bytes left"),
    "key/value count 2^63": (raw_gguf(n_kv=HUGE), r"key/value count 2\^63 at byte 16 exceeds"),
    "key too long": (raw_gguf(kvs=[struct.pack("<Q", 1 << 20) + b"x" * 100]), r"more than the limit of 65535"),
    "string length 2^63": (raw_gguf(kvs=[struct.pack("<Q", HUGE) + b"general.architecture"]),
                           r"a metadata key at byte 24 claims a length of 2\^63 bytes"),
    "array length 2^63": (raw_gguf(kvs=[s("tokens") + struct.pack("<IIQ", 9, 8, HUGE)]),
                          r"the array length of 'tokens' 2\^63 .* exceeds"),
    "dims of 2^40": (raw_gguf(tensors=[tensor_info("w", [1 << 40, 1 << 40])]),
                     r"tensor 'w' at byte \d+ has dimensions 2\^40x2\^40, more elements than"),
    "99 dimensions": (raw_gguf(tensors=[tensor_info("w", [1] * 99)]),
                      r"tensor 'w' at byte \d+ has 99 dimensions; GGUF tensors have 1 to 4"),
    "type 255": (raw_gguf(tensors=[tensor_info("w", [16], ggml_type=255)]), r"tensor 'w' .* has type 255, which ggml"),
    "value type 99": (raw_gguf(kvs=[s("x") + struct.pack("<I", 99)]), r"key 'x' has value type 99"),
    "data offset 2^62": (raw_gguf(tensors=[tensor_info("w", [16], offset=1 << 62)]),
                         r"tensor 'w' \(its info at byte 69\) has data offset 2\^62 and 64 bytes, .* past the end"),
    "misaligned offset": (raw_gguf(tensors=[tensor_info("w", [16], offset=3)]), r"not a multiple of the alignment 32"),
    "duplicate architecture": (raw_gguf(kvs=[kv_str("general.architecture", "llama"),
                                             kv_str("general.architecture", "gemma3")]),
                               r"the key 'general.architecture' at byte \d+ appears twice"),
    "duplicate tensor": (raw_gguf(tensors=[tensor_info("w", [8]), tensor_info("w", [8], offset=32)]),
                         r"the tensor 'w' at byte \d+ appears twice"),
    "version 7": (raw_gguf(version=7), r"GGUF version 7 at byte 4"),
}


def test_the_hand_built_file_is_well_formed():
    """The cases above damage one field each of this file, which reads back whole."""
    import gguf

    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"hs-raw-{os.getpid()}.gguf"
    path.write_bytes(raw_gguf())
    try:
        header = read_gguf_header(path)
        assert header.architecture == "llama" and header.tensors[0].nbytes == 64
        assert gguf.GGUFReader(str(path)).tensors[0].data_offset == header.tensors[0].start
    finally:
        path.unlink()


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_gguf_is_reported_as_damaged_with_its_offset_and_advice(tmp_path, cache, case):
    raw, problem = CASES[case]
    path = tmp_path / "model.gguf"
    path.write_bytes(raw)
    with pytest.raises(GGUFFileError, match=problem) as info:
        load_model(str(path))
    message = str(info.value)
    assert isinstance(info.value, ModelLoadError) and message.startswith(str(path))
    assert "architecture" not in message.split(":", 2)[1] or case.startswith("duplicate")
    assert "cannot be read by transformers" not in message and "unreadable" not in message
    assert "convert the model to a Hugging Face folder" not in message
    assert message.endswith("with the publisher's, and download it again.")
    assert __import__("re").search(ADVICE, message)
    assert not (cache / "gguf").exists() or not any((cache / "gguf").glob("[0-9a-f]*"))


def test_a_real_file_cut_or_flipped_anywhere_in_its_header_is_a_gguf_file_error_or_reads(tiny, tmp_path):
    """No truncation or byte flip of a real file's header escapes as another exception (or hangs, or allocates)."""
    raw = tiny.read_bytes()
    end = read_gguf_header(tiny).data_start
    path = tmp_path / "x.gguf"
    rng = random.Random(1)
    for cut in sorted({*rng.sample(range(end), 60), 0, 3, 4, 8, 16, 24, end - 1}):
        path.write_bytes(raw[:cut])
        with pytest.raises(GGUFFileError, match="truncated|no magic"):
            read_gguf_header(path)
    for _ in range(150):
        damaged = bytearray(raw[:end + 4096])
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(end)] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        try:
            read_gguf_header(path)
        except GGUFFileError:
            pass


def test_an_unsupported_architecture_still_names_it_and_not_damage(tmp_path, cache):
    bad = write_tiny_gguf(tmp_path / "bad.gguf", arch="frobnicator")
    with pytest.raises(ModelLoadError, match=r"GGUF architecture 'frobnicator' cannot be read") as info:
        load_model(str(bad))
    assert not isinstance(info.value, GGUFFileError)
