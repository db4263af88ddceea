"""Learned searcher: per head, fit categorical predicates over Sequence features by gradient descent with
Gumbel-softmax annealing, discretize, and decompile into a DSL program (DESIGN sections 2, 3 and 8).

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

Candidates per head: the single mixture, the query-gated mixture and each match term alone, all scored
with the kernels on ``synth`` and ``select``.
"""
from __future__ import annotations

import re
from collections.abc import Sequence as _Seq
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from . import dsl
from .candidate import Candidate
from .features import POS_TAGS, SPACY_FEATURES, batch_feature_arrays
from .metrics import score_many
from .program import Program
from .sequence import Sequence, pad_ids

__all__ = [
    "DEFAULT_FEATURES", "OPTIONAL_FEATURES", "LearnedConfig", "FeatureSpace", "MatchTerm", "LearnedHead",
    "fit_head", "learned_search",
]

#: cheap features (no spaCy) every search considers by default.
DEFAULT_FEATURES: tuple[str, ...] = ("token", "word_start", "punct", "cap", "newline", "sent_end")
#: further features a caller may add (``pos`` and ``dep_head`` need spaCy; index features list many values).
OPTIONAL_FEATURES: tuple[str, ...] = ("pos", "sent", "word", "position", "dep_head")
_ARRAY_FEATURES = ("word", "word_start", "sent", "sent_end", "punct", "cap", "newline", "pos", "dep_head")
SELECTS = ("closest", "all")
_EPS = 1e-9


@dataclass(frozen=True)
class LearnedConfig:
    """Hyper-parameters of the learned searcher (the defaults are the measured ones; see the module doc)."""

    steps: int = 150  # Adam steps per head with Gumbel annealing
    batch_size: int = 16  # sequences per step
    rows: int = 32  # query rows sampled per sequence and step
    refit_rows: int = 16  # query rows per synth sequence for the mixture refit
    lr: float = 0.05  # Adam learning rate (the paper's)
    tau_start: float = 3.0  # Gumbel temperature, geometric from tau_start to tau_end
    tau_end: float = 0.01
    terms: tuple[str, ...] = ("closest", "all")  # one match term per entry, with its select mode
    features: tuple[str, ...] = DEFAULT_FEATURES  # candidate features for both the query and the key side
    top_tokens: int = 32  # token buckets: the most frequent ids on synth (+ an "other" bucket)
    max_values: int = 32  # other features: the most frequent values (+ "other")
    max_pairs: int = 48  # readability cap on the pairs of one match term
    offsets: int = 8  # prev(1) .. prev(offsets) as positional terms (next(k) too when not causal)
    decays: tuple[float, ...] = (0.5, 0.8, 0.95)  # decay(rate) positional terms
    loss: str = "kl"  # "kl" (real vs predicted rows), "jsd" or "iou" (1 - soft IoU on the sampled rows)
    refit_steps: int = 60  # Adam steps refitting the mixture weights on the discretized components
    refit_loss: str = "iou"  # the refit's loss (IoU selects, so the weights are tuned for it)
    min_weight: float = 0.01  # mixture terms lighter than this (after refit) are dropped
    init_scale: float = 0.1  # std of the initial predicate logits
    sparsity: float = 3e-3  # penalty per expected active pair of the gated block, ramped up linearly from 0
    block_search: bool = True  # after training, try every feature pair's predicate block (see _block_search)
    query_gate: tuple[str, ...] = ("word_start", "punct", "cap", "newline", "sent_end")  # flags a second,
    # gated mixture may split the queries on: gate(FLAG, mixture A, mixture B); () disables it
    gate_prior: float = 0.0  # initial gate logit -gate_prior * log(values): a head start for small features
    max_synth: int = 256  # at most this many synth sequences are used for fitting (evenly spaced)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1; got {self.steps}, {self.batch_size}")
        if not 0 < self.tau_end <= self.tau_start:
            raise ValueError(f"need 0 < tau_end <= tau_start; got {self.tau_start} -> {self.tau_end}")
        bad = [t for t in self.terms if t not in SELECTS]
        if bad:
            raise ValueError(f"terms must be select modes from {SELECTS}; got {bad}")
        unknown = [f for f in self.features if f not in dsl.MATCH_FEATURES]
        if unknown or not self.features:
            raise ValueError(f"features must be a non-empty subset of {dsl.MATCH_FEATURES}; unknown: {unknown}")
        if any(f not in dsl.FLAGS for f in self.query_gate):
            raise ValueError(f"query_gate flags must come from {dsl.FLAGS}; got {self.query_gate}")
        for name in ("loss", "refit_loss"):
            if getattr(self, name) not in ("kl", "jsd", "iou"):
                raise ValueError(f"{name} must be 'kl', 'jsd' or 'iou'; got {getattr(self, name)!r}")
        if any(not 0.0 < r < 1.0 for r in self.decays):
            raise ValueError(f"decay rates must lie in (0, 1); got {self.decays}")


# ------------------------------------------------------------------------------------------------
# features -> value slots
# ------------------------------------------------------------------------------------------------

def feature_arrays(sequences: list[Sequence], names: _Seq[str]) -> dict[str, np.ndarray]:
    """Padded int64 [B, N] arrays of the named match features (``token`` and ``position`` included)."""
    ids, lengths = pad_ids(sequences)
    out: dict[str, np.ndarray] = {}
    wanted = [n for n in names if n in _ARRAY_FEATURES]
    if wanted:
        out.update(batch_feature_arrays(sequences, wanted))
    if "token" in names:
        out["token"] = ids
    if "position" in names:
        out["position"] = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), ids.shape).copy()
    return out


@dataclass
class FeatureSpace:
    """Value vocabularies of the candidate features (fitted on ``synth``) and the concatenated one-hot slots.

    Feature ``f`` owns slots ``offset[f] .. offset[f] + len(vocab[f])``; the last one is its "other"
    bucket (values outside the vocabulary, and padding), which never matches anything.
    """

    names: tuple[str, ...]
    vocabs: tuple[np.ndarray, ...]  # sorted raw values per feature

    @classmethod
    def fit(cls, arrays: dict[str, np.ndarray], lengths: np.ndarray, names: _Seq[str], top_tokens: int,
            max_values: int) -> "FeatureSpace":
        """Keep, per feature, its most frequent values over the visible positions (ties: smaller value)."""
        inside = np.arange(next(iter(arrays.values())).shape[1])[None, :] < np.asarray(lengths)[:, None]
        vocabs = []
        for name in names:
            vals, counts = np.unique(arrays[name][inside], return_counts=True)
            cap = top_tokens if name == "token" else max_values
            order = np.lexsort((vals, -counts))[:cap]
            vocabs.append(np.sort(vals[order]).astype(np.int64))
        return cls(tuple(names), tuple(vocabs))

    @property
    def sizes(self) -> list[int]:
        """Slots per feature (vocabulary + the "other" bucket)."""
        return [len(v) + 1 for v in self.vocabs]

    @property
    def offsets(self) -> list[int]:
        return [int(x) for x in np.cumsum([0] + self.sizes[:-1])]

    @property
    def dim(self) -> int:
        return int(sum(self.sizes))

    def slot_feature(self) -> np.ndarray:
        """Feature index of every slot, int64 [dim]."""
        return np.repeat(np.arange(len(self.names)), self.sizes)

    def other_mask(self) -> np.ndarray:
        """bool [dim]: the "other" slots (forced to never match)."""
        mask = np.zeros(self.dim, dtype=bool)
        for off, size in zip(self.offsets, self.sizes):
            mask[off + size - 1] = True
        return mask

    def local_index(self, f: int, values: np.ndarray) -> np.ndarray:
        """Index of each raw value in feature ``f``'s vocabulary; the "other" index for unknown values."""
        vocab = self.vocabs[f]
        values = np.asarray(values, dtype=np.int64)
        if vocab.size == 0:
            return np.zeros(values.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(vocab, values), vocab.size - 1)
        return np.where(vocab[pos] == values, pos, vocab.size).astype(np.int64)

    def encode(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """Global slot index of every feature at every position: int64 [F, B, N]."""
        return np.stack([self.local_index(f, arrays[name]) + off
                         for f, (name, off) in enumerate(zip(self.names, self.offsets))])

    def dsl_value(self, f: int, local: int) -> Any:
        """The DSL spelling of value ``local`` of feature ``f`` (POS ids become tag names)."""
        raw = int(self.vocabs[f][local])
        if self.names[f] == "pos" and 0 <= raw < len(POS_TAGS):
            return POS_TAGS[raw]
        return raw

    def describe(self, f: int, local: int, tokens: dict[int, str] | None = None) -> str:
        """A short human label of a value (token text for token ids when known)."""
        raw = int(self.vocabs[f][local])
        name = self.names[f]
        if name == "token" and tokens and raw in tokens:
            return repr(tokens[raw])
        if name == "pos":
            return str(self.dsl_value(f, local))
        if name in ("punct", "cap", "newline", "sent_end", "word_start"):
            return {-1: "BOS", 0: "no", 1: "yes"}.get(raw, str(raw))
        return str(raw)


# ------------------------------------------------------------------------------------------------
# positional components (torch formulas, checked against the kernels by the tests)
# ------------------------------------------------------------------------------------------------

def positional_specs(cfg: LearnedConfig, causal: bool) -> list[str]:
    """DSL text of the fixed relative-position terms of the mixture."""
    specs = ["first()", "self()"] + [f"prev({k})" for k in range(1, cfg.offsets + 1)]
    if not causal:
        specs += [f"next({k})" for k in range(1, cfg.offsets + 1)]
    specs += ["uniform()"] + [f"decay({r!r})" for r in cfg.decays]
    return specs


def _visible(lengths: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """bool [B, N, N] visible cells."""
    pos = torch.arange(n)
    inside = pos[None, :] < lengths[:, None]
    vis = inside[:, :, None] & inside[:, None, :]
    if causal:
        vis = vis & (pos[None, None, :] <= pos[None, :, None])
    return vis


def _positional(specs: list[str], lengths: torch.Tensor, n: int, causal: bool,
                qi: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-normalized components [T, B, R, N] and non-empty flags [T, B, R] (float64) of positional DSL terms.

    Rows are the query positions ``qi`` [B, R] (default: every position, R = N) of sequences of ``lengths``.
    """
    if qi is None:
        qi = torch.arange(n).expand(lengths.shape[0], n)
    i = qi[:, :, None]
    j = torch.arange(n)[None, None, :]
    vis = (j < lengths[:, None, None]) & (i < lengths[:, None, None])
    if causal:
        vis = vis & (j <= i)
    vis = vis.double()
    comps = []
    for text in specs:
        node = dsl.parse(text)
        name = node.name
        if name == "first":
            raw = (j == 0).double()
        elif name == "self":
            raw = (i == j).double()
        elif name == "prev":
            raw = (j == i - node.param("k")).double()
        elif name == "next":
            raw = (j == i + node.param("k")).double()
        elif name == "uniform":
            raw = torch.ones((), dtype=torch.float64)
        elif name == "decay":
            raw = torch.tensor(node.param("rate"), dtype=torch.float64) ** (i - j).abs().double()
        else:  # pragma: no cover - specs come from positional_specs
            raise ValueError(f"not a positional term: {text}")
        comps.append(raw * vis)
    stack = torch.stack(comps)  # [T, B, R, N]
    total = stack.sum(-1)
    nonempty = (total > 0).double()
    stack = stack / total.clamp_min(1e-300)[..., None]
    return stack, nonempty


def _order(n: int) -> torch.Tensor:
    """Per query row, keys ordered by closeness: (|i - j|, left before right) -> int64 [N, N] permutation."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    key = (i - j).abs() * 2 + (j > i).long()
    return torch.argsort(key, dim=1, stable=True)


def _select_rows(m: torch.Tensor, select: str, order: torch.Tensor, hard: bool) -> torch.Tensor:
    """Match probabilities m [B, R, N] (zero off the visible grid) -> attention rows with BOS fallback.

    ``order`` [R, N] or [B, R, N]: each row's keys by closeness (:func:`_order`). closest: key j gets
    ``m_ij * prod_{j' closer than j} (1 - m_ij')``; all: ``m_ij / sum_j m_ij``; the no-match mass
    ``prod_j (1 - m_ij)`` goes to position 0. Exact (no clamping) when ``hard``.
    """
    idx = order.expand(m.shape)
    if hard:
        mb = m > 0.5
        any_match = mb.any(-1)
        if select == "closest":
            mp = torch.gather(mb, 2, idx)
            first = mp & (torch.cumsum(mp.long(), dim=2) == 1)
            rows = torch.zeros_like(m).scatter(2, idx, first.to(m.dtype))
        else:
            rows = mb.to(m.dtype) / mb.sum(-1, keepdim=True).clamp_min(1).to(m.dtype)
        rows[..., 0] += (~any_match).to(m.dtype)
        return rows
    logs = torch.log1p(-m.clamp(max=1.0 - 1e-6))
    empty = torch.exp(logs.sum(-1))  # [B, N]
    if select == "closest":
        lp = torch.gather(logs, 2, idx)
        before = torch.cumsum(lp, dim=2) - lp  # exclusive prefix sum in closeness order
        rows = torch.zeros_like(m).scatter(2, idx, torch.gather(m, 2, idx) * torch.exp(before))
    else:
        rows = (1.0 - empty)[..., None] * m / m.sum(-1, keepdim=True).clamp_min(_EPS)
    bos = torch.zeros_like(m)
    bos[..., 0] = empty
    return rows + bos


def _gumbel_softmax(logits: torch.Tensor, tau: float, gen: torch.Generator, hard: bool) -> torch.Tensor:
    if hard:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    u = torch.rand(logits.shape, generator=gen, dtype=logits.dtype).clamp(1e-10, 1 - 1e-10)
    return torch.softmax((logits - torch.log(-torch.log(u))) / tau, dim=-1)


def _relaxed_bernoulli(logits: torch.Tensor, tau: float, gen: torch.Generator, hard: bool) -> torch.Tensor:
    if hard:
        return (logits > 0).to(logits.dtype)
    u = torch.rand(logits.shape, generator=gen, dtype=logits.dtype).clamp(1e-10, 1 - 1e-10)
    return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / tau)


# ------------------------------------------------------------------------------------------------
# the discretized model
# ------------------------------------------------------------------------------------------------

@dataclass
class MatchTerm:
    """A discretized match term: ``fallback(match(q=qf, k=kf, pairs, select), first())``."""

    q: int  # feature index (into FeatureSpace.names) read by the query
    k: int  # feature index read by the key
    table: np.ndarray  # bool [Vq + 1, Vk + 1] over local value indices ("other" row/column all False)
    select: str

    @property
    def n_pairs(self) -> int:
        return int(self.table.sum())

    def node(self, space: FeatureSpace) -> dsl.Node | None:
        """The DSL tree, or None when no pair is left (the term is then just ``first()``)."""
        qs, ks = np.nonzero(self.table)
        if qs.size == 0:
            return None
        pairs = [[space.dsl_value(self.q, int(a)), space.dsl_value(self.k, int(b))] for a, b in zip(qs, ks)]
        match = dsl.from_json({"match": {"q": space.names[self.q], "k": space.names[self.k], "pairs": pairs,
                                         "select": self.select}})
        return dsl.Fallback((match, dsl.Prim("first")))


def _mixture_node(matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                  space: FeatureSpace) -> dsl.Node:
    """A weighted mixture as a DSL tree (a single term is not wrapped in a mix)."""
    terms: list[tuple[float, dsl.Node]] = []
    for w, term in matches:
        node = term.node(space)
        terms.append((w, node if node is not None else dsl.Prim("first")))
    terms += [(w, dsl.parse(text)) for w, text in positional]
    if not terms:
        return dsl.Prim("first")
    if len(terms) == 1:
        return terms[0][1]
    return dsl.Mix(tuple((float(w), node) for w, node in terms))


@dataclass
class LearnedHead:
    """One head's discretized learned model: weighted match terms and positional terms, and its DSL program.

    With ``gate`` (a flag name) the program is ``gate(FLAG, A, B)``: queries with the flag use the mixture
    (``matches``, ``positional``), the others (``other_matches``, ``other_positional``).
    """

    space: FeatureSpace
    causal: bool
    matches: list[tuple[float, MatchTerm]]
    positional: list[tuple[float, str]]
    gate: str | None = None
    other_matches: list[tuple[float, MatchTerm]] = field(default_factory=list)
    other_positional: list[tuple[float, str]] = field(default_factory=list)
    loss: float = float("nan")  # refit loss of the discretized model on the synth rows
    history: list[float] = field(default_factory=list, repr=False)

    def node(self) -> dsl.Node:
        """The program as a DSL tree."""
        a = _mixture_node(self.matches, self.positional, self.space)
        if self.gate is None:
            return a
        return dsl.Gate(dsl.Pred("flag", self.gate), a, _mixture_node(self.other_matches, self.other_positional,
                                                                       self.space))

    @property
    def program(self) -> Program:
        return Program.from_node(self.node())

    def match_programs(self) -> list[Program]:
        """Each non-empty match term on its own (``fallback(match(...), first())``)."""
        out: dict[str, Program] = {}
        for _, term in self.matches + self.other_matches:
            node = term.node(self.space)
            if node is not None:
                prog = Program.from_node(node)
                out.setdefault(prog.hash, prog)
        return list(out.values())

    def _describe_mixture(self, matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                          tokens: dict[int, str] | None, max_pairs: int) -> str:
        parts = []
        for w, term in matches:
            qn, kn = self.space.names[term.q], self.space.names[term.k]
            qs, ks = np.nonzero(term.table)
            if qs.size == 0:
                continue
            describe = self.space.describe
            shown = ", ".join(f"{describe(term.q, int(a), tokens)}->{describe(term.k, int(b), tokens)}"
                              for a, b in list(zip(qs, ks))[:max_pairs])
            more = f" +{qs.size - max_pairs} more" if qs.size > max_pairs else ""
            what = "the closest key" if term.select == "closest" else "every key"
            parts.append(f"{w:.2f}: {what} with query {qn} x key {kn} in {{{shown}{more}}} (else BOS)")
        pos = sorted(positional, key=lambda t: -t[0])[:4]
        if pos:
            parts.append("positional " + ", ".join(f"{text} {w:.2f}" for w, text in pos))
        return "; ".join(parts) if parts else "BOS only"

    def hypothesis(self, tokens: dict[int, str] | None = None, max_pairs: int = 4) -> str:
        """A short text describing the predicate(s) and the positional mix."""
        a = self._describe_mixture(self.matches, self.positional, tokens, max_pairs)
        if self.gate is None:
            return "learned predicate: " + a
        b = self._describe_mixture(self.other_matches, self.other_positional, tokens, max_pairs)
        return f"learned predicate: queries with {self.gate}: {a} | other queries: {b}"

    def torch_patterns(self, sequences: list[Sequence], arrays: dict[str, np.ndarray] | None = None) -> torch.Tensor:
        """The discretized model evaluated with torch (float64 [B, N, N]), independently of the DSL kernels."""
        ids, lengths = pad_ids(sequences)
        names = list(self.space.names) + ([self.gate] if self.gate else [])
        if arrays is None or any(n not in arrays for n in names):
            arrays = {**(arrays or {}), **feature_arrays(sequences, names)}
        slots = torch.from_numpy(self.space.encode(arrays))
        lens = torch.from_numpy(lengths)
        out = self._mixture_torch(self.matches, self.positional, slots, lens, ids.shape[1])
        if self.gate is not None:
            other = self._mixture_torch(self.other_matches, self.other_positional, slots, lens, ids.shape[1])
            flag = torch.from_numpy(arrays[self.gate] == 1)
            out = torch.where(flag[..., None], out, other)
        return out

    def _mixture_torch(self, matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                       slots: torch.Tensor, lens: torch.Tensor, n: int) -> torch.Tensor:
        vis = _visible(lens, n, self.causal)
        perm = _order(n)
        offs = self.space.offsets
        num = torch.zeros(lens.shape[0], n, n, dtype=torch.float64)
        den = torch.zeros(lens.shape[0], n, dtype=torch.float64)
        for w, term in matches:
            table = torch.from_numpy(term.table)
            qv = slots[term.q] - offs[term.q]
            kv = slots[term.k] - offs[term.k]
            m = table[qv[:, :, None], kv[:, None, :]] & vis
            num += w * _select_rows(m.double(), term.select, perm, hard=True) * vis
            den += w * vis.any(-1).double()
        if positional:
            comps, nonempty = _positional([t for _, t in positional], lens, n, self.causal)
            ws = torch.tensor([w for w, _ in positional], dtype=torch.float64)
            num += torch.einsum("t,tbij->bij", ws, comps)
            den += torch.einsum("t,tbi->bi", ws, nonempty)
        out = num / den.clamp_min(1e-300)[..., None]
        inside = torch.arange(n)[None, :] < lens[:, None]
        out[..., 0] += ((den <= 0) & inside).double()
        return out * inside[..., None]


# ------------------------------------------------------------------------------------------------
# training one head
# ------------------------------------------------------------------------------------------------

@dataclass
class _Data:
    """Padded training tensors of the synth split, shared by all heads."""

    slots: torch.Tensor  # int64 [F, B, N] global slot of every feature at every position
    onehot: torch.Tensor  # float32 [B, N, D] multi-hot (one slot per feature)
    lengths: torch.Tensor  # int64 [B]
    n: int
    causal: bool
    specs: list[str]  # positional DSL terms
    order: torch.Tensor  # int64 [N, N] keys by closeness per query row
    pos: torch.Tensor | None  # causal: float32 [T, N, N] row-normalized positional components
    pos_ne: torch.Tensor | None  # causal: float32 [T, N] non-empty flags
    gate_flags: tuple[str, ...] = ()  # flags the queries may be gated on
    flags: torch.Tensor | None = None  # float32 [G, B, N]: 1 where the position has the flag


def _make_data(space: FeatureSpace, arrays: dict[str, np.ndarray], lengths: np.ndarray, specs: list[str],
               causal: bool, gate_flags: tuple[str, ...] = ()) -> _Data:
    slots = torch.from_numpy(space.encode(arrays))
    F_, B, n = slots.shape
    onehot = torch.zeros(B, n, space.dim, dtype=torch.float32)
    for f in range(F_):
        onehot.scatter_(2, slots[f][..., None], 1.0)
    pos = pos_ne = None
    if causal:  # under a causal mask, row i of a positional term does not depend on the sequence length
        p, ne = _positional(specs, torch.tensor([n]), n, True)
        pos, pos_ne = p[:, 0].float(), ne[:, 0].float()
    flags = torch.stack([torch.from_numpy(arrays[f] == 1).float() for f in gate_flags]) if gate_flags else None
    return _Data(slots, onehot, torch.from_numpy(np.asarray(lengths, dtype=np.int64)), n, causal, specs,
                 _order(n), pos, pos_ne, tuple(gate_flags), flags)


@dataclass
class _Rows:
    """A batch of query rows: sequence ``idx`` [B] and query positions ``qi`` [B, R]."""

    idx: torch.Tensor
    qi: torch.Tensor
    valid: torch.Tensor  # bool [B, R] (qi inside the length)
    vis: torch.Tensor  # bool [B, R, N]
    order: torch.Tensor  # int64 [B, R, N]
    pos: torch.Tensor  # float32 [T, N, N] (causal: shared by all sequences) or [T, B, R, N]
    pos_ne: torch.Tensor  # float32 [T, N] or [T, B, R]

    @property
    def shared(self) -> bool:
        return self.pos.dim() == 3

    def select_pos(self, keep: list[int]) -> "_Rows":
        return replace(self, pos=self.pos[keep], pos_ne=self.pos_ne[keep])


def _rows(data: _Data, idx: torch.Tensor, qi: torch.Tensor) -> _Rows:
    lens = data.lengths[idx]
    n = data.n
    j = torch.arange(n)
    valid = qi < lens[:, None]
    vis = (j[None, None, :] < lens[:, None, None]) & valid[..., None]
    if data.causal:
        vis = vis & (j[None, None, :] <= qi[..., None])
        pos, pos_ne = data.pos, data.pos_ne
    else:
        pos, pos_ne = (x.float() for x in _positional(data.specs, lens, n, False, qi))
    return _Rows(idx, qi, valid, vis, data.order[qi], pos, pos_ne)


def _gather_rows(x: torch.Tensor, rows: _Rows) -> torch.Tensor:
    """Rows ``rows.qi`` of ``x[rows.idx]`` ([B_all, N, ...] -> [B, R, ...])."""
    sub = x[rows.idx]
    shape = rows.qi.shape + sub.shape[2:]
    index = rows.qi.reshape(rows.qi.shape + (1,) * (sub.dim() - 2)).expand(shape)
    return torch.gather(sub, 1, index)


def _sample_rows(data: _Data, n_seq: int, n_rows: int, gen: torch.Generator, all_seqs: bool = False) -> _Rows:
    """Random sequences (or all of them) and random query rows inside each one's length."""
    B = data.lengths.shape[0]
    idx = torch.arange(B) if all_seqs else torch.randperm(B, generator=gen)[:n_seq]
    lens = data.lengths[idx].double()
    qi = (torch.rand(idx.shape[0], n_rows, generator=gen, dtype=torch.float64) * lens[:, None]).long()
    return _rows(data, idx, qi.clamp(max=data.n - 1))


class _Model(torch.nn.Module):
    """Soft (Gumbel) / hard mixture of match terms and positional terms for one head."""

    def __init__(self, space: FeatureSpace, cfg: LearnedConfig, n_pos: int, gen: torch.Generator) -> None:
        super().__init__()
        T, D, F_ = len(cfg.terms), space.dim, len(space.names)
        self.selects = cfg.terms
        self.pred = torch.nn.Parameter(torch.randn(T, D, D, generator=gen) * cfg.init_scale)
        prior = -cfg.gate_prior * torch.log(torch.tensor(space.sizes, dtype=torch.float32))
        self.gate_q = torch.nn.Parameter(prior.repeat(T, 1))
        self.gate_k = torch.nn.Parameter(prior.repeat(T, 1))
        self.mix = torch.nn.Parameter(torch.zeros(T + n_pos))
        G = len(cfg.query_gate)
        self.qgate = torch.nn.Parameter(torch.zeros(G)) if G else None  # which flag gates the queries
        self.mix_other = torch.nn.Parameter(torch.zeros(T + n_pos)) if G else None  # unflagged queries' mixture
        self.register_buffer("slot_feature", torch.from_numpy(space.slot_feature()))
        self.register_buffer("keep", torch.from_numpy(~space.other_mask()).float())

    def forward(self, data: _Data, rows: _Rows, tau: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft predicted attention [B, R, N] of the sampled rows, and the expected number of active pairs."""
        keep2 = self.keep[:, None] * self.keep[None, :]
        q_oh = _gather_rows(data.onehot, rows)
        k_oh = data.onehot[rows.idx]
        visf = rows.vis.float()
        out = []
        pairs = torch.zeros(())
        for t, select in enumerate(self.selects):
            s = _relaxed_bernoulli(self.pred[t], tau, gen, False) * keep2
            gq = _gumbel_softmax(self.gate_q[t], tau, gen, False)[self.slot_feature]
            gk = _gumbel_softmax(self.gate_k[t], tau, gen, False)[self.slot_feature]
            m = torch.matmul(torch.matmul(q_oh * gq, s), (k_oh * gk).transpose(1, 2)) * visf
            out.append(_select_rows(m.clamp(0.0, 1.0), select, rows.order, hard=False))
            pairs = pairs + (gq.detach()[:, None] * s * gk.detach()[None, :]).sum()  # entries only, not gates
        if self.qgate is None:
            return _mix(self.mix, out, rows), pairs
        g = _gumbel_softmax(self.qgate, tau, gen, False)
        flag = torch.einsum("g,gbr->br", g, _query_flags(data, rows))
        return _gated(self.mix, self.mix_other, flag, out, rows), pairs


def _query_flags(data: _Data, rows: _Rows) -> torch.Tensor:
    """The gate flags of the sampled queries: float32 [G, B, R]."""
    sub = data.flags[:, rows.idx]
    return torch.gather(sub, 2, rows.qi[None].expand(sub.shape[0], -1, -1))


def _gated(mix_a: torch.Tensor, mix_b: torch.Tensor, flag: torch.Tensor, match_rows: list[torch.Tensor],
           rows: _Rows) -> torch.Tensor:
    """Rows whose query has the flag (``flag`` [B, R] in [0, 1]) take mixture A, the others mixture B."""
    return flag[..., None] * _mix(mix_a, match_rows, rows) + (1.0 - flag[..., None]) * _mix(mix_b, match_rows, rows)


def _mix(mix_logits: torch.Tensor, match_rows: list[torch.Tensor], rows: _Rows) -> torch.Tensor:
    """Mixture of match rows (never empty) and positional components with softmax weights."""
    w = torch.softmax(mix_logits, 0)
    T = len(match_rows)
    if rows.shared:  # mix the [T, N, N] components once, then take the sampled rows
        num = torch.einsum("t,tij->ij", w[T:], rows.pos)[rows.qi]
        den = torch.einsum("t,ti->i", w[T:], rows.pos_ne)[rows.qi]
    else:
        num = torch.einsum("t,tbij->bij", w[T:], rows.pos)
        den = torch.einsum("t,tbi->bi", w[T:], rows.pos_ne)
    for t, r in enumerate(match_rows):
        num = num + w[t] * r
        den = den + w[t]
    return num / den.clamp_min(_EPS)[..., None] * rows.vis


def _loss(pred: torch.Tensor, real: torch.Tensor, rows: _Rows, kind: str) -> torch.Tensor:
    """Mean over valid rows (kl, jsd) or over sequences (iou, on the sampled rows) of the discrepancy."""
    valid = rows.valid.float()
    if kind == "iou":
        inter = torch.minimum(pred, real).sum((1, 2))
        union = torch.maximum(pred, real).sum((1, 2)).clamp_min(_EPS)
        return 1.0 - (inter / union).mean()
    q = pred.clamp_min(1e-6) * rows.vis
    q = q / q.sum(-1, keepdim=True).clamp_min(_EPS)
    lp = torch.log(real.clamp_min(1e-30))
    if kind == "kl":
        per_row = (real * (lp - torch.log(q.clamp_min(1e-30)))).sum(-1)
    else:
        m = 0.5 * (real + q)
        lm = torch.log(m.clamp_min(1e-30))
        kl_p = (real * (lp - lm)).sum(-1)
        kl_q = (q * (torch.log(q.clamp_min(1e-30)) - lm)).sum(-1)
        per_row = torch.sqrt((0.5 * (kl_p + kl_q)).clamp_min(1e-8))
    return (per_row * valid).sum() / valid.sum().clamp_min(1.0)


def _hard_table(model: _Model, t: int, space: FeatureSpace, q: int | None = None, k: int | None = None) -> MatchTerm:
    """Term ``t`` discretized: argmax gates (or the given features) and the thresholded predicate block."""
    q = int(model.gate_q[t].argmax()) if q is None else q
    k = int(model.gate_k[t].argmax()) if k is None else k
    offs, sizes = space.offsets, space.sizes
    block = model.pred[t, offs[q]: offs[q] + sizes[q], offs[k]: offs[k] + sizes[k]].detach() > 0
    table = block.numpy().copy()
    table[-1, :] = False
    table[:, -1] = False
    return MatchTerm(q, k, table, model.selects[t])


def _hard_match(term: MatchTerm, data: _Data, space: FeatureSpace, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
    """bool match cells [B, R, N] of a discretized term and the local (query, key) values' flat pair index."""
    offs = space.offsets
    qv = torch.gather(data.slots[term.q][rows.idx], 1, rows.qi) - offs[term.q]
    kv = data.slots[term.k][rows.idx] - offs[term.k]
    m = torch.from_numpy(term.table)[qv[:, :, None], kv[:, None, :]] & rows.vis
    return m, qv[:, :, None] * term.table.shape[1] + kv[:, None, :]


def _prune(term: MatchTerm, data: _Data, space: FeatureSpace, real: torch.Tensor, max_pairs: int,
           chunk: int = 32) -> MatchTerm:
    """Drop pairs that select no key on synth; keep at most ``max_pairs`` by captured real attention mass.

    For ``closest``, a pair that only ever selects position 0 is dropped too: the no-match fallback goes
    there already, and any other match is closer.
    """
    if term.n_pairs == 0:
        return term
    size = term.table.size
    mass = torch.zeros(size, dtype=torch.float64)
    used = torch.zeros(size, dtype=torch.long)
    B, n = data.lengths.shape[0], data.n
    for b0 in range(0, B, chunk):
        idx = torch.arange(b0, min(B, b0 + chunk))
        rows = _rows(data, idx, torch.arange(n).expand(idx.shape[0], n))
        m, flat = _hard_match(term, data, space, rows)
        chosen = (_select_rows(m.float(), term.select, rows.order, hard=True) > 0) & m
        if term.select == "closest":  # choosing position 0 is what the fallback does anyway
            chosen[:, :, 0] = False
        sel = flat[chosen]
        mass.index_add_(0, sel, real[idx][chosen].double())
        used.index_add_(0, sel, torch.ones_like(sel))
    keep = (used > 0).reshape(term.table.shape).numpy() & term.table
    if keep.sum() > max_pairs:
        score = mass.numpy().copy()
        score[~keep.reshape(-1)] = -np.inf
        top = np.lexsort((np.arange(size), -score))[:max_pairs]
        keep = np.zeros(size, dtype=bool)
        keep[top] = True
        keep = keep.reshape(term.table.shape)
    return replace(term, table=keep)


def _block_search(model: _Model, space: FeatureSpace, data: _Data, rows: _Rows, target: torch.Tensor,
                  terms: list[MatchTerm], hard: list[torch.Tensor], cfg: LearnedConfig) -> None:
    """Per term, try every (query feature, key feature) block of the trained predicate in place of the gates'
    argmax and keep the one whose discretized mixture has the lowest ``refit_loss`` (in place).

    The gates settle early, while the temperature is high; a block the gates left behind (e.g. key=punct
    instead of key=token listing the frequent punctuation ids) may discretize better.
    """
    F_ = len(space.names)
    if model.qgate is None:
        def predict(comps: list[torch.Tensor]) -> torch.Tensor:
            return _mix(model.mix, comps, rows)
    else:
        flag = _query_flags(data, rows)[int(model.qgate.argmax())]

        def predict(comps: list[torch.Tensor]) -> torch.Tensor:
            return _gated(model.mix, model.mix_other, flag, comps, rows)
    for t in range(len(terms)):
        best = float(_loss(predict(hard), target, rows, cfg.refit_loss))
        for q in range(F_):
            for k in range(F_):
                if (q, k) == (terms[t].q, terms[t].k):
                    continue
                cand = _hard_table(model, t, space, q, k)
                if cand.n_pairs == 0:
                    continue
                cand_rows = _select_rows(_hard_match(cand, data, space, rows)[0].float(), cand.select, rows.order,
                                         hard=True)
                trial = hard[:t] + [cand_rows] + hard[t + 1:]
                loss = float(_loss(predict(trial), target, rows, cfg.refit_loss))
                if loss < best - 1e-6:
                    best, terms[t], hard[t] = loss, cand, cand_rows


def _round_weight(w: float) -> float:
    return float(f"{w:.4g}")


def fit_head(real: np.ndarray, data: _Data, space: FeatureSpace, cfg: LearnedConfig,
             seed: int = 0) -> list[LearnedHead]:
    """Fit, discretize and decompile one head from its synth patterns ``real`` [B, N, N] (float16/32).

    Returns the single-mixture model, then (with ``cfg.query_gate``) the query-gated one; both share the
    discretized match terms.
    """
    gen = torch.Generator().manual_seed(int(seed))
    n = data.n
    real_t = torch.from_numpy(np.ascontiguousarray(real[:, :n, :n]))
    specs = data.specs
    model = _Model(space, cfg, len(specs), gen)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history = []
    for step in range(cfg.steps):
        frac = step / max(cfg.steps - 1, 1)
        tau = cfg.tau_start * (cfg.tau_end / cfg.tau_start) ** frac
        rows = _sample_rows(data, cfg.batch_size, cfg.rows, gen)
        pred, pairs = model(data, rows, tau, gen)
        loss = _loss(pred, _gather_rows(real_t, rows).float(), rows, cfg.loss) + cfg.sparsity * frac * pairs
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))

    with torch.no_grad():  # discretize: argmax gates, threshold predicates, prune pairs
        rows = _sample_rows(data, 0, cfg.refit_rows, gen, all_seqs=True)
        target = _gather_rows(real_t, rows).float()
        terms = [_hard_table(model, t, space) for t in range(len(cfg.terms))]
        hard = [_select_rows(_hard_match(t, data, space, rows)[0].float(), t.select, rows.order, hard=True)
                for t in terms]
        if cfg.block_search:  # on a quarter of the refit rows: 2 x F^2 discretized mixtures to compare
            few = replace(rows, qi=rows.qi[:, ::4], valid=rows.valid[:, ::4], vis=rows.vis[:, ::4],
                          order=rows.order[:, ::4], pos=rows.pos if rows.shared else rows.pos[:, :, ::4],
                          pos_ne=rows.pos_ne if rows.shared else rows.pos_ne[:, :, ::4])
            _block_search(model, space, data, few, target[:, ::4], terms, [h[:, ::4] for h in hard], cfg)
        terms = [_prune(t, data, space, real_t, cfg.max_pairs) for t in terms]
        hard = [_select_rows(_hard_match(t, data, space, rows)[0].float(), t.select, rows.order, hard=True)
                for t in terms]
    T = len(terms)
    heads = []
    # refit the mixture weights on the discretized components: one mixture, then (optionally) two gated ones
    refits: list[tuple[str | None, list[torch.Tensor]]] = [(None, [model.mix.detach().clone()])]
    if model.qgate is not None:
        flag_idx = int(model.qgate.argmax())
        refits.append((data.gate_flags[flag_idx], [model.mix.detach().clone(), model.mix_other.detach().clone()]))
        flag_rows = _query_flags(data, rows)[flag_idx]
    for gate, init in refits:
        params = [torch.nn.Parameter(x) for x in init]
        opt2 = torch.optim.Adam(params, lr=cfg.lr)

        def predict(ws: list[torch.Tensor], comps: list[torch.Tensor], r: _Rows) -> torch.Tensor:
            return _mix(ws[0], comps, r) if gate is None else _gated(ws[0], ws[1], flag_rows, comps, r)

        for _ in range(cfg.refit_steps):
            loss = _loss(predict(params, hard, rows), target, rows, cfg.refit_loss)
            opt2.zero_grad()
            loss.backward()
            opt2.step()
        mixtures, logits, keeps = [], [], []
        for p in params:
            m, pos, w, keep_pos = _finalize(torch.softmax(p.detach(), 0).double().numpy(), terms, specs, cfg)
            mixtures.append((m, pos))
            logits.append(w)
            keeps.append(keep_pos)
        head = LearnedHead(space, data.causal, *mixtures[0], history=history)
        if gate is not None:
            head.gate = gate
            head.other_matches, head.other_positional = mixtures[1]
        with torch.no_grad():  # the loss of exactly the rounded, pruned discretized model
            if gate is None:
                pred = _mix(logits[0], hard, rows.select_pos(keeps[0]))
            else:
                pred = (flag_rows[..., None] * _mix(logits[0], hard, rows.select_pos(keeps[0]))
                        + (1 - flag_rows[..., None]) * _mix(logits[1], hard, rows.select_pos(keeps[1])))
            head.loss = float(_loss(pred, target, rows, cfg.refit_loss))
        heads.append(head)
    return heads


def _finalize(weights: np.ndarray, terms: list[MatchTerm], specs: list[str], cfg: LearnedConfig
              ) -> tuple[list[tuple[float, MatchTerm]], list[tuple[float, str]], torch.Tensor, list[int]]:
    """Fold empty match terms into first(), drop light terms, round; -> (matches, positional, logits, kept specs).

    The logits cover every match term (-inf where dropped) and the kept positional terms, so that
    ``_mix(logits, match_rows, rows.select_pos(kept))`` is exactly the rounded mixture.
    """
    T = len(terms)
    weights = weights.copy()
    first_at = specs.index("first()")
    for t, term in enumerate(terms):  # a match term with no pair left is first(): fold its weight there
        if term.n_pairs == 0:
            weights[T + first_at] += weights[t]
            weights[t] = 0.0
    weights = np.where(weights >= cfg.min_weight * weights.max(), weights, 0.0)
    weights = weights / weights.sum()
    rounded = np.array([_round_weight(w) for w in weights])
    matches = [(float(rounded[t]), terms[t]) for t in range(T) if rounded[t] > 0]
    keep_pos = [p for p in range(len(specs)) if rounded[T + p] > 0]
    positional = [(float(rounded[T + p]), specs[p]) for p in keep_pos]
    logits = torch.log(torch.tensor(np.concatenate([rounded[:T], rounded[T:][keep_pos]]), dtype=torch.float32))
    return matches, positional, logits, keep_pos


# ------------------------------------------------------------------------------------------------
# the searcher
# ------------------------------------------------------------------------------------------------

def _token_names(sequences: list[Sequence]) -> dict[int, str]:
    names: dict[int, str] = {}
    for s in sequences:
        for i, t in zip(s.ids.tolist(), s.tokens):
            names.setdefault(int(i), t)
    return names


def _batch(store: Any, indices: list[int], heads: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """``store.batch`` as float16 when the store supports a dtype (halves the memory), else as given."""
    try:
        return store.batch(indices, heads, dtype=np.float16)
    except TypeError:
        return store.batch(indices, heads)


def _score_chunk(store: Any, heads: list[tuple[int, int]], programs: list[list[Program]], indices: list[int],
                 names: tuple[str, ...], chunk: int = 64) -> list[list[dict[str, float]]]:
    """IoU and JSD of each head's programs against that head over ``indices`` (kernel evaluation)."""
    tot = [np.zeros((2, len(p))) for p in programs]
    for start in range(0, len(indices), chunk):
        idx = indices[start: start + chunk]
        seqs = [store.sequences[i] for i in idx]
        real, lengths = _batch(store, idx, heads)
        feats = feature_arrays(seqs, [n for n in names if n in _ARRAY_FEATURES])
        for h in range(len(heads)):
            cand = np.stack([p.evaluate(seqs, causal=store.causal, features=feats) for p in programs[h]])
            got = score_many(real[h: h + 1], cand, lengths, store.causal, ("iou", "jsd"))
            tot[h][0] += got["iou"][0] * len(idx)
            tot[h][1] += got["jsd"][0] * len(idx)
    return [[{"iou": float(t[0, p] / len(indices)), "jsd": float(t[1, p] / len(indices))}
             for p in range(t.shape[1])] for t in tot]


def _spread(indices: list[int], k: int) -> list[int]:
    """At most ``k`` of ``indices``, evenly spaced (deterministic)."""
    if len(indices) <= k:
        return list(indices)
    pick = np.linspace(0, len(indices) - 1, k).round().astype(int)
    return [indices[i] for i in pick]


def learned_search(store: Any, heads: _Seq[tuple[int, int]] | None = None, synth_idx: _Seq[int] | None = None,
                   select_idx: _Seq[int] | None = None, seed: int = 0, progress: bool = True,
                   steps: int | None = None, features: _Seq[str] | None = None,
                   config: LearnedConfig | None = None, threads: int | None = 1, head_chunk: int = 8,
                   return_models: bool = False) -> dict[tuple[int, int], list[Candidate]]:
    """Fit a learned categorical-predicate program per head; candidates scored on ``synth`` and ``select``.

    ``store`` needs ``.sequences``, ``.causal``, ``.heads`` and ``.batch(indices, heads) -> ([H,B,N,N],
    lengths)``. ``synth_idx`` (default: every sequence) fits, ``select_idx`` (optional) is only scored.
    ``features`` (default :data:`DEFAULT_FEATURES`; add ``"pos"`` for spaCy tags) and ``steps`` override
    ``config``. Per head the candidates are the full mixture and each match term alone, with IoU and JSD
    (kernel evaluation, :func:`headsurgeon.synth.metrics.score_many`) under ``scores["synth"]`` and
    ``scores["select"]``. Deterministic for a ``seed`` (each head's fit depends only on the seed, the
    head and the synth data); torch runs on ``threads`` threads (restored afterwards); patterns are read
    ``head_chunk`` heads at a time. With ``return_models`` each head maps to ``(candidates, [LearnedHead,
    ...])`` (the single mixture, then the query-gated one).
    """
    cfg = config or LearnedConfig()
    if steps is not None:
        cfg = replace(cfg, steps=int(steps))
    if features is not None:
        cfg = replace(cfg, features=tuple(features))
    heads = [(int(h[0]), int(h[1])) for h in (store.heads if heads is None else heads)]
    synth_idx = list(range(len(store.sequences)) if synth_idx is None else synth_idx)
    select_idx = list(select_idx or [])
    if not synth_idx:
        raise ValueError("learned_search needs synth sequences to fit on; pass synth_idx=[...]")
    if set(synth_idx) & set(select_idx):
        raise ValueError("synth_idx and select_idx share sequences; fit and select on disjoint splits")
    old_threads = torch.get_num_threads()
    try:
        return _search(store, heads, synth_idx, select_idx, seed, progress, cfg, threads, head_chunk, return_models)
    finally:
        torch.set_num_threads(old_threads)


def _search(store: Any, heads: list[tuple[int, int]], synth_idx: list[int], select_idx: list[int], seed: int,
            progress: bool, cfg: LearnedConfig, threads: int | None, head_chunk: int,
            return_models: bool) -> dict[tuple[int, int], Any]:
    """The body of :func:`learned_search` (which restores torch's thread count afterwards)."""
    if threads:
        torch.set_num_threads(int(threads))
    causal = bool(store.causal)
    fit_idx = _spread(synth_idx, cfg.max_synth)
    names = tuple(dict.fromkeys(cfg.features))
    fit_seqs = [store.sequences[i] for i in fit_idx]
    if any(n in SPACY_FEATURES for n in names):  # one spaCy pass over every sequence that will be read
        feature_arrays([store.sequences[i] for i in synth_idx + select_idx], [n for n in names if n in SPACY_FEATURES])
    _, fit_lengths = pad_ids(fit_seqs)
    fit_arrays = feature_arrays(fit_seqs, tuple(dict.fromkeys(names + cfg.query_gate)))
    space = FeatureSpace.fit(fit_arrays, fit_lengths, names, cfg.top_tokens, cfg.max_values)
    data = _make_data(space, fit_arrays, fit_lengths, positional_specs(cfg, causal), causal, cfg.query_gate)
    tokens = _token_names(fit_seqs)

    out: dict[tuple[int, int], Any] = {}
    bar = tqdm(total=len(heads), desc="learned", unit="head", disable=not progress)
    try:
        for c0 in range(0, len(heads), max(1, head_chunk)):
            chunk = heads[c0: c0 + max(1, head_chunk)]
            real, _ = _batch(store, fit_idx, chunk)
            models = []
            for h, head in enumerate(chunk):
                if threads:  # again each time: numba's OpenMP kernels (scoring) reset the shared thread count
                    torch.set_num_threads(int(threads))
                head_seed = (int(seed) * 1_000_003 + head[0] * 10_007 + head[1]) % (1 << 62)
                models.append(fit_head(real[h], data, space, cfg, seed=head_seed))
                bar.update(1)
            del real
            programs, hypotheses = [], []
            for fits in models:  # per head: each fitted model's program, then each match term alone
                progs: dict[str, tuple[Program, str]] = {}
                for m in fits:
                    progs.setdefault(m.program.hash, (m.program, m.hypothesis(tokens)))
                for m in fits:
                    for p in m.match_programs():
                        progs.setdefault(p.hash, (p, "match term alone: " + _first_line(p.text)))
                programs.append([p for p, _ in progs.values()])
                hypotheses.append([h for _, h in progs.values()])
            scores = {"synth": _score_chunk(store, chunk, programs, synth_idx, names)}
            if select_idx:
                scores["select"] = _score_chunk(store, chunk, programs, select_idx, names)
            for h, (head, fits) in enumerate(zip(chunk, models)):
                cands = [Candidate(head, prog, "learned", hypothesis=hypotheses[h][p_i],
                                   scores={s: v[h][p_i] for s, v in scores.items()})
                         for p_i, prog in enumerate(programs[h])]
                out[head] = (cands, fits) if return_models else cands
            if progress and select_idx:
                best = [max(c.scores["select"]["iou"] for c in (v[0] if return_models else v)) for v in out.values()]
                bar.set_postfix(mean_select_iou=f"{np.mean(best):.3f}")
    finally:
        bar.close()
    return out


def _first_line(text: str, width: int = 120) -> str:
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= width else text[: width - 3] + "..."
