"""Where a checkpoint lives: a local folder, or ``hf://org/name[@revision]`` downloaded into the Hub cache.

``load_hybrid`` reads a Hub checkpoint from the cache's snapshot folder, whose files are symlinks into the
cache's blobs folder; ``snapshot_blobs`` names that folder, the one place such links may point (SECURITY.md).
"""
from __future__ import annotations

import re
from pathlib import Path

from .errors import CheckpointError

__all__ = ["HF_SCHEME", "parse_hf_url", "download_hybrid", "snapshot_blobs"]

HF_SCHEME = "hf://"
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def parse_hf_url(url: str) -> tuple[str, str | None]:
    """``hf://org/name@rev`` (or ``org/name@rev``) → ``("org/name", "rev")``; revision None when absent."""
    text = url[len(HF_SCHEME):] if url.startswith(HF_SCHEME) else url
    repo_id, sep, revision = text.partition("@")
    repo_id = repo_id.strip("/")
    if not _REPO_RE.match(repo_id) or (sep and not revision):
        raise CheckpointError(f"cannot read Hub location {url!r}: write hf://org/name or hf://org/name@revision")
    return repo_id, (revision or None)


def download_hybrid(url: str, revision: str | None = None, endpoint: str | None = None, token: str | None = None,
                    cache_dir: str | Path | None = None) -> Path:
    """Download a checkpoint repo (``hf://org/name[@revision]``) with ``snapshot_download``; returns its folder."""
    # imported here: huggingface_hub costs import time that local checkpoints never need
    from huggingface_hub import snapshot_download

    repo_id, url_revision = parse_hf_url(url)
    path = snapshot_download(repo_id, revision=revision or url_revision, endpoint=endpoint, token=token,
                             cache_dir=str(cache_dir) if cache_dir is not None else None)
    return Path(path)


def snapshot_blobs(snapshot: Path) -> Path | None:
    """The Hub cache's blobs folder that the files of a downloaded snapshot link into, or None for a plain folder.

    A snapshot lives at ``<repo cache>/snapshots/<commit>`` and its files are symlinks to ``<repo cache>/blobs/``;
    these links (and only these) are what ``load_hybrid`` follows in a checkpoint from the Hub.
    """
    snapshot = Path(snapshot)
    blobs = snapshot.parent.parent / "blobs"
    if snapshot.parent.name != "snapshots" or blobs.is_symlink() or not blobs.is_dir():
        return None
    return blobs
