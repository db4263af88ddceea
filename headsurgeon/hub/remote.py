"""Hugging Face Hub: push a hybrid checkpoint to a repo, and resolve ``hf://org/name[@revision]`` for loading.

Thin on purpose: ``push_hybrid`` = ``save_hybrid`` into a temp dir + ``create_repo`` + ``upload_folder``;
``download_hybrid`` = ``snapshot_download``. The repo has exactly the local checkpoint layout, so
``load_hybrid`` verifies it the same way (every file's sha256, the trust policy for Python programs).
This module sits above headsurgeon/hub/checkpoint/ (which holds the Hub locations ``load_hybrid`` reads); the
checkpoint package never imports it.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

from headsurgeon.surgery.swap.hybrid import HybridModel
from headsurgeon.synth.programset import ProgramSet

from .checkpoint import save_hybrid
from .checkpoint.location import HF_SCHEME, download_hybrid, parse_hf_url, snapshot_blobs

__all__ = ["push_hybrid", "download_hybrid", "parse_hf_url", "snapshot_blobs", "HF_SCHEME"]


def push_hybrid(hybrid: HybridModel, repo_id: str, token: str | None = None, private: bool = False,
                revision: str | None = None, metrics: Mapping[str, Any] | None = None, endpoint: str | None = None,
                programs: ProgramSet | None = None, commit_message: str | None = None) -> Any:
    """Save ``hybrid`` as a checkpoint and upload it to the Hub repo ``repo_id`` (created if needed).

    The repo ends up with exactly the checkpoint's files (stale files of an earlier push are deleted, except
    ``.gitattributes``). Returns huggingface_hub's CommitInfo (``.commit_url``, ``.oid``).
    """
    # imported here: huggingface_hub costs import time that saving and loading locally never need
    from huggingface_hub import HfApi

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
