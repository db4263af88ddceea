"""The swap's errors: a head swap that cannot be applied, and a bridge method that would skip the programs."""
from __future__ import annotations

from ...core import HeadsurgeonError


class SurgeryError(HeadsurgeonError, ValueError):
    """A head swap cannot be applied (bad head key, duplicate, program failing on a batch, KV-cache use)."""


class BypassError(SurgeryError, AttributeError):
    """A bridge method that would run the base model without the programs; the message names what to call."""
