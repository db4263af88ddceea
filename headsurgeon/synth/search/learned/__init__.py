"""Learned searcher: per head, fit categorical predicates over Sequence features by gradient descent with
Gumbel-softmax annealing, discretize, and decompile into a DSL program.

This is the bridge to Learning Transformer Programs (Friedman, Wettig & Chen 2023): as in a categorical
attention head there, each *match term* reads one query-side and one key-side feature through Gumbel
gates over the candidate features (token id buckets, word-start / punctuation / capital / newline /
sentence-end flags; optionally spaCy ``pos`` ...), and a predicate matrix over their values says which
(query value, key value) pairs match. The term attends to the *closest* matching key (``select=closest``,
the paper's closest-match bias) or spreads over every matching key (``select=all``), and a query with no
match attends to position 0 (BOS, the paper's default). The head's pattern is modelled as a mixture of
the match terms and fixed relative-position terms (``first``, ``self``, ``prev(k)``, ``uniform``,
``decay``):

    P(i, .) = sum_t w_t C_t(i, .) / sum_t w_t [row i of C_t is non-empty]

which is exactly the DSL's ``w1*A + w2*B + ...`` semantics (row-normalized components, empty rows
contribute nothing, then one final normalization). Optionally (``LearnedConfig.query_gate``, on by
default) a Gumbel gate over query flags splits the queries between two mixtures of the same components:
``gate(FLAG, A, B)``.

Training (per head, on sampled query rows of the ``synth`` split): every predicate entry is a binary
Gumbel-softmax (relaxed Bernoulli) sample, every feature gate a Gumbel-softmax over the candidate
features, the temperature falls geometrically from ``tau_start`` (3.0) to ``tau_end`` (0.01) as in the
paper, and Adam minimizes the KL divergence of the real rows from the predicted rows over visible keys
(plus a small, ramped penalty on the number of active pairs). The soft "closest" is exact at 0/1: key j
gets ``m_ij * prod_{j' closer} (1 - m_ij')`` and BOS the leftover ``prod_j (1 - m_ij)``.

Discretization: gates -> argmax, predicate entries -> ``logit > 0``; every other (query feature, key
feature) block of the trained predicate is tried in place of the gates' choice and kept if the discrete
mixture fits better; the token feature is bucketed (the ``top_tokens`` most frequent ids on ``synth``, the
rest in an "other" bucket that never matches, so the predicate stays small and decompiles exactly);
pairs that never select a key on ``synth`` are dropped and at most ``max_pairs`` kept (by the real
attention mass they capture); the mixture weights are refitted on the discretized components for soft
IoU (the selection metric), light ones dropped, the rest rounded. The result decompiles to e.g.
``0.61*fallback(match(q=token, k=punct, pairs=[[13, 1], ...], select=closest), first()) + 0.3*prev(1) +
0.09*first()``, and :meth:`LearnedHead.torch_patterns` computes the same discretized model with torch
(an independent implementation the tests compare with the kernels).

Modules: :mod:`.config`, :mod:`.space` (features), :mod:`.rows` (torch attention rows), :mod:`.model` (the soft
model), :mod:`.fit` (one head), :mod:`.head` (the discretized model), :mod:`.search` (all heads).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ....core.lazy import lazy_package

if TYPE_CHECKING:  # the package's names, loaded on first use (headsurgeon/core/lazy.py)
    from .config import DEFAULT_FEATURES, OPTIONAL_FEATURES, SELECTS, LearnedConfig
    from .fit import fit_head
    from .head import LearnedHead, MatchTerm
    from .rows import key_order, positional_specs, select_rows, visible
    from .search import SOURCE, LearnedSearcher, learned_search
    from .space import FeatureSpace, feature_arrays

__all__, __getattr__, __dir__ = lazy_package(__file__, __name__)
