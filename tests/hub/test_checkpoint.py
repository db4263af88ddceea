"""Hybrid checkpoints: bit-exact round trips (referenced and embedded weights) and every fault mode.

Round trips are checked against the live hybrid's own logits (torch.equal), and the hashes in the
manifest against hashlib run here on the files; faults must raise a clear, specific error and leave
whatever was on disk before untouched.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import headsurgeon
from headsurgeon.hub import checkpoint as ck
from headsurgeon.hub.checkpoint import load as ck_load
from headsurgeon.hub.checkpoint import save as ck_save
from headsurgeon.hub.checkpoint import (BaseModelError, CheckpointError, FormatVersionError, IntegrityError,
                                        NotACheckpointError, UntrustedProgramError, hf_state_dict, load_hybrid,
                                        read_manifest, save_hybrid)
from headsurgeon.surgery.models.handle import EmbeddedSource
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from support.tiny_gpt2 import STORY, make_tiny_gpt2

PROGRAMS = {(0, 1): Program.parse("prev(1)"), (2, 3): Program.parse("0.5*prev(1) + 0.5*first()"),
            (4, 7): Program.parse("uniform()")}
PY_SOURCE = "def f(seq):\n    w = np.arange(seq.n, dtype=float)\n    return np.ones((seq.n, seq.n)) * (1.0 + w[None, :])\n"


def _ids(handle, text: str = STORY) -> torch.Tensor:
    return torch.tensor([handle.tokenizer(text).input_ids])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Every file under root (hidden included) → sha256: a snapshot to prove nothing changed."""
    return {p.relative_to(root).as_posix(): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)


def _fine_tune(hybrid, ids, steps: int = 2) -> None:
    """A few real optimizer steps through the hybrid (program heads fixed), as healing fine-tuning does."""
    hybrid.train()
    opt = torch.optim.SGD([p for p in hybrid.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        logits = hybrid(ids)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    hybrid.eval()


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny") / "gpt2")


@pytest.fixture(scope="module")
def own_stories():
    """A private stories260K handle whose weights these tests may change."""
    from headsurgeon.surgery.models.loading import load_model

    from conftest import STORIES, need

    need(STORIES / "stories260K.bin")
    return load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")


@pytest.fixture(scope="module")
def reference_ck(stories, tmp_path_factory):
    """A stories260K checkpoint that references its base (weights untouched), with logits to reproduce."""
    hybrid = replace_heads(stories, PROGRAMS, alpha={(2, 3): 0.5})
    try:
        want = _logits(hybrid, _ids(stories))
        ps = ProgramSet()
        ps.add((0, 1), PROGRAMS[(0, 1)], source="enumerative", scores={"test": {"iou": 0.93, "jsd": 0.12}},
               hypothesis="previous token")
        path = save_hybrid(hybrid, tmp_path_factory.mktemp("ck") / "stories-hybrid",
                           metrics={"delta_ppl": 0.0625, "ppl": {"base": 3.5, "hybrid": 3.7}}, programs=ps)
    finally:
        hybrid.restore()
    return path, want


@pytest.fixture(scope="module")
def embedded_ck(own_stories, tmp_path_factory):
    """A fine-tuned stories260K hybrid: the checkpoint embeds its weights."""
    ids = _ids(own_stories)
    hybrid = replace_heads(own_stories, {(1, 2): Program.parse("prev(1)"), (3, 5): Program.parse("first()")})
    try:
        _fine_tune(hybrid, ids)
        want = _logits(hybrid, ids)
        path = save_hybrid(hybrid, tmp_path_factory.mktemp("ck") / "tuned")
    finally:
        hybrid.restore()
    return path, want


@pytest.fixture()
def copy_of(tmp_path):
    def make(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst
    return make


# ------------------------------------------------------------------------------------------ round trips


def test_reference_checkpoint_layout_and_manifest(reference_ck, stories):
    from conftest import STORIES

    path, _ = reference_ck
    files = _tree(path)
    programs = sorted(f for f in files if f.startswith("programs/"))
    assert set(files) == {"manifest.json", "README.md", *programs} and len(programs) == 3
    assert all(f.endswith(".json") for f in programs)
    m = json.loads((path / "manifest.json").read_text())
    assert (m["format"], m["format_version"]) == ("headsurgeon.hybrid", 1)
    assert m["library"]["headsurgeon"] == headsurgeon.__version__
    # base referenced by path + sha256 (computed here independently)
    assert m["base"]["kind"] == "llama2c"
    assert m["base"]["sha256"] == _sha(STORIES / "stories260K.bin")
    assert m["base"]["tokenizer_sha256"] == _sha(STORIES / "tok512.model")
    assert m["weights"]["stored"] == "reference" and m["weights"]["changed_tensors"] == 0
    assert (m["config"]["n_layers"], m["config"]["n_heads"], m["config"]["n_kv_heads"]) == (5, 8, 4)
    # heads → program files with kind, hash, alpha; every file's sha256 in the table
    assert set(m["heads"]) == {"L0H1", "L2H3", "L4H7"}
    for name, item in m["heads"].items():
        head = (item["layer"], item["head"])
        assert item["hash"] == PROGRAMS[head].hash and item["kind"] == "dsl"
        assert Program.from_json((path / item["program"]).read_text()) == PROGRAMS[head]
        assert item["alpha"] == (0.5 if head == (2, 3) else 1.0)
    assert m["heads"]["L0H1"]["scores"]["test"]["iou"] == 0.93
    assert {k: v["sha256"] for k, v in m["files"].items()} == {k: v for k, v in files.items() if k != "manifest.json"}
    card = (path / "README.md").read_text()
    assert f'hs.load_hybrid("{path.name}")' in card and "import headsurgeon as hs" in card and str(path) not in card
    assert "| delta_ppl | 0.0625 |" in card and "| ppl.hybrid | 3.7 |" in card
    assert "| L0H1 | dsl | 1 | prev(1) | 0.93 | 0.12 | enumerative |" in card


@pytest.mark.smoke
def test_reference_checkpoint_reproduces_logits_bit_for_bit(reference_ck, stories):
    path, want = reference_ck
    ids = _ids(stories)
    assert not torch.equal(_logits(stories.model, ids), want)  # the program heads do change the output
    loaded = load_hybrid(path)
    try:
        assert torch.equal(_logits(loaded, ids), want)
        assert loaded.replaced == PROGRAMS
        assert {k: ph.alpha for k, ph in loaded.program_heads.items()} == {"L0H1": 1.0, "L2H3": 0.5, "L4H7": 1.0}
        assert loaded.handle.source.kind == "llama2c"
    finally:
        loaded.restore()


def test_finetuned_checkpoint_embeds_weights_and_loads_without_base(embedded_ck, own_stories, monkeypatch):
    from safetensors import safe_open

    path, want = embedded_ck
    m = read_manifest(path)
    assert m["weights"]["stored"] == "embedded" and m["weights"]["changed_tensors"] > 0
    assert m["base"]["kind"] == "embedded" and m["base"]["original"]["kind"] == "llama2c"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(m["files"])
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in keys and not any("_original_component" in k for k in keys)

    # no base model, no pickle: loading must not touch either
    def refuse(*a, **k):
        raise AssertionError("must not be called while loading an embedded checkpoint")

    monkeypatch.setattr(ck_load, "load_base", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    import pickle

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    loaded = load_hybrid(path)
    try:
        ids = _ids(own_stories)
        assert loaded.tokenizer(STORY).input_ids == own_stories.tokenizer(STORY).input_ids
        assert torch.equal(_logits(loaded, ids), want)
        assert loaded.handle.source.kind == "embedded"
    finally:
        loaded.restore()


def test_gpt2_reference_and_finetuned_round_trips(tiny_gpt2_dir, tmp_path):
    from headsurgeon.surgery.models.loading import load_model

    handle = load_model(tiny_gpt2_dir)
    ids = _ids(handle, "The cat sat on the mat and looked at the dog. The dog looked back at the cat.")
    programs = {(0, 0): Program.parse("first()"), (1, 3): Program.parse("0.25*prev(1) + 0.75*prev(2)")}
    hybrid = replace_heads(handle, programs, alpha={(1, 3): 0.75})
    try:
        want = _logits(hybrid, ids)
        ref_path = save_hybrid(hybrid, tmp_path / "gpt2-ref")
        _fine_tune(hybrid, ids, steps=1)
        tuned = _logits(hybrid, ids)
        emb_path = save_hybrid(hybrid, tmp_path / "gpt2-tuned")
    finally:
        hybrid.restore()
    assert not torch.equal(want, tuned)
    assert read_manifest(ref_path)["weights"]["stored"] == "reference"
    name = tiny_gpt2_dir.resolve().name  # portable: neither an absolute local path nor one through ".."
    assert read_manifest(ref_path)["base"] == {"kind": "hf", "name_or_path": name, "local": True, "revision": None}
    assert str(tmp_path) not in (ref_path / "manifest.json").read_text()
    assert read_manifest(emb_path)["weights"]["stored"] == "embedded"
    for path, expected in ((emb_path, tuned), (ref_path, want)):
        loaded = load_hybrid(path)
        try:
            assert torch.equal(_logits(loaded, ids), expected), path.name
            assert loaded.replaced == programs
        finally:
            loaded.restore()


def test_python_program_round_trip_with_trust(stories, tmp_path, monkeypatch):
    program = Program.python(PY_SOURCE)
    ids = _ids(stories)
    hybrid = replace_heads(stories, {(1, 1): program, (0, 1): PROGRAMS[(0, 1)]})
    try:
        want = _logits(hybrid, ids)  # runs the Python program in the sandbox
    finally:
        hybrid.restore()
    path = save_hybrid(hybrid, tmp_path / "py")
    rel = f"programs/{program.hash[:16]}.py"
    assert (path / rel).read_text() == program.text
    assert f'trust_programs={{"{program.hash}"}}' in (path / "README.md").read_text()

    # loading never runs program code: the sandbox must not even be asked for
    import headsurgeon.synth.sandbox as sandbox

    real_pool = sandbox.get_pool
    monkeypatch.setattr(sandbox, "get_pool", lambda *a, **k: (_ for _ in ()).throw(AssertionError("sandbox used")))
    with pytest.raises(UntrustedProgramError) as err:
        load_hybrid(path)
    msg = str(err.value)
    assert rel in msg and "trust_programs=True" in msg and program.hash in msg
    with pytest.raises(UntrustedProgramError):
        load_hybrid(path, trust_programs={"0" * 64})
    loaded = None
    for trust in (True, {program.hash}, [program.hash], {_sha(path / rel)}):
        loaded = load_hybrid(path, trust_programs=trust)
        loaded.restore()
        assert loaded.replaced == {(1, 1): program, (0, 1): PROGRAMS[(0, 1)]}
    monkeypatch.setattr(sandbox, "get_pool", real_pool)
    loaded = load_hybrid(path, trust_programs=True)
    try:
        assert torch.equal(_logits(loaded, ids), want)
    finally:
        loaded.restore()


def test_zoo_base_is_referenced_by_name(tmp_path):
    from headsurgeon.surgery.models.loading import ModelLoadError, load_model

    try:
        handle = load_model("tiny-stories")
    except ModelLoadError as e:
        pytest.skip(f"the embedded default model is not built in this checkout: {e}")
    ids = _ids(handle)
    hybrid = replace_heads(handle, {(0, 1): Program.parse("prev(1)")})
    try:
        want = _logits(hybrid, ids)
    finally:
        hybrid.restore()
    path = save_hybrid(hybrid, tmp_path / "zoo")
    m = read_manifest(path)
    assert m["base"] == {"kind": "zoo", "name": "tiny-stories"} and m["weights"]["stored"] == "reference"
    loaded = load_hybrid(path)
    try:
        assert torch.equal(_logits(loaded, ids), want)
    finally:
        loaded.restore()
    # re-saving a hybrid loaded from an embedded checkpoint keeps pointing at the original base
    loaded_again = replace_heads(handle, {(1, 0): Program.parse("first()")})
    loaded_again.restore()
    handle.source = EmbeddedSource("/x", None, {"kind": "zoo", "name": "tiny-stories"})
    m2 = read_manifest(save_hybrid(loaded_again, tmp_path / "re"))
    assert m2["base"] == {"kind": "embedded", "original": {"kind": "zoo", "name": "tiny-stories"}}


def test_resave_replaces_checkpoint_and_leaves_no_siblings(stories, tmp_path):
    target = tmp_path / "ck"
    for programs in ({(0, 0): Program.parse("prev(1)")}, {(1, 1): Program.parse("first()")}):
        hybrid = replace_heads(stories, programs)
        hybrid.restore()
        save_hybrid(hybrid, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    m = read_manifest(target)
    assert set(m["heads"]) == {"L1H1"} and len(list((target / "programs").iterdir())) == 1


def test_save_refuses_what_it_cannot_save(stories, tmp_path):
    from headsurgeon.surgery.swap.providers import ZeroPatterns

    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff\xd8 not ours")
    hybrid = replace_heads(stories, {(0, 0): Program.parse("prev(1)")})
    hybrid.restore()
    with pytest.raises(CheckpointError, match="not a headsurgeon checkpoint; refusing"):
        save_hybrid(hybrid, foreign)
    assert _tree(foreign) == {"cat.jpg": _sha(foreign / "cat.jpg")}
    zero = replace_heads(stories, {(0, 0): ZeroPatterns()})
    zero.restore()
    with pytest.raises(CheckpointError, match="L0H0 is replaced by a ZeroPatterns, not a Program"):
        save_hybrid(zero, tmp_path / "z")
    with pytest.raises(CheckpointError, match="needs a HybridModel"):
        save_hybrid(stories.model, tmp_path / "m")
    assert not (tmp_path / "z").exists() and not (tmp_path / "m").exists()


# ------------------------------------------------------------------------------------------ faults


def test_truncated_safetensors_is_refused(embedded_ck, copy_of):
    path = copy_of(embedded_ck[0])
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(IntegrityError, match=r"model\.safetensors .* is truncated"):
        load_hybrid(path)


def test_modified_program_file_is_refused(reference_ck, copy_of):
    path = copy_of(reference_ck[0])
    rel = read_manifest(path)["heads"]["L0H1"]["program"]
    (path / rel).write_text(json.dumps({"prev": 2}))  # same size class, different content
    with pytest.raises(IntegrityError, match=rf"{rel} in .* (is truncated|is longer than saved)"):
        load_hybrid(path)
    # same size, different bytes: only the hash can tell
    original = (reference_ck[0] / rel).read_bytes()
    (path / rel).write_bytes(original.replace(b"1", b"3"))
    assert len((path / rel).read_bytes()) == len(original)
    with pytest.raises(IntegrityError, match=rf"{rel} .* was modified after saving: sha256"):
        load_hybrid(path)


def test_missing_extra_and_unsafe_files_are_refused(reference_ck, copy_of):
    path = copy_of(reference_ck[0])
    (path / "README.md").unlink()
    with pytest.raises(IntegrityError, match="README.md is missing"):
        load_hybrid(path)
    shutil.copy(reference_ck[0] / "README.md", path / "README.md")
    (path / "pytorch_model.bin").write_bytes(b"not listed")
    with pytest.raises(IntegrityError, match="pytorch_model.bin .* is not listed in the manifest"):
        load_hybrid(path)
    (path / "pytorch_model.bin").unlink()
    (path / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # hidden files (Hub, caches) are ignored
    load_hybrid(path).restore()
    m = json.loads((path / "manifest.json").read_text())
    m["files"]["../escape.txt"] = {"sha256": "0" * 64, "size": 1}
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="unsafe path"):
        load_hybrid(path)


def test_newer_format_version_is_refused(reference_ck, copy_of):
    path = copy_of(reference_ck[0])
    m = json.loads((path / "manifest.json").read_text())
    m["format_version"] = ck.FORMAT_VERSION + 1
    m["library"]["headsurgeon"] = "9.1.0"
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatVersionError, match=rf"format version {ck.FORMAT_VERSION + 1}, written by headsurgeon "
                                                 r"'9.1.0'; upgrade headsurgeon"):
        load_hybrid(path)


def test_missing_or_mismatched_llama2c_base_is_refused(reference_ck, copy_of, tmp_path, monkeypatch):
    from conftest import STORIES

    path = copy_of(reference_ck[0])
    m = json.loads((path / "manifest.json").read_text())
    assert m["base"]["path"] == "stories260K.bin"  # a base outside the folder is named, never reached by a path
    decoy = tmp_path / "moved" / "stories260K.bin"
    decoy.parent.mkdir()
    data = bytearray((STORIES / "stories260K.bin").read_bytes())
    data[-1] ^= 0xFF
    decoy.write_bytes(bytes(data))
    m["base"]["path"] = str(decoy)  # a forged absolute path is reduced to its name: the real base is found instead
    (path / "manifest.json").write_text(json.dumps(m))
    load_hybrid(path).restore()
    monkeypatch.setenv("HEADSURGEON_CACHE", str(tmp_path / "another-machine"))  # no index of this user's bases
    with pytest.raises(BaseModelError, match=rf"stories260K.bin \(sha256 {m['base']['sha256']}\) was found neither "
                                             r"in the checkpoint's folder, nor in the folders of \$HEADSURGEON_BASE_PATH"):
        load_hybrid(path)
    # on the search path, a file of that name with other bytes: its sha256 does not match
    monkeypatch.setenv("HEADSURGEON_BASE_PATH", str(decoy.parent))
    with pytest.raises(BaseModelError, match=rf"{decoy} is not the file this checkpoint was saved on.*expected "
                                             rf"{m['base']['sha256']}"):
        load_hybrid(path)
    monkeypatch.setenv("HEADSURGEON_BASE_PATH", os.pathsep.join([str(decoy.parent), str(STORIES)]))
    assert load_hybrid(path).restore() is not None  # the right file further along the search path is taken
    # pointing base_model at the real file loads it (its weights fingerprint still has to match)
    monkeypatch.delenv("HEADSURGEON_BASE_PATH")
    loaded = load_hybrid(path, base_model=STORIES / "stories260K.bin")
    loaded.restore()
    assert loaded.replaced == PROGRAMS


def test_mismatched_hf_base_weights_are_refused(tiny_gpt2_dir, tmp_path):
    from transformers import GPT2LMHeadModel

    from headsurgeon.surgery.models.loading import load_model

    base = tmp_path / "base"
    shutil.copytree(tiny_gpt2_dir, base)
    handle = load_model(base)
    hybrid = replace_heads(handle, {(0, 0): Program.parse("prev(1)")})
    hybrid.restore()
    path = save_hybrid(hybrid, tmp_path / "ck")
    assert read_manifest(path)["weights"]["stored"] == "reference"
    # someone retrains the base in place
    model = GPT2LMHeadModel.from_pretrained(base)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight.add_(0.01)
    model.save_pretrained(base)
    with pytest.raises(BaseModelError, match=r"does not have the weights this checkpoint was saved on \(weights sha256 "
                                             r"[0-9a-f]{64}, expected [0-9a-f]{64}\); load"):  # digests as they are
        load_hybrid(path)
    shutil.rmtree(base)
    with pytest.raises(BaseModelError, match="base model directory base was found neither in the checkpoint's folder"):
        load_hybrid(path)


def test_not_a_checkpoint(tiny_gpt2_dir, tmp_path):
    with pytest.raises(NotACheckpointError, match="does not exist"):
        load_hybrid(tmp_path / "nowhere")
    (tmp_path / "file.txt").write_text("hi")
    with pytest.raises(NotACheckpointError, match="is a file"):
        load_hybrid(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACheckpointError, match="no manifest.json"):
        load_hybrid(tmp_path / "empty")
    with pytest.raises(NotACheckpointError, match="no manifest.json.*load_model"):
        load_hybrid(tiny_gpt2_dir)  # a plain HF model directory
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"format": "someone.else", "files": {}}))
    with pytest.raises(NotACheckpointError, match="not a headsurgeon hybrid manifest"):
        load_hybrid(other)
    (other / "manifest.json").write_text("{not json")
    with pytest.raises(IntegrityError, match="not valid JSON"):
        load_hybrid(other)


def test_save_killed_midway_keeps_previous_checkpoint(stories, tmp_path, monkeypatch):
    target = tmp_path / "ck"
    first = replace_heads(stories, {(0, 1): Program.parse("prev(1)")})
    first.restore()
    save_hybrid(first, target)
    before = _tree(target)
    second = replace_heads(stories, {(1, 1): Program.parse("first()"), (2, 2): Program.parse("prev(2)"),
                                     (3, 3): Program.parse("uniform()")})
    second.restore()

    real_write = ck_save.write_file
    count = {"n": 0}

    def dying_write(path, data):
        count["n"] += 1
        if count["n"] == 2:
            raise KeyboardInterrupt  # the user hits Ctrl-C after the first file
        real_write(path, data)

    monkeypatch.setattr(ck_save, "write_file", dying_write)
    with pytest.raises(KeyboardInterrupt):
        save_hybrid(second, target)
    monkeypatch.undo()
    assert count["n"] == 2
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no half-written directory left beside it
    loaded = load_hybrid(target)
    loaded.restore()
    assert loaded.replaced == {(0, 1): Program.parse("prev(1)")}

    # killed during the final swap (after the old one was moved aside): the old one is put back
    real_rename = os.rename

    def dying_rename(src, dst):
        if Path(src).name.startswith(".ck.tmp-"):
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        save_hybrid(second, target)
    monkeypatch.undo()
    assert _tree(target) == before and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_hard_kill_leftovers(stories, tmp_path):
    """A save killed with SIGKILL leaves a hidden temp dir: ignored by load, removed by the next save."""
    target = tmp_path / "ck"
    hybrid = replace_heads(stories, {(0, 1): Program.parse("prev(1)")})
    hybrid.restore()
    save_hybrid(hybrid, target)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".ck.tmp-{int(dead.stdout)}-deadbeef"
    stale.mkdir()
    (stale / "manifest.json").write_text("{half")
    load_hybrid(target).restore()
    save_hybrid(hybrid, target)
    assert not stale.exists()
    # a crash between the two renames of the swap: load says where the previous checkpoint is
    aside = tmp_path / ".ck.old-1-cafe"
    os.rename(target, aside)
    with pytest.raises(NotACheckpointError, match=rf"interrupted.*{aside}"):
        load_hybrid(target)


def test_hf_state_dict_uses_plain_transformers_names(stories):
    sd = hf_state_dict(stories.hf_model)
    assert len(sd) == 48 and "lm_head.weight" in sd and "model.norm.weight" in sd
    assert not any("_original_component" in k for k in sd)
    # the tensors are the live ones (so fine-tuning through the bridge shows up here)
    live = {p.data_ptr() for p in stories.model.parameters()}
    assert all(t.data_ptr() in live for k, t in sd.items() if "rotary" not in k)


def test_no_pickle_in_checkpoint_code():
    package = Path(ck.__file__).parent  # headsurgeon/hub/checkpoint/
    files = sorted(package.glob("*.py")) + [package.parent / "remote.py", package.parent / "card.py"]
    assert len(files) > 3
    for path in files:
        text = path.read_text()
        assert "import pickle" not in text and "torch.load(" not in text, path.name
