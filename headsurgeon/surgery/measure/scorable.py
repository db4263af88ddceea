"""Which models lm-eval's tasks can score: they need token likelihoods from a causal language-model head."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...core import InputError

if TYPE_CHECKING:  # surgery/models/handle.py imports torch, which this module does without
    from ..models.handle import ModelHandle

__all__ = ["require_lm_head"]


def require_lm_head(handle: ModelHandle) -> None:
    """lm-eval's tasks score token likelihoods: refuse, with the alternative, models that cannot give them."""
    if not handle.has_lm_head:
        raise InputError(f"{handle.name} is an encoder without a language-model head, so lm-eval tasks cannot score "
                         "it: measure a swap by embedding distance instead (headsurgeon eval without --tasks)")
    if not handle.causal:
        raise InputError(f"{handle.name} is a masked language model; lm-eval's tasks (loglikelihood, rolling "
                         "loglikelihood, generation) need a causal LM, and none of them scores masked LMs: measure "
                         "a swap by its masked-token pseudo-perplexity instead (headsurgeon eval without --tasks)")
