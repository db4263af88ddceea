"""Hugging Face Hub: push a hybrid checkpoint to a repo, and resolve ``hf://org/name[@revision]`` for loading.

Thin on purpose: ``push_hybrid`` = ``save_hybrid`` into a temp dir + ``create_repo`` + ``upload_folder``;
``download_hybrid`` = ``snapshot_download``. The repo has exactly the local checkpoint layout, so
``load_hybrid`` verifies it the same way (every file's sha256, the trust policy for Python programs).
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

__all__ = ["push_hybrid", "download_hybrid", "parse_hf_url", "snapshot_blobs", "HF_SCHEME"]

HF_SCHEME = "hf://"
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[A-Za-z0-9][\w.\-]*)?$")


def parse_hf_url(url: str) -> tuple[str, str | None]:
    """``hf://org/name@rev`` (or ``org/name@rev``) → ``("org/name", "rev")``; revision None when absent."""
    from .checkpoint import CheckpointError

    text = url[len(HF_SCHEME):] if url.startswith(HF_SCHEME) else url
    repo_id, sep, revision = text.partition("@")
    repo_id = repo_id.strip("/")
    if not _REPO_RE.match(repo_id) or (sep and not revision):
        raise CheckpointError(f"cannot read Hub location {url!r}: write hf://org/name or hf://org/name@revision")
    return repo_id, (revision or None)


def download_hybrid(url: str, revision: str | None = None, endpoint: str | None = None, token: str | None = None,
                    cache_dir: str | Path | None = None) -> Path:
    """Download a checkpoint repo (``hf://org/name[@revision]``) with ``snapshot_download``; returns its folder."""
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


def push_hybrid(hybrid: Any, repo_id: str, token: str | None = None, private: bool = False,
                revision: str | None = None, metrics: Mapping[str, Any] | None = None, endpoint: str | None = None,
                programs: Any = None, commit_message: str | None = None) -> Any:
    """Save ``hybrid`` as a checkpoint and upload it to the Hub repo ``repo_id`` (created if needed).

    The repo ends up with exactly the checkpoint's files (stale files of an earlier push are deleted, except
    ``.gitattributes``). Returns huggingface_hub's CommitInfo (``.commit_url``, ``.oid``).
    """
    from huggingface_hub import HfApi

    from .checkpoint import save_hybrid

    repo_id, url_revision = parse_hf_url(repo_id)
    revision = revision or url_revision
    api = HfApi(endpoint=endpoint, token=token)
    location = f"{HF_SCHEME}{repo_id}" + (f"@{revision}" if revision else "")
    with tempfile.TemporaryDirectory(prefix="headsurgeon-push-") as tmp:
        folder = save_hybrid(hybrid, Path(tmp) / "checkpoint", metrics=metrics, programs=programs,
                             card_location=location)
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(repo_id=repo_id, folder_path=str(folder), revision=revision,
                                 commit_message=commit_message or "Upload hybrid checkpoint (headsurgeon)",
                                 delete_patterns="*")
