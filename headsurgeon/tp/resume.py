"""Training state saved after every epoch (weights, Adam moments, RNG streams, history), so a killed run resumes.

One safetensors file holds the tensors and, in its metadata, the JSON bookkeeping, written atomically
(headsurgeon/core/fileio.py): a run killed mid-write keeps the previous epoch's state whole. Resuming restores every
random stream, so a resumed run ends bit-for-bit where an uninterrupted one would.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors, save_file

from ..core.fileio import atomic_path, json_default, read_bounded

__all__ = ["STATE_FILE", "save_state", "load_state"]

STATE_FILE = "train_state.safetensors"


def save_state(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator,
               info: dict[str, Any]) -> None:
    """Write the state after a finished epoch (``info``: epoch, step, history, config fingerprint)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    opt_state = opt.state_dict()
    for index, state in opt_state["state"].items():
        for name, value in state.items():
            tensors[f"opt.{index}.{name}"] = torch.as_tensor(value).contiguous()
    tensors["rng.generator"] = gen.get_state()
    tensors["rng.global"] = torch.get_rng_state()
    meta = {"info": json.dumps({**info, "param_groups": opt_state["param_groups"]}, default=json_default)}
    with atomic_path(folder / STATE_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=meta)


#: the largest model.safetensors / state.safetensors read from a run folder (no links or devices, size first)
MAX_WEIGHTS_BYTES = 4 << 30


def load_state(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
               gen: torch.Generator) -> dict[str, Any] | None:
    """Restore the saved state into ``model``, ``opt`` and the RNGs; returns its info, or None when there is none."""
    if not (folder / STATE_FILE).is_file():
        return None
    data = read_bounded(folder / STATE_FILE, MAX_WEIGHTS_BYTES, "a run's training state")  # no links, size first
    header = int.from_bytes(data[:8], "little")
    info = json.loads(json.loads(data[8:8 + header])["__metadata__"]["info"])
    tensors = load_tensors(data)
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    opt.load_state_dict({"state": state, "param_groups": info.pop("param_groups")})
    gen.set_state(tensors["rng.generator"])
    torch.set_rng_state(tensors["rng.global"])
    return info
