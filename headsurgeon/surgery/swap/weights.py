"""Which parameters healing trains (headsurgeon/surgery/swap/heal.py): each of a model's parameters once, under its
checkpoint name and every alias (bridge and TransformerLens names), chosen by ``"norms"`` or glob patterns."""
from __future__ import annotations

import copy
import fnmatch
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...core import InputError
from ..models.handle import ModelHandle
from ..models.headless import real_model

if TYPE_CHECKING:  # transformers takes seconds to import: named for the checker only
    from transformers import PreTrainedModel

__all__ = ["NORMS", "Weight", "checkpoint_keys", "element_count", "families", "model_weights", "plain_name",
           "select_weights"]

NORMS = "norms"  # the keyword for every normalization layer's gain (and bias) vectors
_NORM_CLASS = re.compile(r"norm$", re.IGNORECASE)  # LayerNorm, RMSNorm, LlamaRMSNorm, Gemma3RMSNorm, T5LayerNorm
_NORM_NAME = re.compile(r"^(ln\w*|\w*norm)$", re.IGNORECASE)  # ln1, ln_f, ln_final, input_layernorm, norm, q_norm
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


@dataclass(frozen=True)
class Weight:
    """One parameter of a model, once: its display name (the checkpoint's weight name where it has one) and every
    other name it goes by (bridge aliases, TransformerLens names), with ``_original_component`` removed."""

    name: str
    aliases: tuple[str, ...]
    param: torch.nn.Parameter
    trainable: bool  # part of the weights a checkpoint stores (False: a headless encoder's fixed readout)


def plain_name(name: str) -> str:
    """A parameter name without the bridge's ``_original_component`` steps: the transformers name."""
    return name.replace("._original_component", "").replace("_original_component.", "")


def checkpoint_keys(hf_model: PreTrainedModel) -> list[str]:
    """The state-dict keys of a fresh model of the same class (built on the meta device, so no memory): the names a
    checkpoint of this model holds, in its order. Raises what the class raises when it cannot be rebuilt so."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(type(hf_model)(copy.deepcopy(hf_model.config)).state_dict())


def _names_by_param(module: torch.nn.Module) -> dict[int, list[str]]:
    """Every plain name of each parameter under ``module`` (aliases included), by parameter identity, in order.

    Walks the modules, not ``named_parameters``: TransformerBridge reports its parameters under the HF names only,
    while its own tree (``blocks.0.ln1``, TransformerLens' names) holds the same parameters too."""
    out: dict[int, list[str]] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for key, p in m.named_parameters(recurse=False):
            names = out.setdefault(id(p), [])
            name = plain_name(f"{prefix}.{key}" if prefix else key)
            if name not in names:
                names.append(name)
    return out


def model_weights(handle: ModelHandle) -> list[Weight]:
    """Each parameter of the handle's model once, in the model's order, under its checkpoint name where it has one."""
    model = handle.model
    root = real_model(handle.hf_model) if handle.hf_model is not None else model
    canonical: set[str] = set()
    if handle.hf_model is not None:
        try:
            canonical = set(checkpoint_keys(root))
        except Exception:  # not a transformers class that rebuilds from its config: the plain names serve
            canonical = set()
    under_root, everywhere = _names_by_param(root), _names_by_param(model)
    params = {id(p): p for m in (model, root) for sub in m.modules() for p in sub.parameters(recurse=False)}
    order = list(under_root) + [i for i in everywhere if i not in under_root]
    weights = []
    for i in order:
        names = under_root.get(i, []) + [n for n in everywhere.get(i, []) if n not in under_root.get(i, [])]
        name = next((n for n in names if n in canonical), names[0])
        weights.append(Weight(name, tuple(n for n in names if n != name), params[i], i in under_root))
    return weights


def _is_norm(name: str, module: torch.nn.Module) -> bool:
    """A normalization layer holding gain (and bias) vectors: by class (…Norm) or by name (ln1, ln_f, *_layernorm)."""
    own = list(module.parameters(recurse=False))
    if not own or any(p.ndim != 1 for p in own):
        return False
    last = [part for part in name.split(".") if part != "_original_component"][-1:] or [""]
    return bool(_NORM_CLASS.search(type(module).__name__) or _NORM_NAME.match(last[0]))


def _norm_ids(handle: ModelHandle) -> set[int]:
    """Identities of every normalization layer's parameters (a module met under several names counts once)."""
    return {id(p) for name, m in handle.model.named_modules(remove_duplicate=False) if _is_norm(name, m)
            for p in m.parameters(recurse=False)}


def families(weights: list[Weight]) -> list[str]:
    """The weight names with layer numbers as ``*`` (``model.layers.*.input_layernorm.weight``), each once."""
    return list(dict.fromkeys(_LAYER_INDEX.sub("*", w.name) for w in weights if w.trainable))


def _matches(pattern: str, weight: Weight) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in (weight.name, *weight.aliases))


def select_weights(handle: ModelHandle, params: str | list[str] | tuple[str, ...]) -> list[Weight]:
    """The weights ``params`` names: ``"norms"`` and/or glob patterns over parameter names, in model order."""
    specs = [params] if isinstance(params, str) else list(params) if isinstance(params, (list, tuple)) else None
    if not specs or not all(isinstance(s, str) and s for s in specs):
        raise InputError(f"params must be 'norms' or a list of parameter-name patterns (globs such as "
                         f"'model.layers.*.mlp.*'), got {params!r}")
    weights = [w for w in model_weights(handle) if w.trainable]
    chosen: set[int] = set()
    for spec in specs:
        ids = _norm_ids(handle) if spec == NORMS else set()
        found = {id(w.param) for w in weights if id(w.param) in ids or (spec != NORMS and _matches(spec, w))}
        if not found:
            raise InputError(_unknown(spec, handle, weights))
        chosen |= found
    return [w for w in weights if id(w.param) in chosen]


def _unknown(spec: str, handle: ModelHandle, weights: list[Weight]) -> str:
    """The message for a selection that names no parameter: what exists, and how to write it."""
    fams = families(weights)
    shown = ", ".join(fams[:40]) + (f", ... ({len(fams) - 40} more)" if len(fams) > 40 else "")
    what = "has no normalization layer with parameters" if spec == NORMS else f"has no parameter matching {spec!r}"
    return (f"{handle.name} {what}; pass 'norms' or glob patterns over these parameter families: {shown}")


def element_count(tensors: list[torch.Tensor]) -> int:
    """Numbers held by ``tensors``, each element of a shared storage counted once (GPT-2's q/k/v views of c_attn)."""
    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in tensors:
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    total = 0
    for group in by_storage.values():
        if len(group) == 1:
            total += group[0].numel()
            continue
        seen = torch.zeros(group[0].untyped_storage().nbytes() // group[0].element_size(), dtype=torch.bool)
        for t in group:
            seen.as_strided(t.shape, t.stride(), t.storage_offset()).fill_(True)
        total += int(seen.sum())
    return total
