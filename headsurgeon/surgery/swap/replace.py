"""replace_heads: swap query heads' attention for programs, per head, before values mix; returns a HybridModel.

The swap's parts live beside this module: the hybrid (headsurgeon/surgery/swap/hybrid.py), its heads
(headsurgeon/surgery/swap/program_head.py) and errors (headsurgeon/surgery/swap/errors.py). Their names are exported
here too, so ``from headsurgeon.surgery.swap.replace import ...`` reaches the whole swap.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Mapping

from ...synth.trust import TrustPrograms
from ...kernels.cache import TensorCache
from ...synth.program import Program
from ...synth.programset import ProgramMap, ProgramSet
from ...synth.vocab import Vocabulary, VocabularyError
from .batch_patterns import BATCH_CACHE_BYTES
from .errors import BypassError, SurgeryError
from .handle_copy import independent_handle
from .hybrid import HybridModel
from ..models.loading import ModelHandle, load_model
from .pattern_edits import pattern_edits_take_effect
from .program_head import ProgramHead
from ...core import WHICHES, Head, Which

__all__ = ["BATCH_CACHE_BYTES", "BypassError", "HybridModel", "ProgramHead", "SurgeryError", "independent_handle",
           "pattern_edits_take_effect", "replace_heads"]


def _normalize_programs(handle: ModelHandle, programs: Mapping[Any, Any] | Any) -> dict[Head, Any]:
    items = programs.items() if isinstance(programs, Mapping) else getattr(programs, "items", lambda: None)()
    if items is None:
        raise SurgeryError("programs must map heads ('L3H5' or (3, 5)) to programs, or be a ProgramSet")
    out: dict[Head, Any] = {}
    for key, program in items:
        head = Head.parse(key)
        try:
            handle.check_head(*head)
        except IndexError as e:
            raise SurgeryError(str(e)) from e
        if head in out:
            raise SurgeryError(f"head {Head.label(head)} is given twice ({key!r}); keep one program per head")
        out[head] = program
    if not out:
        raise SurgeryError("no heads to replace: programs is empty")
    return out


def _from_programset(handle: ModelHandle, programs: ProgramSet, which: Which) -> dict[Head, Program]:
    """The ProgramSet's programs of kind ``which``, after checking it was made with this model's tokenizer."""
    fingerprint = programs.vocab_fingerprint
    if fingerprint:
        if handle.tokenizer is None:
            warnings.warn(f"{handle.name} has no tokenizer: cannot check that these programs were selected with "
                          f"its vocabulary (fingerprint {fingerprint[:12]})")
        else:
            try:
                Vocabulary.from_tokenizer(handle.tokenizer).check(fingerprint)
            except VocabularyError as e:
                raise SurgeryError(f"{handle.name}'s tokenizer is not the one this program set was selected with: "
                                   f"{e}") from e
    chosen = programs.programs(which)
    missing = [Head.label(h) for h in programs.keys() if h not in chosen]
    if missing:
        warnings.warn(f"{len(missing)} head(s) have no {which} and keep their neural attention: {', '.join(missing)}")
    return chosen


def replace_heads(model: Any, programs: ProgramSet | ProgramMap | str | Path, alpha: float | Mapping[Any, float] = 1.0,
                  cache: TensorCache | None = None, which: Which = "replacement", copy: bool = False,
                  trust_programs: TrustPrograms = False, batch_cache_bytes: int | None = None, fused: bool = True) -> HybridModel:
    """Swap the given heads' attention for programs; returns a HybridModel (also a context manager).

    ``programs`` maps ``(layer, head)`` or ``"L3H5"`` to a Program, DSL text, program JSON or a pattern
    provider; a ProgramSet works too: ``which="replacement"`` (default) swaps in each head's most faithful
    program, ``which="explanation"`` its readable one (heads without one stay neural, with a warning); a
    ProgramSet selected with another tokenizer is refused. ``alpha`` (per head via a mapping) blends neural
    (0) and program (1). The programs apply only inside the hybrid's own calls; the hybrid shares the
    model's weights (``model = replace_heads(model, ...)`` in training code trains them) unless
    ``copy=True``, which gives the hybrid its own deep copy of the model. A ProgramSet read from a file (or a
    programs.json path) is someone else's: its Python programs, in any slot, run only with ``trust_programs=True``
    or their hashes (headsurgeon/synth/trust.py); programs you built in this process need no trust.
    ``batch_cache_bytes``: the most the per-batch pattern cache holds (default ``BATCH_CACHE_BYTES``, 256 MiB;
    a hybrid made from another keeps its cap), so a repeated batch costs a lookup and long contexts stay bounded.
    ``fused``: a call that nobody watches (no hooks, no ``run_with_cache``) runs the transformers model with the
    neural heads through fused SDPA and the replaced heads as ``pattern · V``, computing no Q·Kᵀ or softmax for
    them (headsurgeon/surgery/swap/fast_attention.py); the same logits as the hooked path within float tolerance. ``False`` (or
    ``hybrid.fused = False``) always runs the hooked path.
    """
    if isinstance(programs, (str, os.PathLike)):
        programs = ProgramSet.load(programs)
    if isinstance(programs, ProgramSet):  # the one trust gate (headsurgeon/synth/trust.py), before anything is built
        programs = programs.trusted(trust_programs)
    if which not in WHICHES:
        raise SurgeryError(f"which must be 'replacement' or 'explanation', got {which!r}")
    if which != "replacement" and not isinstance(programs, ProgramSet):
        raise SurgeryError(f"which={which!r} needs a ProgramSet (a plain mapping holds one program per head)")
    base_heads: dict[Head, Any] = {}
    if isinstance(model, HybridModel):
        base_heads = {k: ph.provider for k, ph in ((Head.parse(n), ph) for n, ph in model.program_heads.items())}
        alphas_old = {Head.parse(n): ph.alpha for n, ph in model.program_heads.items()}
        cache = cache or model.cache
        handle = model.handle
        model.restore()
    else:
        alphas_old = {}
        handle = load_model(model)
    if copy:
        handle = independent_handle(handle)
    program_set = programs if isinstance(programs, ProgramSet) else getattr(model, "program_set", None)
    if isinstance(programs, ProgramSet):
        programs = _from_programset(handle, programs, which)
    heads = _normalize_programs(handle, programs)
    dup = set(heads) & set(base_heads)
    if dup:
        raise SurgeryError(f"heads {[Head.label(h) for h in sorted(dup)]} are already replaced in this hybrid")
    cache = cache if cache is not None else TensorCache(max_bytes=256 << 20)
    alpha_of = ({Head.parse(k): float(v) for k, v in alpha.items()} if isinstance(alpha, Mapping) else {})
    modules = {h: ProgramHead(*h, src, alphas_old.get(h, 1.0), cache) for h, src in base_heads.items()}
    for h, src in heads.items():
        modules[h] = ProgramHead(*h, src, alpha_of.get(h, alpha if not isinstance(alpha, Mapping) else 1.0), cache)
    if batch_cache_bytes is None:
        batch_cache_bytes = model._batch_cache_bytes if isinstance(model, HybridModel) else BATCH_CACHE_BYTES
    if isinstance(batch_cache_bytes, bool) or not isinstance(batch_cache_bytes, int) or batch_cache_bytes < 0:
        raise SurgeryError(f"batch_cache_bytes must be a whole number of bytes >= 0; got {batch_cache_bytes!r}")
    hybrid = HybridModel(handle, modules, cache, batch_cache_bytes, fused)
    hybrid.program_set = program_set  # scores and glosses for save_hybrid's manifest and card
    return hybrid
