"""Numba kernels for the DSL primitives and combinators, one module per family.

Every primitive ``score_*`` takes padded arrays (token ids or feature arrays ``[B, N]`` int64,
boolean masks ``[B, N]``), ``lengths [B]`` int64, the width ``n`` where no array gives it, and a
``causal`` flag, and returns a float32 score matrix ``[B, N, N]`` (a new array, or ``out=`` when a
reusable buffer is passed; every cell is overwritten). Invariant: a kernel writes non-zero scores
only on *visible* cells (query and key inside the length, and ``j <= i`` when causal), so that "this
row is empty" means the same thing before and after normalization (``fallback`` relies on it).
Scores are raw (0/1 indicators or decay weights); ``headsurgeon.kernels.normalize.normalize_scores``
turns them into attention.

* ``positional``: self, prev, next, first, window, decay, uniform, none, profile;
* ``tokens``: same_token, same_token_recent, induction, ngram_induction, keys, recent, match, class_table, value_index;
* ``structure``: group_start, same_group, same_value, dep_head, dep_children (word, sentence, dependency arrays);
* ``combinators``: mix, raw sums, fallback, gate, sharpen, multiply, row normalization (in place on whole batches);
* ``buffers``: output buffers and offset clipping;
* ``sparse_prims``, ``sparse_tokens``, ``sparse_combinators``: the same primitives (those of small support) and combinators
  writing compressed rows (headsurgeon/kernels/sparse.py) instead of dense [B, N, N] arrays.

All kernels are serial ``@njit(cache=True)`` loops over sequences: numba's parallel kernels cost three times
the compile time and measured no faster on whole runs (benchmarks/RESULTS.md, "Serial kernels"); processes
(``explain --ray``) are the way to more cores.
"""
from __future__ import annotations

from .buffers import clip_offset, out_buffer
from .combinators import (empty_rows, fallback_rows, gate_rows, mix_accumulate, mix_scale, multiply, raw_accumulate,
                          raw_scale, row_normalize, sharpen_rows, sharpen_rows_by)
from .positional import (score_decay, score_first, score_next, score_none, score_prev, score_profile,
                         score_self, score_uniform, score_window)
from .sparse_combinators import (sparse_empty_rows, sparse_fallback, sparse_gate, sparse_mix_add, sparse_mix_scale,
                                 sparse_mul, sparse_raw_add, sparse_raw_scale, sparse_row_normalize, sparse_sharpen,
                                 sparse_sharpen_by)
from .sparse_prims import (sparse_dep_children, sparse_dep_head, sparse_first, sparse_group_start, sparse_next,
                           sparse_none, sparse_prev, sparse_same_group, sparse_same_value, sparse_self, sparse_window)
from .sparse_tokens import (sparse_induction, sparse_keys, sparse_match, sparse_ngram_induction, sparse_recent,
                            sparse_same_token, sparse_same_token_recent)
from .structure import score_dep_children, score_dep_head, score_group_start, score_same_group, score_same_value
from .tokens import (score_class_table, score_induction, score_keys, score_match, score_ngram_induction, score_recent,
                     score_same_token, score_same_token_recent, value_index)

__all__ = [
    "score_self", "score_prev", "score_next", "score_first", "score_window", "score_decay",
    "score_uniform", "score_none", "score_same_token", "score_same_token_recent", "score_induction",
    "score_ngram_induction",
    "score_keys", "score_class_table", "score_recent", "score_group_start", "score_same_group", "score_same_value",
    "score_dep_head",
    "score_dep_children", "score_match", "value_index", "score_profile",
    "mix_scale", "mix_accumulate", "raw_scale", "raw_accumulate", "fallback_rows", "gate_rows", "sharpen_rows",
    "sharpen_rows_by", "multiply",
    "row_normalize",
    "empty_rows", "out_buffer", "clip_offset",
    "sparse_self", "sparse_prev", "sparse_next", "sparse_first", "sparse_window", "sparse_none", "sparse_same_token",
    "sparse_same_token_recent", "sparse_induction", "sparse_ngram_induction", "sparse_keys", "sparse_recent",
    "sparse_match",
    "sparse_group_start", "sparse_same_group", "sparse_same_value", "sparse_dep_head", "sparse_dep_children",
    "sparse_mix_scale", "sparse_mix_add", "sparse_raw_scale", "sparse_raw_add", "sparse_row_normalize",
    "sparse_fallback", "sparse_gate", "sparse_sharpen", "sparse_sharpen_by", "sparse_mul", "sparse_empty_rows",
]
