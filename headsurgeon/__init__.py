"""headsurgeon: explain attention heads with executable programs and swap heads for them.

The public API is re-exported here lazily (``import headsurgeon`` stays fast)::

    hs.load_model, hs.load_corpus, hs.capture, hs.Program, hs.replace_heads, hs.perplexity, ...
"""
from __future__ import annotations

import importlib
from typing import Any

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
    # synth: programs
    "Sequence": "headsurgeon.synth.sequence", "Program": "headsurgeon.synth.program",
    "ProgramSet": "headsurgeon.synth.programset", "program_tensors": "headsurgeon.synth.tensors",
    "enumerative_search": "headsurgeon.synth.search.enumerative",
    "learned_search": "headsurgeon.synth.search.learned",
    "select_programs": "headsurgeon.synth.select", "Candidate": "headsurgeon.synth.candidate",
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
    "explain": "headsurgeon.explain", "spearman_ci": "headsurgeon.surgery.evaluate",
    "load_library_file": "headsurgeon.synth.eaps", "LibraryProgram": "headsurgeon.synth.eaps",
    # hub: checkpoints
    "save_hybrid": "headsurgeon.hub.checkpoint", "load_hybrid": "headsurgeon.hub.checkpoint",
    "push_hybrid": "headsurgeon.hub.remote",
}

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
