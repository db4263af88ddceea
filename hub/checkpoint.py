"""Hybrid checkpoints: save a HybridModel to a directory (or Hub repo layout) and load it back bit-for-bit.

Layout (DESIGN section 6)::

    manifest.json          format + version, base model reference or "embedded", config facts,
                           head -> program map (alpha, file, kind, hash), metrics, library versions,
                           sha256 + size of every other file
    programs/<id>.json     DSL programs (safe by construction: loaded freely)
    programs/<id>.py       Python programs (loaded only when trusted; never executed on load)
    model.safetensors      only when the weights differ from the base (e.g. after healing fine-tuning),
    config.json, tokenizer files   ... together with the config and tokenizer so it reloads without the base
    README.md              model card (metrics table + the three lines that load it)

Writes are atomic: everything is built in a hidden temp directory beside the target, fsynced, then
renamed into place (a previous checkpoint is renamed aside first and deleted only after the new one is
in place). Loading verifies every file's sha256 before reading anything else. No pickle anywhere:
weights are safetensors, everything else is JSON or text.
"""
from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import math
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, Collection, Mapping

import torch

FORMAT = "headsurgeon.hybrid"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
PROGRAM_DIR = "programs"
CARD = "README.md"

__all__ = [
    "save_hybrid", "load_hybrid", "read_manifest", "CheckpointError", "NotACheckpointError", "IntegrityError",
    "FormatVersionError", "BaseModelError", "UntrustedProgramError", "FORMAT", "FORMAT_VERSION",
]


# ------------------------------------------------------------------------------------------------ errors


class CheckpointError(ValueError):
    """A hybrid checkpoint cannot be saved or loaded; the message names the file and the fix."""


class NotACheckpointError(CheckpointError):
    """The path is not a headsurgeon hybrid checkpoint (no or foreign manifest.json)."""


class IntegrityError(CheckpointError):
    """A file is missing, truncated, modified after saving, or not listed in the manifest."""


class FormatVersionError(CheckpointError):
    """The checkpoint was written by a newer headsurgeon with a format this version cannot read."""


class BaseModelError(CheckpointError):
    """The base model the checkpoint refers to is missing or is not the one it was saved on."""


class UntrustedProgramError(CheckpointError):
    """The checkpoint holds a Python program the caller has not trusted."""


# ------------------------------------------------------------------------------------------------ helpers


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds (Windows): best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Write bytes and fsync them (every checkpoint file goes through here or is fsynced after writing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serializable; pass metrics as numbers, strings, lists, dicts")


def _json_bytes(obj: Any) -> bytes:
    def clean(x: Any) -> Any:  # NaN/inf are not JSON: store them as null
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    text = json.dumps(clean(json.loads(json.dumps(obj, default=_json_default))), indent=1, sort_keys=False)
    return (text + "\n").encode("utf-8")


def _library_versions() -> dict[str, str]:
    import importlib.metadata as md

    from headsurgeon import __version__

    out = {"headsurgeon": __version__, "torch": torch.__version__}
    for dist in ("transformers", "transformer-lens", "safetensors"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def hf_state_dict(hf_model: Any) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of a (bridged) model, under the plain transformers key names.

    TransformerBridge wraps the HF modules in place (``..._original_component...`` keys, plus aliases);
    the canonical names are those of a fresh, empty model of the same class built on the meta device.
    """
    raw = hf_model.state_dict()
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = type(hf_model)(copy.deepcopy(hf_model.config))
    wanted = list(reference.state_dict().keys())
    wanted_set = set(wanted)
    found: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        name = key.replace("._original_component", "").replace("_original_component.", "")
        if name in wanted_set and name not in found:
            found[name] = value
    missing = [k for k in wanted if k not in found]
    if missing:
        raise CheckpointError(
            f"cannot find {len(missing)} weights of this {type(hf_model).__name__} (e.g. {missing[:3]}) inside the "
            "bridged model; this model layout is not supported by hybrid checkpoints"
        )
    return {k: found[k] for k in wanted}


def weights_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over sorted (name, dtype, shape, bytes) of a state dict: identifies the exact weights."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        h.update(f"{key}\0{str(t.dtype)}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _differing(current: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of tensors that differ (values, dtype or shape; keys present in only one count too)."""
    out = sorted(set(current) ^ set(base))
    for key in sorted(set(current) & set(base)):
        a, b = current[key].detach().to("cpu"), base[key].detach().to("cpu")
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            out.append(key)
    return out


# ------------------------------------------------------------------------------------------------ base models


def _base_reference(source: Mapping[str, Any], hf_model: Any) -> dict[str, Any] | None:
    """A JSON reference to the base model from a ModelHandle's source, or None when it cannot be re-loaded."""
    kind = source.get("kind")
    if kind == "llama2c" and source.get("path") and source.get("sha256"):
        ref = {"kind": "llama2c", "path": str(source["path"]), "sha256": str(source["sha256"])}
        if source.get("tokenizer"):
            ref["tokenizer"] = str(source["tokenizer"])
            ref["tokenizer_sha256"] = str(source.get("tokenizer_sha256") or _sha256_file(Path(source["tokenizer"])))
        return ref
    if kind == "hf" and source.get("name_or_path"):
        name = str(source["name_or_path"])
        local = Path(name).is_absolute() or Path(name).exists()
        ref = {"kind": "hf", "name_or_path": name, "local": bool(local), "revision": source.get("revision")}
        commit = getattr(getattr(hf_model, "config", None), "_commit_hash", None)
        if commit and not local:
            ref["commit"] = str(commit)
        return ref
    if kind == "zoo" and source.get("name"):
        return {"kind": "zoo", "name": str(source["name"])}
    return None


def _check_file(path: Path, sha256: str | None, what: str) -> None:
    if not path.is_file():
        raise BaseModelError(
            f"the base model's {what} {path} is missing (expected sha256 {sha256}); put that file back, or pass "
            "base_model='...' to load_hybrid to point at where it is now"
        )
    if sha256:
        got = _sha256_file(path)
        if got != sha256:
            raise BaseModelError(
                f"the base model's {what} {path} is not the file this checkpoint was saved on: sha256 {got}, "
                f"expected {sha256}; restore the original file or pass base_model='...' pointing at it"
            )


def _base_weights(ref: Mapping[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The referenced base model's weights alone (no bridge, no tokenizer): what ``save_hybrid`` compares with.

    A difference from how ``load_model`` would load it can only make weights look changed, which embeds them:
    never wrong, only bigger.
    """
    kind = ref.get("kind")
    if kind == "llama2c":
        from headsurgeon.surgery.llama2c import load_llama2c

        _check_file(Path(ref["path"]), ref.get("sha256"), "llama2.c checkpoint")
        return dict(load_llama2c(ref["path"]).to(dtype).state_dict())
    if kind == "zoo":
        from headsurgeon.surgery.loading import _zoo_dir

        name, revision = str(_zoo_dir()), None
        if ref.get("name") != "tiny-stories":
            raise CheckpointError(f"unknown zoo model {ref.get('name')!r}")
    elif kind == "hf":
        name, revision = str(ref["name_or_path"]), ref.get("commit") or ref.get("revision")
    else:
        raise CheckpointError(f"unknown base model kind {kind!r}")
    import transformers
    from transformers import AutoConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(name, revision=revision, trust_remote_code=False)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, str(arch), None) if arch else None
        if cls is None:
            raise CheckpointError(f"{name}: architecture {arch!r} is unknown to transformers")
        model = cls.from_pretrained(name, revision=revision, config=config, dtype=dtype, trust_remote_code=False)
    return dict(model.state_dict())


def _load_base(ref: Mapping[str, Any], device: str | torch.device, override: Any = None) -> Any:
    """Re-load the referenced base model (checking file hashes first) as a ModelHandle."""
    from headsurgeon.surgery.loading import ModelLoadError, load_model

    kind = ref.get("kind")
    try:
        if override is not None:
            if kind == "llama2c" and isinstance(override, (str, Path)) and not str(override).startswith("llama2c:"):
                override = f"llama2c:{override}"
            tokenizer = ref.get("tokenizer") if kind == "llama2c" else None
            if tokenizer is not None and not Path(tokenizer).is_file():
                tokenizer = None
            return load_model(override, tokenizer=tokenizer, device=device)
        if kind == "llama2c":
            _check_file(Path(ref["path"]), ref.get("sha256"), "llama2.c checkpoint")
            tokenizer = ref.get("tokenizer")
            if tokenizer:
                _check_file(Path(tokenizer), ref.get("tokenizer_sha256"), "tokenizer")
            return load_model(f"llama2c:{ref['path']}", tokenizer=tokenizer, device=device)
        if kind == "hf":
            name = str(ref["name_or_path"])
            if ref.get("local") and not Path(name).is_dir():
                raise BaseModelError(
                    f"the base model directory {name} is missing; put it back, or pass base_model='...' to "
                    "load_hybrid to point at a copy of it"
                )
            return load_model(name, device=device, revision=ref.get("commit") or ref.get("revision"))
        if kind == "zoo":
            return load_model(str(ref["name"]), device=device)
    except ModelLoadError as e:
        raise BaseModelError(f"cannot re-load the base model {ref}: {e}") from e
    raise CheckpointError(f"unknown base model kind {kind!r} in the manifest")


# ------------------------------------------------------------------------------------------------ save


def _programs_of(hybrid: Any) -> list[tuple[tuple[int, int], Any, float]]:
    from headsurgeon.synth.program import Program

    out = []
    for ph in hybrid.program_heads.values():
        program = ph.program
        if not isinstance(program, Program):
            raise CheckpointError(
                f"head L{ph.layer}H{ph.head} is replaced by a {type(program).__name__}, not a Program; only "
                "program heads (DSL or Python) can be saved in a hybrid checkpoint"
            )
        out.append(((ph.layer, ph.head), program, float(ph.alpha)))
    return sorted(out, key=lambda x: x[0])


def _is_checkpoint_dir(path: Path) -> bool:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _clean_stale_temps(target: Path) -> None:
    """Remove temp dirs of earlier saves to this target whose process died (a hard kill midway)."""
    prefix = f".{target.name}.tmp-"
    if not target.parent.is_dir():
        return
    for p in target.parent.iterdir():
        if p.name.startswith(prefix) and p.is_dir():
            try:
                pid = int(p.name[len(prefix):].split("-")[0])
            except ValueError:
                continue
            if not _pid_alive(pid):
                shutil.rmtree(p, ignore_errors=True)


def save_hybrid(hybrid: Any, directory: str | Path, metrics: Mapping[str, Any] | None = None,
                programs: Any = None, *, card_location: str | None = None) -> Path:
    """Save a HybridModel as a checkpoint directory (atomically); weights are embedded only if they changed.

    ``metrics``: any JSON-able dict shown in the model card (e.g. ``{"delta_ppl": 0.04}``). ``programs``: the
    ProgramSet the heads came from, whose per-head scores / provenance go into the manifest and card.
    ``card_location``: what the card's loading snippet points at (``hf://org/name``; default: the directory).
    """
    from headsurgeon.surgery.replace import HybridModel

    if not isinstance(hybrid, HybridModel):
        raise CheckpointError(f"save_hybrid needs a HybridModel (from replace_heads), got {type(hybrid).__name__}")
    target = Path(directory).expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is a file; choose a directory path for the checkpoint")
    if target.is_dir() and any(target.iterdir()) and not _is_checkpoint_dir(target):
        raise CheckpointError(
            f"{target} exists, is not empty and is not a headsurgeon checkpoint; refusing to replace it. "
            "Choose a new or empty directory (or an existing checkpoint to overwrite)"
        )
    try:
        _json_bytes(dict(metrics or {}))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"metrics must be a JSON-serializable dict: {e}") from e
    handle = hybrid.handle
    hf = handle.hf_model
    if hf is None:
        raise CheckpointError(
            f"{handle.name} has no Hugging Face model inside (a legacy HookedTransformer?); hybrid checkpoints need "
            "a model loaded with load_model from a hub id, a local directory or a llama2.c file"
        )
    heads = _programs_of(hybrid)
    state = hf_state_dict(hf)
    fingerprint = weights_fingerprint(state)

    # reference the base when the weights are untouched, otherwise embed them
    source = {k: v for k, v in (handle.source or {}).items() if not str(k).startswith("_")}
    ref = _base_reference(source, hf)
    changed: list[str] | None = None
    if ref is not None:
        try:
            changed = _differing(state, _base_weights(ref, next(iter(state.values())).dtype))
        except Exception as e:  # base unreachable (moved file, offline hub id): embedding is always correct
            warnings.warn(f"cannot re-load the base model to compare weights ({type(e).__name__}: {e}); "
                          "embedding the weights instead")
            changed = None
    embed = ref is None or changed is None or bool(changed)

    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "library": _library_versions(),
        "base": ({"kind": "embedded", "original": ref or _original_of(source)} if embed else ref),
        "weights": {
            "stored": "embedded" if embed else "reference",
            "file": WEIGHTS if embed else None,
            "sha256": fingerprint,
            "dtype": str(next(iter(state.values())).dtype).replace("torch.", ""),
            "n_tensors": len(state),
            "changed_tensors": (len(changed) if changed is not None else None),
        },
        "config": _config_facts(hybrid),
        "heads": {},
        "metrics": dict(metrics or {}),
        "files": {},
    }
    entries = getattr(programs, "entries", None) or {}
    if programs is not None and "program_summary" not in manifest["metrics"] and hasattr(programs, "summary"):
        manifest["metrics"]["program_summary"] = programs.summary("test")

    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_temps(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        written: set[str] = set()
        for head, program, alpha in heads:
            pid = program.hash[:16]
            rel = f"{PROGRAM_DIR}/{pid}.{'py' if program.kind == 'python' else 'json'}"
            if rel not in written:
                data = (program.text.encode("utf-8") if program.kind == "python"
                        else _json_bytes(program.to_json()))
                _write_file(tmp / rel, data)
                written.add(rel)
            item: dict[str, Any] = {"layer": head[0], "head": head[1], "alpha": alpha, "program": rel,
                                    "kind": program.kind, "hash": program.hash}
            if program.kind == "dsl":
                item["text"] = program.text
            entry = entries.get(head)
            if entry is not None and getattr(entry, "program", None) == program:
                item.update({"source": entry.source, "scores": entry.scores, "hypothesis": entry.hypothesis})
            manifest["heads"][f"L{head[0]}H{head[1]}"] = item
        if embed:
            _write_embedded(tmp, hf, handle.tokenizer, state)
        from .card import render_card

        location = card_location or str(target)
        manifest["files"] = _file_table(tmp)  # the card lists files; recomputed below with the card
        _write_file(tmp / CARD, render_card(manifest, location).encode("utf-8"))
        manifest["files"] = _file_table(tmp)
        _write_file(tmp / MANIFEST, _json_bytes(manifest))
        for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
            _fsync_dir(d)
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _original_of(source: Mapping[str, Any]) -> dict[str, Any] | None:
    """Where embedded weights came from: a re-saved embedded checkpoint keeps its own original base."""
    if source.get("kind") == "embedded":
        return source.get("base")
    return dict(source) or None


def _config_facts(hybrid: Any) -> dict[str, Any]:
    handle = hybrid.handle
    facts = {k: v for k, v in handle.describe().items() if k not in ("source", "pattern_hooks")}
    hf_cfg = getattr(handle.hf_model, "config", None)
    archs = getattr(hf_cfg, "architectures", None) or [type(handle.hf_model).__name__]
    facts.update({"architecture": archs[0], "model_type": getattr(hf_cfg, "model_type", None),
                  "replacement_mode": hybrid.mode})
    return facts


def _write_embedded(tmp: Path, hf: Any, tokenizer: Any, state: Mapping[str, torch.Tensor]) -> None:
    """model.safetensors (plain HF names, shared tensors un-shared), config.json and the tokenizer files."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for key, value in state.items():
        t = value.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in storages or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()  # safetensors refuses shared storage (tied embeddings, views): store a copy
        storages.add(t.untyped_storage().data_ptr())
        tensors[key] = t
    save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt", "producer": FORMAT})
    _fsync_file(tmp / WEIGHTS)
    config = copy.deepcopy(hf.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(hf).__name__]
    _write_file(tmp / "config.json", config.to_json_string(use_diff=True).encode("utf-8"))
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise CheckpointError("the model's tokenizer cannot be saved (no save_pretrained); embedded checkpoints "
                              "need a transformers tokenizer")
    before = {p for p in tmp.rglob("*")}
    tokenizer.save_pretrained(str(tmp))
    for p in set(tmp.rglob("*")) - before:
        if p.is_file():
            _fsync_file(p)


def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    table = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            rel = p.relative_to(root).as_posix()
            table[rel] = {"sha256": _sha256_file(p), "size": p.stat().st_size}
    return table


def _swap_into_place(tmp: Path, target: Path) -> None:
    """Rename tmp to target; an existing target is moved aside first and deleted only afterwards."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None and not target.exists():
            os.rename(old, target)  # put the previous checkpoint back
        raise
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ load


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """Read and check a checkpoint's manifest.json (format and version), without verifying files."""
    root = Path(directory).expanduser()
    if not root.exists():
        leftovers = sorted(root.parent.glob(f".{root.name}.old-*")) if root.parent.is_dir() else []
        hint = (f"; a save was interrupted while replacing it: the previous checkpoint is at {leftovers[0]}"
                if leftovers else "")
        raise NotACheckpointError(f"{root} does not exist{hint}")
    if not root.is_dir():
        raise NotACheckpointError(f"{root} is a file, not a hybrid checkpoint directory (written by save_hybrid)")
    path = root / MANIFEST
    if not path.is_file():
        raise NotACheckpointError(
            f"{root} is not a headsurgeon hybrid checkpoint: it has no {MANIFEST}. Save one with "
            "headsurgeon.save_hybrid(hybrid, dir), or load a plain model with load_model"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise IntegrityError(f"{path} is not valid JSON ({e}); the checkpoint is damaged: save it again") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise NotACheckpointError(
            f"{path} is not a headsurgeon hybrid manifest (format {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
            f"expected {FORMAT!r})"
        )
    version = manifest.get("format_version")
    if not isinstance(version, int):
        raise IntegrityError(f"{path} has no integer format_version; the checkpoint is damaged: save it again")
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{root} uses checkpoint format version {version}, written by headsurgeon "
            f"{manifest.get('library', {}).get('headsurgeon', '?')}; this headsurgeon reads up to version "
            f"{FORMAT_VERSION}. Upgrade headsurgeon (pip install -U headsurgeon)"
        )
    for key in ("heads", "files", "weights", "base"):
        if not isinstance(manifest.get(key), dict):
            raise IntegrityError(f"{path} lacks the {key!r} section; the checkpoint is damaged: save it again")
    return manifest


def _safe_member(root: Path, rel: str) -> Path:
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or not rel or rel.startswith("\\"):
        raise IntegrityError(f"the manifest lists an unsafe path {rel!r} (outside the checkpoint); refusing to load")
    return root / p


def _verify_files(root: Path, manifest: Mapping[str, Any]) -> None:
    """Every listed file exists with its size and sha256; no unlisted (non-hidden) file is present."""
    files = manifest["files"]
    for rel, info in files.items():
        path = _safe_member(root, rel)
        if not path.is_file():
            raise IntegrityError(f"{rel} is missing from {root} (the manifest lists it); the checkpoint is "
                                 "incomplete: download or save it again")
        size = path.stat().st_size
        want_size = info.get("size")
        if isinstance(want_size, int) and size != want_size:
            what = "truncated" if size < want_size else "longer than saved"
            raise IntegrityError(f"{rel} in {root} is {what}: {size} bytes, the manifest says {want_size} "
                                 "(sha256 would not match); download or save the checkpoint again")
        got = _sha256_file(path)
        if got != info.get("sha256"):
            raise IntegrityError(f"{rel} in {root} was modified after saving: sha256 {got}, the manifest says "
                                 f"{info.get('sha256')}; download or save the checkpoint again")
    for p in root.rglob("*"):
        rel_parts = p.relative_to(root).parts
        if any(part.startswith(".") for part in rel_parts) or not p.is_file():
            continue  # .gitattributes, .cache/ of hub downloads: never read
        rel = p.relative_to(root).as_posix()
        if rel != MANIFEST and rel not in files:
            raise IntegrityError(f"{rel} in {root} is not listed in the manifest (added after saving?); remove it "
                                 "or save the checkpoint again")


def _trusted(program_hash: str, file_sha: str, trust: Any) -> bool:
    if trust is True:
        return True
    if trust is False or trust is None:
        return False
    if isinstance(trust, str):
        trust = {trust}
    allowed = {str(h).lower() for h in trust}
    return program_hash in allowed or file_sha in allowed


def _load_programs(root: Path, manifest: Mapping[str, Any], trust: Any) -> tuple[dict, dict]:
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.program import Program

    programs: dict[tuple[int, int], Any] = {}
    alphas: dict[tuple[int, int], float] = {}
    for name, item in manifest["heads"].items():
        try:
            head = (int(item["layer"]), int(item["head"]))
            rel, kind, want = str(item["program"]), str(item["kind"]), str(item["hash"])
            alpha = float(item.get("alpha", 1.0))
        except (KeyError, TypeError, ValueError) as e:
            raise IntegrityError(f"the manifest entry for head {name} is malformed ({e}); save the checkpoint again")
        if rel not in manifest["files"]:
            raise IntegrityError(f"head {name}'s program {rel} is not listed among the manifest's files")
        path = _safe_member(root, rel)
        raw = path.read_bytes()
        if kind == "python":
            if not _trusted(want, _sha256_bytes(raw), trust):
                raise UntrustedProgramError(
                    f"{rel} (head {name}) is a Python program and Python programs load only when trusted. Read it, "
                    f"then pass trust_programs=True to trust every program, or trust_programs={{'{want}'}} to trust "
                    "this one by its hash. (Python programs never run at load time; they run only in the sandbox.)"
                )
            try:
                program = Program.python(raw.decode("utf-8"))  # AST validation only: nothing is executed
            except (ProgramError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{rel} (head {name}) is not a valid Python program: {e}") from e
        elif kind == "dsl":
            try:
                program = Program.from_json(raw.decode("utf-8"))
            except (ProgramError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{rel} (head {name}) is not a valid DSL program: {e}") from e
        else:
            raise CheckpointError(f"head {name}: unknown program kind {kind!r} in the manifest (expected dsl or python)")
        if program.hash != want:
            raise IntegrityError(f"{rel} (head {name}) has program hash {program.hash}, the manifest says {want}")
        programs[head] = program
        alphas[head] = alpha
    return programs, alphas


def _load_embedded(root: Path, manifest: Mapping[str, Any], device: str | torch.device) -> Any:
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from headsurgeon.surgery.loading import load_model

    for need in (WEIGHTS, "config.json"):
        if need not in manifest["files"]:
            raise IntegrityError(f"the manifest says the weights are embedded but lists no {need}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(root), trust_remote_code=False)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, str(arch), None) if arch else None
        if cls is None:
            raise CheckpointError(f"config.json names architecture {arch!r}, which this transformers "
                                  f"({transformers.__version__}) does not provide")
        dtype = getattr(torch, str(manifest["weights"].get("dtype") or "float32"), torch.float32)
        hf = cls.from_pretrained(str(root), config=config, use_safetensors=True, attn_implementation="eager",
                                 dtype=dtype, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
    handle = load_model(hf.eval(), tokenizer=tokenizer, device=device)
    handle.name = str(manifest.get("config", {}).get("name") or handle.name)
    handle.source = {"kind": "embedded", "path": str(root), "weights_sha256": manifest["weights"].get("sha256"),
                     "base": manifest["base"].get("original")}
    return handle


def load_hybrid(directory_or_hf_url: str | Path, trust_programs: bool | Collection[str] = False,
                device: str | torch.device = "cpu", *, base_model: Any = None, endpoint: str | None = None,
                token: str | None = None, cache_dir: str | Path | None = None) -> Any:
    """Load a hybrid checkpoint (a directory or ``hf://org/name[@revision]``) as a HybridModel.

    Every file's sha256 is verified first. DSL programs load freely; Python programs only when trusted:
    ``trust_programs=True`` or a collection of their sha256 program hashes. ``base_model`` overrides where a
    referenced base model is found (its weights must still match the saved fingerprint).
    """
    from headsurgeon.surgery.replace import replace_heads

    if isinstance(directory_or_hf_url, str) and directory_or_hf_url.startswith("hf://"):
        from .remote import download_hybrid

        root = download_hybrid(directory_or_hf_url, endpoint=endpoint, token=token, cache_dir=cache_dir)
    else:
        root = Path(directory_or_hf_url).expanduser()
    manifest = read_manifest(root)
    _verify_files(root, manifest)
    programs, alphas = _load_programs(root, manifest, trust_programs)
    if not programs:
        raise IntegrityError(f"{root}/{MANIFEST} lists no replaced heads; save the checkpoint again")
    weights = manifest["weights"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if weights.get("stored") == "embedded":
            handle = _load_embedded(root, manifest, device)
        elif weights.get("stored") == "reference":
            handle = _load_base(manifest["base"], device, base_model)
            if handle.hf_model is None:
                raise BaseModelError(f"the base model {manifest['base']} loaded without a Hugging Face model inside")
            got = weights_fingerprint(hf_state_dict(handle.hf_model))
            if got != weights.get("sha256"):
                raise BaseModelError(
                    f"the base model {manifest['base']} does not have the weights this checkpoint was saved on "
                    f"(weights sha256 {got}, expected {weights.get('sha256')}); load the exact base model (same "
                    "file / revision), or pass base_model='...' pointing at it"
                )
        else:
            raise IntegrityError(f"{root}/{MANIFEST}: weights.stored is {weights.get('stored')!r}; expected "
                                 "'reference' or 'embedded'")
    for head in programs:
        try:
            handle.check_head(*head)
        except IndexError as e:
            raise CheckpointError(f"{root}: {e}") from e
    return replace_heads(handle, programs, alpha=alphas)
