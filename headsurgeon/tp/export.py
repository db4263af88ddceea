"""Bridge to surgery: a Transformer Program's heads as DSL programs (``headsurgeon.synth.program.Program``).

A categorical head whose Q and K read ``tokens`` or ``positions`` is exactly a DSL
``match(q=token|position, k=token|position, pairs=[[query value, accepted key value], ...])``: every
query value accepts one key value (its predicate row). Token values are the task vocabulary's ids
(``to_sequences`` builds ``Sequence`` objects with those ids), positions are 0-based.

Which key wins differs in one place: the DSL's ``select="closest"`` prefers the query itself (distance 0),
the Transformer Program ranks the query *last* (the paper's implementation). So

* when the predicate can never match a query's own position (same feature for Q and K, and no value
  accepts itself) the export is the compact ``match(..., select=closest)``;
* otherwise it is the exact distance-ordered form
  ``fallback(mul(M, prev(1)), mul(M, next(1)), mul(M, prev(2)), ..., mul(M, self()))`` with
  ``M = match(..., select=all)`` (``next`` terms dropped under a causal mask).

Either way a row with no match is empty, which the framework sends to position 0: the Transformer
Program's BOS default. The exported program's normalized pattern equals the head's hard attention
exactly (a test checks this on the task data).

Heads reading a derived variable (another head's output, an MLP's output) have no DSL feature to match
on; they are skipped and ``skipped_heads`` says why. A numerical head sums a value over *all* matching
keys; its selection, as an attention pattern, is uniform over those keys, which
``match(..., select=all)`` expresses exactly (the value weighting is not part of a pattern). They are
exported only with ``include_numerical=True``.
"""
from __future__ import annotations

import numpy as np

from ..synth.program import Program
from ..synth.sequence import Sequence
from .discrete import CatHead, DiscreteProgram, NumHead
from ..core import InputError

FEATURES = {"tokens": "token", "positions": "position"}


def _pairs(prog: DiscreteProgram, head: CatHead | NumHead) -> list[list[int]]:
    """``[query value, key value]`` for every query value that can occur and accepts a key value that can."""
    q_labels, k_labels = prog.value_labels[head.q], prog.value_labels[head.k]
    return [[a, c] for a, c in enumerate(head.pred) if q_labels[a] is not None and k_labels[c] is not None]


def _match(q: str, k: str, pairs: list[list[int]], select: str) -> str:
    return f"match(q={q}, k={k}, pairs={pairs}, select={select})"


def _self_can_match(head: CatHead | NumHead, pairs: list[list[int]]) -> bool:
    """Whether some query can accept its own position (impossible only for same-feature Q/K without a fixed point)."""
    if head.q != head.k:
        return True
    return any(a == c for a, c in pairs)


def head_program(prog: DiscreteProgram, head: CatHead | NumHead) -> Program:
    """The exact DSL program of one head whose Q and K read tokens/positions (see the module docstring)."""
    if head.q not in FEATURES or head.k not in FEATURES:
        raise InputError(f"{head.name} reads Q={head.q}, K={head.k}; only tokens/positions map to DSL features")
    q, k = FEATURES[head.q], FEATURES[head.k]
    pairs = _pairs(prog, head)
    if not pairs:
        return Program.parse("none()")
    if isinstance(head, NumHead):
        return Program.parse(_match(q, k, pairs, "all"))
    if not _self_can_match(head, pairs):
        return Program.parse(_match(q, k, pairs, "closest"))
    every = _match(q, k, pairs, "all")
    terms = []
    for d in range(1, prog.n_ctx):
        terms.append(f"mul({every}, prev({d}))")
        if not prog.causal:
            terms.append(f"mul({every}, next({d}))")
    terms.append(f"mul({every}, self())")
    return Program.parse(f"fallback({', '.join(terms)})")


def skipped_heads(prog: DiscreteProgram, include_numerical: bool = False) -> dict[str, str]:
    """Heads ``export_heads`` leaves out, with the reason."""
    out = {}
    heads = prog.cat_heads() + (prog.num_heads() if include_numerical else [])
    for h in heads:
        derived = [f"{role}={var}" for role, var in (("Q", h.q), ("K", h.k)) if var not in FEATURES]
        if derived:
            out[h.name] = (
                f"reads the derived variable(s) {', '.join(derived)}; the DSL can only match on token/position "
                "values, so this head has no exact DSL form"
            )
    return out


def export_heads(prog: DiscreteProgram, include_numerical: bool = False) -> dict[str, Program]:
    """``{head name: Program}`` for every categorical head (and numerical, if asked) reading tokens/positions."""
    heads = prog.cat_heads() + (prog.num_heads() if include_numerical else [])
    return {h.name: head_program(prog, h) for h in heads if h.q in FEATURES and h.k in FEATURES}


def to_sequences(x: np.ndarray, vocab: list[str]) -> list[Sequence]:
    """Task id rows (0 = PAD, position 0 = BOS) as ``Sequence`` objects whose ids are the task's token ids."""
    out = []
    for doc, row in enumerate(np.asarray(x)):
        ids = row[row != 0]
        tokens = [vocab[i] for i in ids]
        offsets: list[tuple[int, int]] = []
        parts: list[str] = []
        pos = 0
        for t_i, tok in enumerate(tokens):
            if t_i == 0:
                offsets.append((0, 0))
                continue
            if parts:
                pos += 1
            offsets.append((pos, pos + len(tok)))
            parts.append(tok)
            pos += len(tok)
        out.append(Sequence(ids=ids, tokens=tokens, text=" ".join(parts), offsets=np.array(offsets), doc=doc, has_bos=True))
    return out


def head_patterns(prog: DiscreteProgram, x: np.ndarray) -> dict[str, np.ndarray]:
    """The discretized model's attention per head ``[B, N, N]`` float32: one-hot rows for categorical heads,
    uniform over the matching keys for numerical heads (position 0 when none match), zero at PAD queries."""
    x = np.asarray(x)
    trace: dict = {}
    prog.predict(x, trace=trace)
    b, n = x.shape
    real = x != 0
    out = {}
    for h in prog.cat_heads():
        pat = np.zeros((b, n, n), dtype=np.float32)
        sel = trace[f"{h.name}_selected"]
        bi, qi = np.nonzero(real)
        pat[bi, qi, sel[bi, qi]] = 1.0
        out[h.name] = pat
    keymask = real[:, None, :] & real[:, :, None]
    if prog.causal:
        keymask &= np.tri(n, dtype=bool)[None]
    for nh in prog.num_heads():
        want = np.asarray(nh.pred)[trace[nh.q]]
        m = ((want[:, :, None] == trace[nh.k][:, None, :]) & keymask).astype(np.float32)
        cnt = m.sum(-1, keepdims=True)
        m[..., 0] += ((cnt[..., 0] == 0) & real).astype(np.float32)
        out[nh.name] = m / np.maximum(m.sum(-1, keepdims=True), 1.0)
    return out
