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
in place). Files in the folder that no earlier save wrote are hard-linked into the new folder first, so
re-saving never deletes them; a non-empty folder save_hybrid did not write needs ``overwrite=True``.

Loading treats the folder as untrusted: every file is opened without following symlinks (only the Hub
cache's links into its blobs/ folder are allowed), must be a regular file of exactly the size the
manifest lists (checked with fstat before reading; nothing is read past it) and have its sha256; no
unlisted file, no path leaving the folder. A head's declared kind, file suffix and content must agree,
so a DSL document never yields a Python program. No pickle anywhere: weights are safetensors,
everything else is JSON or text.
"""
from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import math
import os
import shutil
import stat
import uuid
import warnings
from pathlib import Path
from typing import Any, Collection, Mapping

import torch

from headsurgeon.synth.errors import excerpt

FORMAT = "headsurgeon.hybrid"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
PROGRAM_DIR = "programs"
CARD = "README.md"
PROGRAM_SUFFIX = {"dsl": ".json", "python": ".py"}
MAX_MANIFEST_BYTES = 64 << 20
MAX_PROGRAM_BYTES = 8 << 20
_CHUNK = 1 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

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


_BASE_FIELDS = {"llama2c": "path", "hf": "name_or_path", "zoo": "name"}
_BASE_OPTIONAL = ("sha256", "tokenizer", "tokenizer_sha256", "revision", "commit")


def _check_base_ref(ref: Mapping[str, Any], need_location: bool) -> None:
    """The manifest's base entry has a known kind and, unless overridden, the field that says where the model is."""
    kind = ref.get("kind")
    if not isinstance(kind, str) or kind not in _BASE_FIELDS:
        raise CheckpointError(f"unknown base model kind {excerpt(kind)} in the manifest (expected llama2c, hf or zoo); "
                              "the checkpoint is damaged: save it again")
    field = _BASE_FIELDS[kind]
    value = ref.get(field)
    if need_location and (not isinstance(value, str) or not value):
        got = "it is missing" if field not in ref else f"got {excerpt(value)}"
        raise CheckpointError(f"the manifest's base model entry (kind {kind}) has no {field!r} field naming the base "
                              f"model ({got}); pass base_model='...' to load_hybrid to say where the base model is, or "
                              "save the checkpoint again")
    for key in _BASE_OPTIONAL:
        if ref.get(key) is not None and not isinstance(ref.get(key), str):
            raise CheckpointError(f"the manifest's base model entry has a {key!r} field that is not a string "
                                  f"({excerpt(ref.get(key))}); the checkpoint is damaged: save it again")


def _load_base(ref: Mapping[str, Any], device: str | torch.device, override: Any = None) -> Any:
    """Re-load the referenced base model (checking file hashes first) as a ModelHandle."""
    from headsurgeon.surgery.loading import ModelLoadError, load_model

    _check_base_ref(ref, need_location=override is None)
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
        raise BaseModelError(f"cannot re-load the base model {excerpt(ref)}: {excerpt(str(e), 300)}") from e
    raise CheckpointError(f"unknown base model kind {excerpt(kind)} in the manifest")


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


# ------------------------------------------------------------------------------------------------ the target folder
# A save replaces only the files an earlier save wrote (listed in its manifest and unchanged since); every other
# entry of the folder is hard-linked (or copied) into the new folder before the atomic swap, so it survives.


def _checked_target(directory: str | Path) -> Path:
    """The absolute checkpoint path; a file or a symlink there is refused."""
    target = Path(directory).expanduser().absolute()
    if target.is_symlink():
        raise CheckpointError(f"{target} is a symbolic link (to {os.path.realpath(target)}); save to the folder it "
                              "points to, or choose another path")
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is a file; choose a directory path for the checkpoint")
    return target


def _verified_files(target: Path) -> tuple[set[str], str | None]:
    """Files of ``target`` listed in its manifest with their saved size and sha256, and why it is no checkpoint."""
    try:
        manifest = _read_manifest(target)
    except NotACheckpointError:
        return set(), "has no headsurgeon manifest.json"
    except CheckpointError as e:
        return set(), f"its manifest.json cannot be used ({excerpt(str(e), 160)})"
    ours: set[str] = set()
    problem = None if CARD in manifest["files"] else f"its manifest.json lists no {CARD}"
    for rel, info in manifest["files"].items():
        try:
            size, want = _file_info(rel, info)
            got, _ = _read_member(target, rel, size)
        except CheckpointError:
            got, want = "", "?"
        if got == want:
            ours.add(rel)
        elif problem is None:
            problem = f"its manifest.json lists {excerpt(rel, 80)}, which is missing or changed since it was saved"
    return ours, problem


def _previous_files(target: Path, overwrite: bool) -> set[str]:
    """What an earlier save wrote into ``target`` (and may be replaced); a folder it did not write needs overwrite."""
    if not target.is_dir():
        return set()
    with os.scandir(target) as entries:
        if next(entries, None) is None:
            return set()
    ours, problem = _verified_files(target)
    if problem is None:
        return ours | {MANIFEST}
    if overwrite:
        return ours
    raise CheckpointError(
        f"{target} is not empty and {problem}, so it is not a headsurgeon checkpoint; refusing to write into it "
        "(saving never deletes files it did not write). Choose a new or empty folder, or pass overwrite=True to "
        "write the checkpoint into it: files with the checkpoint's names are replaced, all other files are kept"
    )


def _plan_carry(src: Path, rel_dir: str, tmp: Path, ours: set[str], our_dirs: set[str],
                plan: dict[str, list]) -> None:
    """Sort the entries of ``src`` (a folder of the old checkpoint) into files to carry, folders and conflicts."""
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = rel_dir + entry.name
        new = tmp / rel
        if entry.is_dir(follow_symlinks=False):
            if os.path.lexists(new) and not new.is_dir():
                plan["conflicts"].append(rel + "/")
                continue
            if rel not in our_dirs:
                plan["dirs"].append((Path(entry.path), new))
            _plan_carry(Path(entry.path), rel + "/", tmp, ours, our_dirs, plan)
        elif rel in ours:
            continue  # written by the earlier save: replaced or dropped
        elif os.path.lexists(new):
            plan["conflicts"].append(rel)
        else:
            plan["files"].append((Path(entry.path), new))


def _link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` as a hard link (same file, nothing copied), or as a copy where links are unsupported."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError:
        pass
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_file():
        shutil.copy2(src, dst, follow_symlinks=False)
    else:
        raise CheckpointError(f"cannot keep {src} in the new checkpoint folder (it is not a regular file and this file "
                              "system has no hard links); move it out of the folder and save again")


def _carry_user_files(target: Path, tmp: Path, ours: set[str], overwrite: bool) -> None:
    """Give the new folder every entry of the old one that no earlier save wrote; a name clash needs overwrite."""
    if not target.is_dir():
        return
    our_dirs = {"/".join(rel.split("/")[:i]) for rel in ours for i in range(1, rel.count("/") + 1)}
    plan: dict[str, list] = {"files": [], "dirs": [], "conflicts": []}
    _plan_carry(target, "", tmp, ours, our_dirs, plan)
    if plan["conflicts"] and not overwrite:
        names = ", ".join(plan["conflicts"][:5]) + (" ..." if len(plan["conflicts"]) > 5 else "")
        raise CheckpointError(f"{target} holds files that an earlier save did not write, with the names of files this "
                              f"save writes: {names}. Move them out of the folder, or pass overwrite=True to replace "
                              "them")
    for src, dst in plan["dirs"]:
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copystat(src, dst, follow_symlinks=False)
    for src, dst in plan["files"]:
        dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src, dst)


def _stale(target: Path, kind: str) -> list[Path]:
    """Leftover ``.<name>.<kind>-<pid>-*`` folders of saves to ``target`` whose process has died."""
    prefix = f".{target.name}.{kind}-"
    if not target.parent.is_dir():
        return []
    out = []
    for p in sorted(target.parent.iterdir()):
        if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink():
            try:
                pid = int(p.name[len(prefix):].split("-")[0])
            except ValueError:
                continue
            if not _pid_alive(pid):
                out.append(p)
    return out


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``b`` is ``a`` (a hard link) or a regular file with the same bytes."""
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return True
    if stat.S_ISLNK(sa.st_mode) and stat.S_ISLNK(sb.st_mode):
        return os.readlink(a) == os.readlink(b)
    if not (stat.S_ISREG(sa.st_mode) and stat.S_ISREG(sb.st_mode)) or sa.st_size != sb.st_size:
        return False
    return _sha256_file(a) == _sha256_file(b)


def _only_in(old: Path, target: Path) -> list[str]:
    """Files of a stale ``.old`` copy that are neither its own checkpoint files nor present in ``target``."""
    ours, _ = _verified_files(old)
    left = []
    for folder, _dirs, names in os.walk(old):
        for name in sorted(names):
            path = Path(folder) / name
            rel = path.relative_to(old).as_posix()
            if rel not in ours and rel != MANIFEST and not _same_file(path, target / rel):
                left.append(rel)
    return left


def _clean_stale(target: Path) -> None:
    """Tidy up after killed saves: put a lone ``.old`` copy back; delete copies that hold nothing else."""
    for old in _stale(target, "old"):
        if not os.path.lexists(target):
            os.rename(old, target)  # killed between the two renames of the swap: the previous checkpoint goes back
            continue
        left = _only_in(old, target)
        if left:
            warnings.warn(f"{old.name} (left by an interrupted save) holds files that are not in {target}: "
                          f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}; it is kept: move what you need "
                          "out of it, then delete it")
        else:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in _stale(target, "tmp"):
        shutil.rmtree(tmp, ignore_errors=True)  # new files and links to files that are still in place


def save_hybrid(hybrid: Any, directory: str | Path, metrics: Mapping[str, Any] | None = None,
                programs: Any = None, *, card_location: str | None = None, overwrite: bool = False) -> Path:
    """Save a HybridModel as a checkpoint directory (atomically); weights are embedded only if they changed.

    ``metrics``: any JSON-able dict shown in the model card (e.g. ``{"delta_ppl": 0.04}``). ``programs``: the
    ProgramSet the heads came from, whose per-head scores / provenance go into the manifest and card.
    ``card_location``: what the card's loading snippet points at (``hf://org/name``; default: the directory).
    Re-saving replaces only the files the earlier save wrote; other files in the folder are kept. A non-empty
    folder that save_hybrid did not write is refused unless ``overwrite=True`` (which replaces the files with the
    checkpoint's names and still keeps all others).
    """
    from headsurgeon.surgery.replace import HybridModel

    if not isinstance(hybrid, HybridModel):
        raise CheckpointError(f"save_hybrid needs a HybridModel (from replace_heads), got {type(hybrid).__name__}")
    target = _checked_target(directory)
    _clean_stale(target)
    ours = _previous_files(target, overwrite)
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
        _carry_user_files(target, tmp, ours, overwrite)
        for folder, _dirs, _names in os.walk(tmp, topdown=False):
            _fsync_dir(Path(folder))
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
    return _read_manifest(root, _hub_links(root))


def _hub_links(root: Path) -> Path | None:
    """Where a Hub cache snapshot's file links may point (its blobs folder); None for any other folder."""
    from .remote import snapshot_blobs

    return snapshot_blobs(root)


def _read_manifest(root: Path, links_into: Path | None = None) -> dict[str, Any]:
    """read_manifest, reading manifest.json like every checkpoint file: no symlink, regular, bounded in size."""
    if not root.exists():
        leftovers = sorted(root.parent.glob(f".{root.name}.old-*")) if root.parent.is_dir() else []
        hint = (f"; a save was interrupted while replacing it: the previous checkpoint is at {leftovers[0]}"
                if leftovers else "")
        raise NotACheckpointError(f"{root} does not exist{hint}")
    if not root.is_dir():
        raise NotACheckpointError(f"{root} is a file, not a hybrid checkpoint directory (written by save_hybrid)")
    path = root / MANIFEST
    if not os.path.lexists(path):
        raise NotACheckpointError(
            f"{root} is not a headsurgeon hybrid checkpoint: it has no {MANIFEST}. Save one with "
            "headsurgeon.save_hybrid(hybrid, dir), or load a plain model with load_model"
        )
    raw = _read_whole(root, MANIFEST, MAX_MANIFEST_BYTES, links_into)
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise IntegrityError(f"{path} is not valid JSON ({excerpt(str(e))}); the checkpoint is damaged: save it "
                             "again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise NotACheckpointError(
            f"{path} is not a headsurgeon hybrid manifest (format {excerpt(found)}, expected {FORMAT!r})"
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise IntegrityError(f"{path} has no integer format_version; the checkpoint is damaged: save it again")
    if version > FORMAT_VERSION:
        library = manifest.get("library")
        writer = library.get("headsurgeon", "?") if isinstance(library, dict) else "?"
        raise FormatVersionError(
            f"{root} uses checkpoint format version {version}, written by headsurgeon {excerpt(writer)}; this "
            f"headsurgeon reads up to version {FORMAT_VERSION}. Upgrade headsurgeon (pip install -U headsurgeon)"
        )
    for key in ("heads", "files", "weights", "base"):
        if not isinstance(manifest.get(key), dict):
            raise IntegrityError(f"{path} lacks the {key!r} section; the checkpoint is damaged: save it again")
    return manifest


# ------------------------------------------------------------------------------------------------ reading files
# Every file of a checkpoint is opened through _open_member: each folder on its path and the file itself are
# opened without following symlinks, the file must be regular, and its size is known before a byte is read.


def _member_parts(rel: Any) -> list[str]:
    """The folder names and file name of a manifest path; anything that could leave the checkpoint is refused."""
    parts = rel.split("/") if isinstance(rel, str) and len(rel) <= 1024 and rel.isprintable() else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in rel or ":" in parts[0]:
        raise IntegrityError(f"the manifest lists an unsafe path {excerpt(rel)} (outside the checkpoint, or not a "
                             "plain relative path); refusing to load")
    return parts


def _symlink_error(root: Path, rel: str) -> IntegrityError:
    """The error for a symlink inside a checkpoint: loading never reads anything outside the folder."""
    return IntegrityError(
        f"{rel} in {root} is a symbolic link; a checkpoint holds only real files and folders, so that nothing is "
        "read from outside it. Replace the link by a copy of what it points to, or download or save the checkpoint "
        "again"
    )


def _open_error(root: Path, where: str, rel: str, error: OSError) -> IntegrityError:
    """Explain why opening ``where`` (``rel`` or one of its folders) failed."""
    path = root / where
    if path.is_symlink():
        return _symlink_error(root, where)
    if not os.path.lexists(path):
        return IntegrityError(f"{rel} is missing from {root} (the manifest lists it); the checkpoint is incomplete: "
                              "download or save it again")
    if where != rel and not path.is_dir():
        return IntegrityError(f"{where} in {root} is not a folder, but the manifest lists {rel} inside it; "
                              "download or save the checkpoint again")
    return IntegrityError(f"cannot open {rel} in {root} ({error.strerror}); check its permissions")


def _open_hub_blob(root: Path, rel: str, blobs: Path) -> int:
    """Open a Hub cache link: allowed only when it resolves to a file directly inside the cache's blobs folder."""
    real = Path(os.path.realpath(root / rel))
    if real.parent != Path(os.path.realpath(blobs)):
        raise _symlink_error(root, rel)
    try:
        return os.open(real, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError as e:
        raise IntegrityError(f"cannot open {rel} in {root} (a link to {real}: {e.strerror}); download the checkpoint "
                             "again") from None


def _check_regular(fd: int, root: Path, rel: str) -> os.stat_result:
    """fstat an opened member and refuse anything but a regular file (FIFOs, devices, sockets, folders)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise IntegrityError(f"{rel} in {root} is not a regular file ({what}); a checkpoint holds only regular files: "
                             "download or save it again")
    return st


def _open_member(root: Path, rel: str, links_into: Path | None = None) -> tuple[int, int]:
    """Open a checkpoint file without following any symlink (except Hub cache links into ``links_into``).

    Returns the descriptor and the file's size. O_NONBLOCK keeps a FIFO from blocking the open.
    """
    parts = _member_parts(rel)
    dir_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                fd = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
            except OSError as e:
                raise _open_error(root, "/".join(parts[: i + 1]), rel, e) from None
            os.close(dir_fd)
            dir_fd = fd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if links_into is None or not (root / rel).is_symlink():
                raise _open_error(root, rel, rel, e) from None
            fd = _open_hub_blob(root, rel, links_into)
    finally:
        os.close(dir_fd)
    return fd, _check_regular(fd, root, rel).st_size


def _size_error(root: Path, rel: str, size: int, want: int) -> IntegrityError:
    what = "truncated" if size < want else "longer than saved"
    return IntegrityError(f"{rel} in {root} is {what}: {size} bytes, the manifest says {want} (sha256 would not "
                          "match); download or save the checkpoint again")


def _read_fd(fd: int, size: int, keep: bool) -> tuple[str, bytes | None]:
    """sha256 of exactly ``size`` bytes from ``fd`` (and the bytes, with keep); None if the file is shorter."""
    digest, chunks, left = hashlib.sha256(), [], size
    while left:
        chunk = os.read(fd, min(_CHUNK, left))
        if not chunk:
            return "", None
        digest.update(chunk)
        left -= len(chunk)
        if keep:
            chunks.append(chunk)
    return digest.hexdigest(), (b"".join(chunks) if keep else None)


def _read_member(root: Path, rel: str, want_size: int, links_into: Path | None = None,
                 keep: bool = False) -> tuple[str, bytes | None]:
    """sha256 (and with keep the bytes) of a checkpoint file that must be ``want_size`` bytes; never reads past it."""
    fd, size = _open_member(root, rel, links_into)
    try:
        if size != want_size:
            raise _size_error(root, rel, size, want_size)
        digest, data = _read_fd(fd, size, keep)
        if not digest:
            raise _size_error(root, rel, os.fstat(fd).st_size, want_size)
        return digest, data
    finally:
        os.close(fd)


def _read_whole(root: Path, rel: str, limit: int, links_into: Path | None = None) -> bytes:
    """The bytes of a checkpoint file without a listed size (manifest.json), refusing one over ``limit`` bytes."""
    fd, size = _open_member(root, rel, links_into)
    try:
        if size > limit:
            raise IntegrityError(f"{rel} in {root} is {size} bytes, more than the {limit} a {rel} may have; "
                                 "the checkpoint is damaged: download or save it again")
        _, data = _read_fd(fd, size, keep=True)
        if data is None:
            raise IntegrityError(f"{rel} in {root} shrank while it was read; load it again")
        return data
    finally:
        os.close(fd)


def _file_info(rel: str, info: Any) -> tuple[int, str]:
    """The (size, sha256) the manifest lists for ``rel`` (a path _member_parts accepted); both are required."""
    if not isinstance(info, dict) or "size" not in info:
        raise IntegrityError(f"the manifest gives no size for {rel}; sizes are required so that no file "
                             "is read past what was saved: save the checkpoint again")
    size, sha = info["size"], info.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise IntegrityError(f"the manifest's size for {rel} is {excerpt(size)}, not a byte count; save the "
                             "checkpoint again")
    if not isinstance(sha, str):
        raise IntegrityError(f"the manifest gives no sha256 for {rel}; save the checkpoint again")
    return size, sha


def _program_files(manifest: Mapping[str, Any]) -> set[str]:
    """The files the manifest's heads name as their programs."""
    return {item.get("program") for item in manifest["heads"].values()
            if isinstance(item, dict) and isinstance(item.get("program"), str)}


def _verify_files(root: Path, manifest: Mapping[str, Any], links_into: Path | None = None) -> dict[str, bytes]:
    """Check the folder's shape, then every listed file's size and sha256; returns the program files' bytes.

    No symlink, special file or unlisted (non-hidden) file may be present, and no path may leave the folder.
    """
    files = manifest["files"]
    _refuse_unlisted(root, files, links_into)
    programs = _program_files(manifest)
    kept: dict[str, bytes] = {}
    for rel, info in files.items():
        _member_parts(rel)
        size, want = _file_info(rel, info)
        if rel in programs and size > MAX_PROGRAM_BYTES:
            raise IntegrityError(f"{rel} in {root} is a program file of {size} bytes, too large for a program (at "
                                 f"most {MAX_PROGRAM_BYTES}); refusing to load this checkpoint")
        got, data = _read_member(root, rel, size, links_into, keep=rel in programs)
        if got != want:
            raise IntegrityError(f"{rel} in {root} was modified after saving: sha256 {got}, the manifest says "
                                 f"{excerpt(want)}; download or save the checkpoint again")
        if data is not None:
            kept[rel] = data
    return kept


def _refuse_unlisted(root: Path, files: Mapping[str, Any], links_into: Path | None) -> None:
    """No symlink (but Hub cache links of listed files), and nothing unlisted but hidden entries, in the folder."""
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .cache/ of hub downloads, .git: never read
        for name in sorted(dirs) + sorted(n for n in names if not n.startswith(".")):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() and not (links_into is not None and (rel in files or rel == MANIFEST)):
                raise _symlink_error(root, rel)
            if name in dirs or rel in files or rel == MANIFEST:
                continue
            if not path.is_file():
                raise IntegrityError(f"{rel} in {root} is not a regular file and is not listed in the manifest; "
                                     "remove it, or download or save the checkpoint again")
            raise IntegrityError(f"{rel} in {root} is not listed in the manifest (added after saving?); remove it "
                                 "or move it out of the checkpoint folder")


def _trusted(program_hash: str, file_sha: str, trust: Any) -> bool:
    if trust is True:
        return True
    if trust is False or trust is None:
        return False
    if isinstance(trust, str):
        trust = {trust}
    allowed = {str(h).lower() for h in trust}
    return program_hash in allowed or file_sha in allowed


def _head_entry(name: str, item: Any) -> tuple[tuple[int, int], str, str, str, float]:
    """(head, program file, kind, program hash, alpha) of one manifest head entry."""
    try:
        head = (int(item["layer"]), int(item["head"]))
        rel, kind, want = item["program"], item["kind"], item["hash"]
        alpha = float(item.get("alpha", 1.0))
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
        raise IntegrityError(f"the manifest entry for head {name} is malformed ({excerpt(e)}); save the checkpoint "
                             "again") from None
    if not all(isinstance(v, str) for v in (rel, kind, want)):
        raise IntegrityError(f"the manifest entry for head {name} is malformed (program, kind and hash must be "
                             "strings); save the checkpoint again")
    if kind not in PROGRAM_SUFFIX:
        raise CheckpointError(f"head {name}: unknown program kind {excerpt(kind)} in the manifest (expected dsl or "
                              "python)")
    return head, rel, kind, want, alpha


def _check_program_file(name: str, rel: str, kind: str) -> None:
    """The file a head names lives in programs/ and its suffix matches the declared kind (.json dsl, .py python)."""
    parts = rel.split("/")
    if len(parts) != 2 or parts[0] != PROGRAM_DIR:
        raise CheckpointError(f"head {name}: its program file {excerpt(rel)} is not inside {PROGRAM_DIR}/, where "
                              "save_hybrid puts every program; this checkpoint was altered after saving: do not load "
                              "it, get it again from its author")
    suffix = PROGRAM_SUFFIX[kind]
    if not parts[1].endswith(suffix) or parts[1] == suffix:
        raise CheckpointError(f"head {name}: the manifest declares a {kind} program but its file {excerpt(rel)} does "
                              f"not end in {suffix}; the declared kind, the file suffix and the content must agree, so "
                              "this checkpoint was altered after saving: do not load it, get it again from its author")


def _parse_program(name: str, rel: str, kind: str, want: str, raw: bytes, trust: Any) -> Any:
    """The head's Program, parsed as its declared kind only: DSL JSON can never yield Python, nothing runs."""
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.program import Program

    if kind == "python" and not _trusted(want, _sha256_bytes(raw), trust):
        raise UntrustedProgramError(
            f"{rel} (head {name}) is a Python program and Python programs load only when trusted. Read it, "
            f"then pass trust_programs=True to trust every program, or trust_programs={{'{want}'}} to trust "
            "this one by its hash. (Python programs never run at load time; they run only in the sandbox.)"
        )
    try:
        text = raw.decode("utf-8")
        if kind == "python":
            program = Program.python(text)  # AST validation only: nothing is executed
        else:
            program = Program.from_dsl_json(text)
    except (ProgramError, UnicodeDecodeError, RecursionError) as e:
        what = "Python" if kind == "python" else "DSL"
        raise CheckpointError(f"{rel} (head {name}) is not a valid {what} program: {excerpt(str(e), 300)}") from None
    if program.kind != kind:
        raise CheckpointError(f"{rel} (head {name}) holds a {program.kind} program, the manifest declares {kind}")
    if program.hash != want:
        raise IntegrityError(f"{rel} (head {name}) has program hash {program.hash}, the manifest says {excerpt(want)}")
    return program


def _load_programs(manifest: Mapping[str, Any], sources: Mapping[str, bytes], trust: Any) -> tuple[dict, dict]:
    """head -> Program and head -> alpha from the verified program files' bytes."""
    programs: dict[tuple[int, int], Any] = {}
    alphas: dict[tuple[int, int], float] = {}
    for key, item in manifest["heads"].items():
        name = key if len(key) <= 40 and key.isprintable() else excerpt(key, 40)
        head, rel, kind, want, alpha = _head_entry(name, item)
        _member_parts(rel)
        if rel not in manifest["files"] or rel not in sources:
            raise IntegrityError(f"head {name}'s program {excerpt(rel)} is not listed among the manifest's files")
        _check_program_file(name, rel, kind)
        programs[head] = _parse_program(name, rel, kind, want, sources[rel], trust)
        alphas[head] = alpha
    return programs, alphas


def _load_embedded(root: Path, manifest: Mapping[str, Any], device: str | torch.device) -> Any:
    """A ModelHandle of the weights, config and tokenizer stored in the checkpoint itself."""
    from headsurgeon.surgery.loading import load_model

    for need in (WEIGHTS, "config.json"):
        if need not in manifest["files"]:
            raise IntegrityError(f"the manifest says the weights are embedded but lists no {need}")
    _check_safetensors(root)
    try:
        hf, tokenizer = _from_pretrained(root, manifest)
    except CheckpointError:
        raise
    except Exception as e:  # transformers / tokenizers / safetensors raise many types for a damaged folder
        raise CheckpointError(f"cannot load the embedded model in {root} (config.json, {WEIGHTS}, tokenizer files): "
                              f"{type(e).__name__}: {excerpt(str(e), 300)}; download or save the checkpoint "
                              "again") from None
    handle = load_model(hf.eval(), tokenizer=tokenizer, device=device)
    handle.name = str(manifest.get("config", {}).get("name") or handle.name)
    handle.source = {"kind": "embedded", "path": str(root), "weights_sha256": manifest["weights"].get("sha256"),
                     "base": manifest["base"].get("original")}
    return handle


def _check_safetensors(root: Path) -> None:
    """Open model.safetensors' header with safetensors itself, so a damaged file is named, not a raw SafetensorError."""
    from safetensors import safe_open

    try:
        with safe_open(str(root / WEIGHTS), "pt") as f:
            names = list(f.keys())
            for name in names[:1]:
                f.get_slice(name)
    except Exception as e:  # SafetensorError, OSError, ValueError: all mean the same damaged file
        raise IntegrityError(f"{WEIGHTS} in {root} is not a valid safetensors file ({type(e).__name__}: "
                             f"{excerpt(str(e), 300)}); the weights are damaged: download or save the checkpoint "
                             "again") from None


def _from_pretrained(root: Path, manifest: Mapping[str, Any]) -> tuple[Any, Any]:
    """The embedded Hugging Face model and tokenizer (no remote code, safetensors only)."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(root), trust_remote_code=False)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, str(arch), None) if arch else None
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise CheckpointError(f"config.json names architecture {excerpt(arch)}, which this transformers "
                                  f"({transformers.__version__}) does not provide as a model class")
        dtype = getattr(torch, str(manifest["weights"].get("dtype") or "float32"), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"the manifest's weights.dtype {excerpt(manifest['weights'].get('dtype'))} is not "
                                  "a torch dtype; save the checkpoint again")
        hf = cls.from_pretrained(str(root), config=config, use_safetensors=True, attn_implementation="eager",
                                 dtype=dtype, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
    return hf, tokenizer


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
    links_into = _hub_links(root)
    manifest = _read_manifest(root, links_into)
    sources = _verify_files(root, manifest, links_into)
    programs, alphas = _load_programs(manifest, sources, trust_programs)
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
                raise BaseModelError(f"the base model {excerpt(manifest['base'])} loaded without a Hugging Face "
                                     "model inside")
            got = weights_fingerprint(hf_state_dict(handle.hf_model))
            if got != weights.get("sha256"):
                raise BaseModelError(
                    f"the base model {excerpt(manifest['base'])} does not have the weights this checkpoint was saved "
                    f"on (weights sha256 {got}, expected {excerpt(weights.get('sha256'))}); load the exact base model "
                    "(same file / revision), or pass base_model='...' pointing at it"
                )
        else:
            raise IntegrityError(f"{root}/{MANIFEST}: weights.stored is {excerpt(weights.get('stored'))}; expected "
                                 "'reference' or 'embedded'")
    for head in programs:
        try:
            handle.check_head(*head)
        except IndexError as e:
            raise CheckpointError(f"{root}: {e}") from e
    return replace_heads(handle, programs, alpha=alphas)
