"""The errors of hybrid checkpoints: one base class, and one subclass per way a checkpoint can be unusable.

Each message names the file and the fix; the CLI prints them as one line (headsurgeon/cli/__init__.py).
"""
from __future__ import annotations
from ...core import HeadsurgeonError
from ...core.formats import FutureFormatError
from ...synth.trust import UntrustedProgramError  # the one trust gate's error (headsurgeon/synth/trust.py)

__all__ = ["CheckpointError", "NotACheckpointError", "IntegrityError", "FormatVersionError", "BaseModelError",
           "UntrustedProgramError"]


class CheckpointError(HeadsurgeonError, ValueError):
    """A hybrid checkpoint cannot be saved or loaded; the message names the file and the fix."""


class NotACheckpointError(CheckpointError):
    """The path is not a headsurgeon hybrid checkpoint (no or foreign manifest.json)."""


class IntegrityError(CheckpointError):
    """A file is missing, truncated, modified after saving, or not listed in the manifest."""


class FormatVersionError(CheckpointError, FutureFormatError):
    """The checkpoint was written by a newer headsurgeon with a format this version cannot read."""


class BaseModelError(CheckpointError):
    """The base model the checkpoint refers to is missing or is not the one it was saved on."""
