"""Embedded weights: write a model's safetensors, config and tokenizer into a checkpoint, and load them back.

No pickle: weights are safetensors, the config and tokenizer are JSON/text, and nothing is loaded with
remote code.
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from headsurgeon.core.fileio import fsync_file
from headsurgeon.surgery.models.handle import EmbeddedSource
from headsurgeon.surgery.models.loading import load_model
from headsurgeon.synth.errors import excerpt

from .errors import CheckpointError, IntegrityError
from .layout import FORMAT, WEIGHTS, write_file

__all__ = ["write_embedded", "load_embedded"]


def write_embedded(tmp: Path, hf: Any, tokenizer: Any, state: Mapping[str, torch.Tensor]) -> None:
    """model.safetensors (plain HF names, shared tensors un-shared), config.json and the tokenizer files."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for key, value in state.items():
        t = value.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in storages or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()  # safetensors refuses shared storage (tied embeddings, views): store a copy
        storages.add(t.untyped_storage().data_ptr())
        tensors[key] = t
    save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt", "producer": FORMAT})
    fsync_file(tmp / WEIGHTS)
    config = copy.deepcopy(hf.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(hf).__name__]
    write_file(tmp / "config.json", config.to_json_string(use_diff=True).encode("utf-8"))
    if tokenizer is None or not hasattr(tokenizer, "save_pretrained"):
        raise CheckpointError("the model's tokenizer cannot be saved (no save_pretrained); embedded checkpoints "
                              "need a transformers tokenizer")
    before = {p for p in tmp.rglob("*")}
    _as_trained(tokenizer).save_pretrained(str(tmp))
    for p in set(tmp.rglob("*")) - before:
        if p.is_file():
            fsync_file(p)


def load_embedded(root: Path, manifest: Mapping[str, Any], device: str | torch.device) -> Any:
    """A ModelHandle of the weights, config and tokenizer stored in the checkpoint itself."""
    for need in (WEIGHTS, "config.json"):
        if need not in manifest["files"]:
            raise IntegrityError(f"the manifest says the weights are embedded but lists no {need}")
    _check_safetensors(root)
    try:
        hf, tokenizer = _from_pretrained(root, manifest)
    except CheckpointError:
        raise
    except Exception as e:  # transformers / tokenizers / safetensors raise many types for a damaged folder
        raise CheckpointError(f"cannot load the embedded model in {root} (config.json, {WEIGHTS}, tokenizer files): "
                              f"{type(e).__name__}: {excerpt(str(e), 300)}; download or save the checkpoint "
                              "again") from None
    handle = load_model(hf.eval(), tokenizer=tokenizer, device=device)
    handle.name = str(manifest.get("config", {}).get("name") or handle.name)
    handle.source = EmbeddedSource(str(root), manifest["weights"].get("sha256"), manifest["base"].get("original"))
    return handle


def _check_safetensors(root: Path) -> None:
    """Open model.safetensors' header with safetensors itself, so a damaged file is named, not a raw SafetensorError."""
    try:
        with safe_open(str(root / WEIGHTS), "pt") as f:
            names = list(f.keys())
            for name in names[:1]:
                f.get_slice(name)
    except Exception as e:  # SafetensorError, OSError, ValueError: all mean the same damaged file
        raise IntegrityError(f"{WEIGHTS} in {root} is not a valid safetensors file ({type(e).__name__}: "
                             f"{excerpt(str(e), 300)}); the weights are damaged: download or save the checkpoint "
                             "again") from None


def _from_pretrained(root: Path, manifest: Mapping[str, Any]) -> tuple[Any, Any]:
    """The embedded Hugging Face model and tokenizer (no remote code, safetensors only)."""
    # imported here: transformers takes seconds to import and only this path needs it
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = AutoConfig.from_pretrained(str(root), trust_remote_code=False)
        arch = (getattr(config, "architectures", None) or [None])[0]
        cls = getattr(transformers, str(arch), None) if arch else None
        if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
            raise CheckpointError(f"config.json names architecture {excerpt(arch)}, which this transformers "
                                  f"({transformers.__version__}) does not provide as a model class")
        dtype = getattr(torch, str(manifest["weights"].get("dtype") or "float32"), None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"the manifest's weights.dtype {excerpt(manifest['weights'].get('dtype'))} is not "
                                  "a torch dtype; save the checkpoint again")
        model_class: Any = cls  # a PreTrainedModel subclass, checked above
        hf = model_class.from_pretrained(str(root), config=config, use_safetensors=True, attn_implementation="eager",
                                 dtype=dtype, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(str(root), trust_remote_code=False)
    return hf, tokenizer


def _as_trained(tokenizer: Any) -> Any:
    """The tokenizer without special tokens its vocabulary lacks (TransformerLens names ``<|endoftext|>`` as a
    BERT tokenizer's EOS/BOS): saved as they are, they would reload as a new token the model cannot embed."""
    missing = [a for a in ("eos_token", "bos_token", "pad_token")
               if getattr(tokenizer, a, None) is not None and getattr(tokenizer, a) not in tokenizer.get_vocab()]
    if not missing:
        return tokenizer
    clean = copy.deepcopy(tokenizer)
    for attribute in missing:
        setattr(clean, attribute, None)
    return clean
