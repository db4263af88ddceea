"""load_hybrid: verify a checkpoint folder (or Hub repo) file by file, then rebuild the HybridModel.

Loading treats the folder as untrusted (SECURITY.md): every file's size and sha256 are checked before
anything is parsed, Python programs need trust, and weights load only through safetensors.
"""
from __future__ import annotations

import re

import warnings
from pathlib import Path
from typing import Any, Collection

import torch

from headsurgeon.surgery.swap.hybrid import HybridModel

from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.errors import excerpt

from .base_models import load_base, located
from .embedded import load_embedded
from .errors import BaseModelError, CheckpointError, IntegrityError
from .files import verify_files
from .layout import MANIFEST
from .location import HF_SCHEME, download_hybrid
from .lock import folder_lock
from .manifest import hub_links, read_manifest_at
from .programs import load_programs
from .weights import hf_state_dict, weights_fingerprint

__all__ = ["load_hybrid"]


def load_hybrid(directory_or_hf_url: str | Path, trust_programs: bool | Collection[str] = False,
                device: str | torch.device = "cpu", *, base_model: Any = None, endpoint: str | None = None,
                token: str | None = None, cache_dir: str | Path | None = None) -> HybridModel:
    """Load a hybrid checkpoint (a directory or ``hf://org/name[@revision]``) as a HybridModel.

    Every file's sha256 is verified first. DSL programs load freely; Python programs only when trusted:
    ``trust_programs=True`` or a collection of their sha256 program hashes. ``base_model`` overrides where a
    referenced base model is found (its weights must still match the saved fingerprint).
    """
    if isinstance(directory_or_hf_url, str) and directory_or_hf_url.startswith(HF_SCHEME):
        root = download_hybrid(directory_or_hf_url, endpoint=endpoint, token=token, cache_dir=cache_dir)
        return _load_root(root, trust_programs, device, base_model)
    root = Path(directory_or_hf_url).expanduser()
    with folder_lock(root, exclusive=False):  # a concurrent save swaps the folder only under the exclusive lock
        return _load_root(root, trust_programs, device, base_model)


def _load_root(root: Path, trust_programs: bool | Collection[str], device: str | torch.device,
               base_model: Any) -> HybridModel:
    """load_hybrid on a local folder (a Hub download's snapshot included)."""
    links_into = hub_links(root)
    manifest = read_manifest_at(root, links_into)
    sources = verify_files(root, manifest, links_into)
    programs, alphas = load_programs(manifest, sources, trust_programs)
    if not programs:
        raise IntegrityError(f"{root}/{MANIFEST} lists no replaced heads; save the checkpoint again")
    weights = manifest["weights"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if weights.get("stored") == "embedded":
            handle = load_embedded(root, manifest, device)
        elif weights.get("stored") == "reference":
            handle = load_base(located(manifest["base"], root), device, base_model)
            if handle.hf_model is None:
                raise BaseModelError(f"the base model {excerpt(manifest['base'])} loaded without a Hugging Face "
                                     "model inside")
            got = weights_fingerprint(hf_state_dict(handle.hf_model))
            want = weights.get("sha256")
            if got != want:
                want = want if isinstance(want, str) and re.fullmatch(r"[0-9a-f]{64}", want) else excerpt(want)
                raise BaseModelError(
                    f"the base model {excerpt(manifest['base'])} does not have the weights this checkpoint was saved "
                    f"on (weights sha256 {got}, expected {want}); load the exact base model "
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
    healing = healing_of(manifest, root)
    if healing:  # with the weights, where hs.heal keeps them; the hybrid shows them as .healing (headsurgeon/surgery/swap/heal.py)
        handle.healing = healing
    return replace_heads(handle, programs, alpha=alphas)


def healing_of(manifest: dict[str, Any], root: Path) -> list[dict[str, Any]]:
    """The manifest's healing records (absent: none); anything but a list of JSON objects is a damaged manifest."""
    records = manifest.get("healing", [])
    if not (isinstance(records, list) and all(isinstance(r, dict) for r in records)):
        raise IntegrityError(f"{root}/{MANIFEST}: 'healing' is {excerpt(records)}; expected a list of healing "
                             "records; the checkpoint is damaged: save it again")
    return records
