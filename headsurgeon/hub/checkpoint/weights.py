"""Model weights as a checkpoint sees them: the plain Hugging Face state dict, its fingerprint, what changed."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Mapping

import torch

from headsurgeon.surgery.models.headless import real_model
from headsurgeon.surgery.swap.weights import checkpoint_keys, plain_name

from .errors import CheckpointError

if TYPE_CHECKING:  # transformers takes seconds to import: named for the checker only
    from transformers import PreTrainedModel

__all__ = ["check_savable", "hf_state_dict", "weights_fingerprint", "differing_tensors"]


def check_savable(model: Any) -> None:
    """Refuse a bridge whose forward uses weights a Hugging Face checkpoint cannot hold (TransformerLens processing).

    ``enable_compatibility_mode()`` (TransformerLens 4) folds layer norms, centers the writing weights and the
    unembedding, unties GPT-2's embedding from its unembedding, adds an unembedding bias and gives the split
    q/k/v projections their own copies: the forward then reads tensors the model class has no slot for
    (tests/surgery/test_training.py shows the reload diverging), so no checkpoint of that class could reproduce it.
    """
    if getattr(model, "_weights_processed", False):
        raise CheckpointError(
            "this model's weights were processed by TransformerLens (enable_compatibility_mode() with its default "
            "fold_ln/centering, or process_weights()): its forward uses folded weights and an unembedding bias "
            "that a Hugging Face checkpoint cannot hold, so the saved hybrid would not reproduce it. Train and save "
            "on a model loaded without weight processing (load_model(...) as is, or "
            "enable_compatibility_mode(no_processing=True) for the legacy hook names only)"
        )


def hf_state_dict(hf_model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of a (bridged) model, under the plain transformers key names.

    TransformerBridge wraps the HF modules in place (``..._original_component...`` keys, plus aliases);
    the canonical names are those of a fresh, empty model of the same class built on the meta device.
    """
    hf_model = real_model(hf_model)  # a headless encoder's fixed readout is not part of its weights
    raw = hf_model.state_dict()
    wanted = checkpoint_keys(hf_model)
    wanted_set = set(wanted)
    found: dict[str, torch.Tensor] = {}
    for key, value in raw.items():
        name = plain_name(key)
        if name in wanted_set and name not in found:
            found[name] = value
    missing = [k for k in wanted if k not in found]
    if missing:
        raise CheckpointError(
            f"cannot find {len(missing)} weights of this {type(hf_model).__name__} (e.g. {missing[:3]}) inside the "
            "bridged model; this model layout is not supported by hybrid checkpoints"
        )
    return {k: found[k] for k in wanted}


def weights_fingerprint(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over sorted (name, dtype, shape, bytes) of a state dict: identifies the exact weights."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        h.update(f"{key}\0{str(t.dtype)}\0{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def differing_tensors(current: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of tensors that differ (values, dtype or shape; keys present in only one count too)."""
    out = sorted(set(current) ^ set(base))
    for key in sorted(set(current) & set(base)):
        a, b = current[key].detach().to("cpu"), base[key].detach().to("cpu")
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            out.append(key)
    return out
