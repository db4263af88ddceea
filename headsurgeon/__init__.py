"""headsurgeon: explain attention heads with executable programs and swap heads for them.

The pipeline's names live here (``hs.load_model``, ``hs.capture``, ``hs.explain``, ``hs.replace_heads``,
``hs.build_hybrid``, ...), loaded lazily so ``import headsurgeon`` stays fast; everything else is imported from its
module (``from headsurgeon.synth.metrics import soft_iou``).
"""
from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from .core.lazy import exports_of
from .surgery.threads import prefer_passive_waits

__version__ = "0.1.0"

prefer_passive_waits()  # before torch loads OpenMP: waiting threads sleep (headsurgeon/surgery/threads.py)

if TYPE_CHECKING:  # the one list of top-level names, read by type checkers and by headsurgeon/core/lazy.py
    from .build import build_hybrid
    from .configs import (
        BuildConfig, CaptureConfig, CorpusConfig, ExplainConfig, MeasureConfig, ModelConfig, ScaleoutConfig, SearchConfig,
    )
    from .demo import run_demo
    from .hub.checkpoint import load_hybrid, save_hybrid
    from .hub.remote import push_hybrid
    from .hub.zoo import demo_corpus_path
    from .core import Head, HeadsurgeonError
    from .pipeline import explain
    from .surgery.measure.ablate import ablate
    from .surgery.batches import batches
    from .surgery.patterns.capture import capture
    from .surgery.corpus import load_corpus, make_sequences, Splits
    from .surgery.measure.downstream import downstream
    from .surgery.measure.eval_report import evaluate_programs
    from .surgery.measure.evaluate import perplexity
    from .surgery.measure.head_costs import head_costs
    from .surgery.measure.head_finders import head_scores
    from .surgery.swap.heal import heal
    from .surgery.models.loading import load_model
    from .surgery.swap.hybrid import HybridModel
    from .surgery.swap.refit import refit_mixtures
    from .surgery.swap.replace import replace_heads
    from .surgery.measure.score import score
    from .surgery.patterns.store import AttentionStore
    from .synth.eaps import load_library_file, read_library
    from .synth.program import Program
    from .synth.programset import ProgramSet
    from .synth.search.enumerative import enumerative_search
    from .synth.select import select_programs


_EXPORTS = exports_of(__file__, __name__)
#: names that were top-level before the surface had two levels: they still resolve, with a DeprecationWarning naming
#: the module to import them from
_MOVED = {
    "AgentConfig": "headsurgeon.synth.search.llm",
    "BuildResult": "headsurgeon.build",
    "compute_features": "headsurgeon.synth.features",
    "embedding_distance": "headsurgeon.surgery.measure.embedding",
    "EvalReport": "headsurgeon.surgery.measure.eval_report",
    "FeatureView": "headsurgeon.synth.features",
    "HeadCosts": "headsurgeon.surgery.measure.head_costs",
    "HeadScores": "headsurgeon.surgery.measure.head_finders",
    "HealReport": "headsurgeon.surgery.swap.heal",
    "jsd_distance": "headsurgeon.synth.metrics",
    "learned_search": "headsurgeon.synth.search.learned",
    "LibraryProgram": "headsurgeon.synth.eaps",
    "LLMAgent": "headsurgeon.synth.search.llm",
    "ModelHandle": "headsurgeon.surgery.models.loading",
    "ModelLoadError": "headsurgeon.surgery.models.loading",
    "ModelSource": "headsurgeon.surgery.models.sources",
    "normalize_scores": "headsurgeon.kernels.normalize",
    "order_heads": "headsurgeon.surgery.measure.sweep_order",
    "padded_batch": "headsurgeon.surgery.batches",
    "per_head_delta_ppl": "headsurgeon.surgery.measure.evaluate",
    "probe_sequences": "headsurgeon.surgery.measure.head_finders",
    "program_tensors": "headsurgeon.synth.tensors",
    "ProgramHead": "headsurgeon.surgery.swap.program_head",
    "read_documents": "headsurgeon.surgery.corpus",
    "RealPatterns": "headsurgeon.synth.metrics",
    "RefitResult": "headsurgeon.surgery.swap.refit",
    "register_model_source": "headsurgeon.surgery.models.sources",
    "register_searcher": "headsurgeon.synth.search",
    "replacement_sweep": "headsurgeon.surgery.measure.evaluate",
    "run_searchers": "headsurgeon.synth.search",
    "SandboxPool": "headsurgeon.synth.sandbox",
    "score_many": "headsurgeon.synth.metrics",
    "ScoredProgram": "headsurgeon.synth.scored",
    "Scores": "headsurgeon.core.scores",
    "Searcher": "headsurgeon.synth.search",
    "searchers": "headsurgeon.synth.search",
    "SearchSettings": "headsurgeon.synth.search",
    "sentence_embeddings": "headsurgeon.surgery.measure.embedding",
    "Sequence": "headsurgeon.synth.sequence",
    "soft_iou": "headsurgeon.synth.metrics",
    "spearman_ci": "headsurgeon.surgery.measure.evaluate",
    "split_sequences": "headsurgeon.surgery.corpus",
    "TensorCache": "headsurgeon.kernels.cache",
    "topq_iou": "headsurgeon.synth.metrics",
    "Vocabulary": "headsurgeon.synth.vocab",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None and name in _MOVED:
        module = _MOVED[name]
        warnings.warn(f"hs.{name} is no longer a top-level name: use `from {module} import {name}`",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module), name)
    if module is None:
        raise AttributeError(f"module 'headsurgeon' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
