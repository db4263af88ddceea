"""headsurgeon: explain attention heads with executable programs and swap heads for them.

The public API is re-exported here lazily (``import headsurgeon`` stays fast)::

    hs.load_model, hs.load_corpus, hs.capture, hs.Program, hs.replace_heads, hs.perplexity, ...
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # surgery: live models
    "load_model": "headsurgeon.surgery.loading", "ModelHandle": "headsurgeon.surgery.loading",
    "ModelLoadError": "headsurgeon.surgery.loading",
    "read_documents": "headsurgeon.surgery.corpus", "make_sequences": "headsurgeon.surgery.corpus",
    "split_sequences": "headsurgeon.surgery.corpus", "load_corpus": "headsurgeon.surgery.corpus",
    "Splits": "headsurgeon.surgery.corpus",
    "capture": "headsurgeon.surgery.capture", "embedding_distance": "headsurgeon.surgery.embedding",
    "sentence_embeddings": "headsurgeon.surgery.embedding", "score": "headsurgeon.surgery.score", "padded_batch": "headsurgeon.surgery.batches",
    "batches": "headsurgeon.surgery.batches", "AttentionStore": "headsurgeon.surgery.store",
    "ProgramHead": "headsurgeon.surgery.replace", "replace_heads": "headsurgeon.surgery.replace",
    "HybridModel": "headsurgeon.surgery.replace", "ablate": "headsurgeon.surgery.ablate",
    "perplexity": "headsurgeon.surgery.evaluate", "per_head_delta_ppl": "headsurgeon.surgery.evaluate",
    "replacement_sweep": "headsurgeon.surgery.evaluate", "downstream": "headsurgeon.surgery.downstream",
    "evaluate_programs": "headsurgeon.surgery.eval_report", "EvalReport": "headsurgeon.surgery.eval_report",
    "order_heads": "headsurgeon.surgery.sweep_order",
    "head_scores": "headsurgeon.surgery.head_finders", "HeadScores": "headsurgeon.surgery.head_finders",
    "probe_sequences": "headsurgeon.surgery.head_finders",
    "head_costs": "headsurgeon.surgery.head_costs", "HeadCosts": "headsurgeon.surgery.head_costs",
    "heal": "headsurgeon.surgery.heal", "HealReport": "headsurgeon.surgery.heal",
    "refit_mixtures": "headsurgeon.surgery.refit", "RefitResult": "headsurgeon.surgery.refit",
    "build_hybrid": "headsurgeon.build", "BuildResult": "headsurgeon.build",
    # synth: programs
    "Sequence": "headsurgeon.synth.sequence", "Program": "headsurgeon.synth.program",
    "ProgramSet": "headsurgeon.synth.programset", "program_tensors": "headsurgeon.synth.tensors",
    "enumerative_search": "headsurgeon.synth.search.enumerative",
    "learned_search": "headsurgeon.synth.search.learned",
    "select_programs": "headsurgeon.synth.select", "ScoredProgram": "headsurgeon.synth.scored",
    "Scores": "headsurgeon.kernels.scores",
    "LLMAgent": "headsurgeon.synth.search.llm", "AgentConfig": "headsurgeon.synth.search.llm",
    "Searcher": "headsurgeon.synth.search", "SearchSettings": "headsurgeon.synth.search",
    "register_searcher": "headsurgeon.synth.search", "searchers": "headsurgeon.synth.search",
    "run_searchers": "headsurgeon.synth.search", "register_model_source": "headsurgeon.surgery.sources",
    "ModelSource": "headsurgeon.surgery.sources",
    "FeatureView": "headsurgeon.synth.features", "compute_features": "headsurgeon.synth.features",
    "SandboxPool": "headsurgeon.synth.sandbox", "normalize_scores": "headsurgeon.kernels.normalize",
    "TensorCache": "headsurgeon.kernels.cache", "soft_iou": "headsurgeon.synth.metrics",
    "jsd_distance": "headsurgeon.synth.metrics", "score_many": "headsurgeon.synth.metrics",
    "topq_iou": "headsurgeon.synth.metrics", "RealPatterns": "headsurgeon.synth.metrics",
    "run_demo": "headsurgeon.demo", "demo_corpus_path": "headsurgeon.hub.zoo", "Vocabulary": "headsurgeon.synth.vocab",
    "explain": "headsurgeon.pipeline", **{name: "headsurgeon.configs" for name in (
        "ExplainConfig", "ModelConfig", "CorpusConfig", "CaptureConfig", "SearchConfig", "ScaleoutConfig",
        "MeasureConfig", "BuildConfig")},
    "spearman_ci": "headsurgeon.surgery.evaluate",
    "load_library_file": "headsurgeon.synth.eaps", "LibraryProgram": "headsurgeon.synth.eaps",
    "read_library": "headsurgeon.synth.eaps", "LibraryLoad": "headsurgeon.synth.eaps",
    # hub: checkpoints
    "save_hybrid": "headsurgeon.hub.checkpoint", "load_hybrid": "headsurgeon.hub.checkpoint",
    "push_hybrid": "headsurgeon.hub.remote",
}

if TYPE_CHECKING:  # editors and type checkers see the real objects; at run time they load lazily (below)
    from .build import BuildResult, build_hybrid
    from .configs import (
        BuildConfig, CaptureConfig, CorpusConfig, ExplainConfig, MeasureConfig, ModelConfig, ScaleoutConfig,
        SearchConfig,
    )
    from .demo import run_demo
    from .pipeline import explain
    from .hub.checkpoint import load_hybrid, save_hybrid
    from .hub.remote import push_hybrid
    from .hub.zoo import demo_corpus_path
    from .kernels.cache import TensorCache
    from .kernels.normalize import normalize_scores
    from .kernels.scores import Scores
    from .surgery.ablate import ablate
    from .surgery.batches import batches, padded_batch
    from .surgery.capture import capture
    from .surgery.corpus import Splits, load_corpus, make_sequences, read_documents, split_sequences
    from .surgery.downstream import downstream
    from .surgery.embedding import embedding_distance, sentence_embeddings
    from .surgery.eval_report import EvalReport, evaluate_programs
    from .surgery.evaluate import per_head_delta_ppl, perplexity, replacement_sweep, spearman_ci
    from .surgery.head_costs import HeadCosts, head_costs
    from .surgery.head_finders import HeadScores, head_scores, probe_sequences
    from .surgery.heal import HealReport, heal
    from .surgery.refit import RefitResult, refit_mixtures
    from .surgery.loading import ModelHandle, ModelLoadError, load_model
    from .surgery.replace import HybridModel, ProgramHead, replace_heads
    from .surgery.score import score
    from .surgery.sources import ModelSource, register_model_source
    from .surgery.store import AttentionStore
    from .surgery.sweep_order import order_heads
    from .synth.eaps import LibraryLoad, LibraryProgram, load_library_file, read_library
    from .synth.features import FeatureView, compute_features
    from .synth.metrics import RealPatterns, jsd_distance, score_many, soft_iou, topq_iou
    from .synth.program import Program
    from .synth.programset import ProgramSet
    from .synth.sandbox import SandboxPool
    from .synth.scored import ScoredProgram
    from .synth.search import SearchSettings, Searcher, register_searcher, run_searchers, searchers
    from .synth.search.enumerative import enumerative_search
    from .synth.search.learned import learned_search
    from .synth.search.llm import AgentConfig, LLMAgent
    from .synth.select import select_programs
    from .synth.sequence import Sequence
    from .synth.tensors import program_tensors
    from .synth.vocab import Vocabulary

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'headsurgeon' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
