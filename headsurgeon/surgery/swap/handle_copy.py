"""An independent copy of a model handle: its own weights and healing records, the tokenizer shared."""
from __future__ import annotations

import copy as _copy
import dataclasses
from typing import Any

import torch

from ..models.loading import ModelHandle


def independent_handle(handle: ModelHandle) -> ModelHandle:
    """A handle whose model is a deep copy (own weights) with the healing records of those weights
    (headsurgeon/surgery/swap/heal.py); the tokenizer is shared."""
    # after a forward under autograd the bridge keeps non-leaf activations on its modules (an attention's last
    # ``_pattern``), which torch refuses to deep-copy: the copy gets them detached
    memo: dict[int, Any] = {id(v): v.detach() for m in handle.model.modules() for v in vars(m).values()
                            if isinstance(v, torch.Tensor) and not v.is_leaf}
    model = _copy.deepcopy(handle.model, memo)
    copied = dataclasses.replace(handle, model=model, hf_model=getattr(model, "original_model", None))
    copied.healing = _copy.deepcopy(handle.healing)
    return copied
