"""Whether a backend honours an edited ``hook_pattern``: measured once per handle, it picks the hybrid's mode."""
from __future__ import annotations

import warnings

import torch

from ..models.loading import ModelHandle


def pattern_edits_take_effect(handle: ModelHandle) -> bool:
    """Whether this backend uses an edited hook_pattern (TransformerBridge on BERT does not)."""
    if handle.pattern_edits is not None:
        return handle.pattern_edits
    ids = torch.tensor([[handle.bos_id or 0, 1 % handle.vocab_size, 2 % handle.vocab_size]], device=handle.device)
    hp = handle.model.hook_dict[handle.pattern_hook(0)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = handle.model(ids)
        h = hp.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
        try:
            edited = handle.model(ids)
        finally:
            h.remove()
    works = not torch.equal(base, edited)
    handle.pattern_edits = works
    return works
