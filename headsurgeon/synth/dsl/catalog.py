"""The DSL's primitives and combinators, each declared once: parameters, features, kernel, cost, doc, gloss.

Every other part of the DSL (parser checks, reference evaluator, JSON, docs tables, the LLM prompt's
reference, ``gloss``) reads these declarations through the registries of headsurgeon/synth/dsl/spec.py. Each kernel
adapter turns a node and the evaluation context into a call of a numba kernel in
``headsurgeon.kernels.primitives``; ``causal`` is the model's mask policy and every kernel scores only
visible keys. Primitives of small ``support`` (a bound on the keys of a row, or ``COUNTED``) also give a
``sparse`` adapter writing compressed rows (headsurgeon/kernels/primitives/sparse_prims.py); the combinators' ``sparse``
kernels combine those (headsurgeon/synth/dsl/sparse.py decides which form a tree takes). The primitives the enumerative
searcher fits give a ``cells`` adapter scoring a fit set's compact cells, and every combinator one composing them
(headsurgeon/synth/dsl/cell_combinators.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from headsurgeon.kernels import primitives as kernels

from .bounds import _err
from .cell_combinators import (FALLBACK_CELLS, GATE_CELLS, MIX_CELLS, MUL_CELLS, SHARPEN_CELLS, SUM_CELLS,
                               Cells)
from .context import Context
from .nodes import Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum
from .sparse_combinators import fallback_sparse, gate_sparse, mix_sparse, mul_sparse, sharpen_sparse, sum_sparse
from .spec import COUNTED, CombinatorSpec, Param, PrimitiveSpec, register_combinator, register_primitive

__all__ = ["class_tables", "sharpen_exponents"]


def _primitive(name: str, params: tuple[Param, ...], kernel: Callable[[Prim, Context], np.ndarray], doc: str,
               gloss: str, **extra: Any) -> None:
    register_primitive(PrimitiveSpec(name, params, kernel, doc, gloss, **extra))


# --------------------------------------------------------------------------------------------
# positional primitives
# --------------------------------------------------------------------------------------------

_primitive("self", (), lambda node, ctx: kernels.score_self(ctx.lengths, ctx.n, ctx.causal, out=ctx.buf()),
           "the query itself", "attends to itself", support=1, position=lambda node, i, j: (i == j).double(),
           sparse=lambda node, ctx: kernels.sparse_self(ctx.lengths, ctx.n, ctx.causal, *ctx.leaf()))
_primitive("prev", (Param("k", "offset", 1),),
           lambda node, ctx: kernels.score_prev(ctx.lengths, ctx.n, node.param("k"), ctx.causal, out=ctx.buf()),
           "key i-k", "attends to the token {k} positions back", json_scalar=True,
           gloss_cases=(((("k", 1),), "attends to the previous token"),), support=1,
           position=lambda node, i, j: (j == i - node.param("k")).double(),
           sparse=lambda node, ctx: kernels.sparse_prev(ctx.lengths, ctx.n, node.param("k"), ctx.causal, *ctx.leaf()))
_primitive("next", (Param("k", "offset", 1),),
           lambda node, ctx: kernels.score_next(ctx.lengths, ctx.n, node.param("k"), ctx.causal, out=ctx.buf()),
           "key i+k (sees anything only without a causal mask)", "attends to the token {k} positions ahead",
           json_scalar=True, gloss_cases=(((("k", 1),), "attends to the next token"),), support=1,
           position=lambda node, i, j: (j == i + node.param("k")).double(),
           sparse=lambda node, ctx: kernels.sparse_next(ctx.lengths, ctx.n, node.param("k"), ctx.causal, *ctx.leaf()))
_primitive("first", (), lambda node, ctx: kernels.score_first(ctx.lengths, ctx.n, ctx.causal, out=ctx.buf()),
           "position 0 (BOS)", "attends to the first token", support=1, position=lambda node, i, j: (j == 0).double(),
           sparse=lambda node, ctx: kernels.sparse_first(ctx.lengths, ctx.n, ctx.causal, *ctx.leaf()))


def _window_order(params: Mapping[str, Any]) -> None:
    if params["a"] > params["b"]:
        raise _err(f"window(a, b) needs a <= b; got a={params['a']}, b={params['b']}")


_primitive("window", (Param("a", "int"), Param("b", "int")),
           lambda node, ctx: kernels.score_window(ctx.lengths, ctx.n, node.param("a"), node.param("b"), ctx.causal,
                                                  out=ctx.buf()),
           "keys at offsets a..b behind the query (j = i-d, a <= d <= b; d < 0 looks ahead)",
           "attends to the tokens {a} to {b} positions back", check=_window_order,
           support=lambda node: node.param("b") - node.param("a") + 1,
           sparse=lambda node, ctx: kernels.sparse_window(ctx.lengths, ctx.n, node.param("a"), node.param("b"),
                                                          ctx.causal, *ctx.leaf()))
def _decay_position(node: Prim, i: Any, j: Any) -> Any:
    distance = (i - j).abs().double()
    return distance.new_tensor(node.param("rate")) ** distance  # float64 rate ** |i-j|, as torch computes it


_primitive("decay", (Param("rate", "rate"),),
           lambda node, ctx: kernels.score_decay(ctx.lengths, ctx.n, node.param("rate"), ctx.causal, out=ctx.buf()),
           "rate**|i-j| over visible keys, 0 < rate <= 1",
           "attends to nearby tokens, the weight shrinking by a factor {rate} per position", position=_decay_position)
_primitive("uniform", (), lambda node, ctx: kernels.score_uniform(ctx.lengths, ctx.n, ctx.causal, out=ctx.buf()),
           "every visible key", "attends evenly to every token it sees", position=lambda node, i, j: (j >= 0).double())
_primitive("none", (), lambda node, ctx: kernels.score_none(ctx.lengths, ctx.n, ctx.causal, out=ctx.buf()),
           "nothing (the row falls back to position 0)", "attends to nothing (so to the first token)", support=0,
           sparse=lambda node, ctx: kernels.sparse_none(ctx.lengths, ctx.n, ctx.causal, *ctx.leaf()))


def _profile(node: Prim, ctx: Context) -> np.ndarray:
    bos = node.param("bos")
    return kernels.score_profile(ctx.lengths, ctx.n, np.asarray(node.param("w"), dtype=np.float32),
                                 node.param("tail"), -1.0 if bos is None else bos, ctx.causal, out=ctx.buf())


def _profile_cells(node: Prim, cells: Cells) -> np.ndarray:
    w = np.asarray(node.param("w"), dtype=np.float32)
    d = cells.cell_d
    v = np.where(d < len(w), w[np.clip(d, 0, len(w) - 1)], np.float32(node.param("tail")))
    v = np.where(d < 0, np.float32(0.0), v).astype(np.float32)
    if node.param("bos") is not None:
        v[cells.cell_first] = np.float32(node.param("bos"))
    return v


_primitive("profile", (Param("w", "weights"), Param("tail", "nonneg", 0.0), Param("bos", "optnonneg", None)),
           _profile,
           "a positional profile: key j = i-d scores w[d] for d < len(w), else tail (default 0); key 0 scores "
           "bos if given; keys ahead of the query score 0",
           "attends by distance, weighing {bos}{w}; farther tokens {tail}", keywords=True, cells=_profile_cells)

# --------------------------------------------------------------------------------------------
# token primitives
# --------------------------------------------------------------------------------------------

_primitive("same_token", (),
           lambda node, ctx: kernels.score_same_token(ctx.ids, ctx.lengths, ctx.causal, out=ctx.buf()),
           "earlier occurrences of the query's token (non-causal: all other occurrences)",
           "attends to earlier occurrences of its own token", support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_same_token(ctx.ids, ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("same_token_recent", (),
           lambda node, ctx: kernels.score_same_token_recent(ctx.ids, ctx.lengths, ctx.causal, out=ctx.buf()),
           "the most recent earlier occurrence of the query's token",
           "attends to the most recent earlier occurrence of its own token", support=1,
           sparse=lambda node, ctx: kernels.sparse_same_token_recent(ctx.ids, ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("induction", (),
           lambda node, ctx: kernels.score_induction(ctx.ids, ctx.lengths, ctx.causal, out=ctx.buf()),
           "the key right after an earlier occurrence of the query's token",
           "attends to the token that followed an earlier occurrence of its own token (induction)", support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_induction(ctx.ids, ctx.lengths, ctx.causal, *ctx.leaf()))


def _ngram_order(params: Mapping[str, Any]) -> None:
    if params["n"] < 2 or params["n"] > MAX_NGRAM:
        raise _err(f"ngram_induction(n) needs 2 <= n <= {MAX_NGRAM} (n=1 is induction()); got n={params['n']}")


MAX_NGRAM = 8  # longer matches than this are rare in text and cost n comparisons per key
_primitive("ngram_induction", (Param("n", "offset", 2),),
           lambda node, ctx: kernels.score_ngram_induction(ctx.ids, ctx.lengths, node.param("n"), ctx.causal,
                                                           out=ctx.buf()),
           "the key right after an earlier occurrence of the query's last n tokens (n-gram induction; 2 <= n <= 8)",
           "attends to the token that followed an earlier occurrence of its last {n} tokens (induction on {n} "
           "tokens)", json_scalar=True, check=_ngram_order, support=COUNTED,
           gloss_cases=(((("n", 2),), "attends to the token that followed an earlier occurrence of its last two "
                                      "tokens (two-token induction)"),),
           sparse=lambda node, ctx: kernels.sparse_ngram_induction(ctx.ids, ctx.lengths, node.param("n"), ctx.causal,
                                                                   *ctx.leaf()))
_primitive("key_in_set", (Param("ids", "ids"),),
           lambda node, ctx: kernels.score_keys(ctx.pred_mask(Pred("ids", node.param("ids"))), ctx.lengths,
                                                ctx.causal, out=ctx.buf()),
           "every visible key whose token id is in the set (tokens=[..]: by token strings)", "attends to every {ids}",
           keywords=True, support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_keys(ctx.pred_mask(Pred("ids", node.param("ids"))), ctx.lengths,
                                                        ctx.causal, *ctx.leaf()),
           cells=lambda node, cells: np.isin(cells.cell_key,
                                             np.asarray(node.param("ids"), dtype=np.int64)).astype(np.float32))
_primitive("recent", (Param("pred", "pred"),),
           lambda node, ctx: kernels.score_recent(ctx.pred_mask(node.param("pred")), ctx.lengths, ctx.causal,
                                                  out=ctx.buf()),
           "the most recent key j <= i satisfying PRED", "attends to the most recent {pred}", support=1,
           sparse=lambda node, ctx: kernels.sparse_recent(ctx.pred_mask(node.param("pred")),
                                                          ctx.lengths, ctx.causal, *ctx.leaf()))


def _key_weight(node: Prim, ctx: Context) -> np.ndarray:
    """A class table with one query class and one key class per listed token."""
    table = node.param("w")
    tids = np.array([t for t, _ in table], dtype=np.int64)
    row = np.append(np.array([w for _, w in table], dtype=np.float32), np.float32(node.param("default")))
    idx = kernels.value_index(ctx.ids, tids)
    kc = np.where(idx >= 0, idx, len(tids))
    return kernels.score_class_table(np.zeros_like(kc), kc, row[None, :], ctx.lengths, ctx.causal, out=ctx.buf())


def _key_weight_cells(node: Prim, cells: Cells) -> np.ndarray:
    table = node.param("w")
    tids = np.array([t for t, _ in table], dtype=np.int64)
    wts = np.array([w for _, w in table], dtype=np.float32)
    idx = kernels.value_index(cells.cell_key, tids)
    return np.where(idx >= 0, wts[np.maximum(idx, 0)], np.float32(node.param("default"))).astype(np.float32)


_primitive("key_weight", (Param("w", "idweights"), Param("default", "nonneg", 1.0)), _key_weight,
           "every visible key scores the weight of its token id (listed ids), else default (default 1); "
           "mul(profile(..), key_weight(..)) adds position and key-token logits",
           "weighs each key by its token ({w}; other tokens ×{default})", cost=2, keywords=True,
           cells=_key_weight_cells)


def class_tables(node: Prim, query_ids: np.ndarray, key_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Query classes of ``query_ids``, key classes of ``key_ids`` and the padded table of ``class_weight``:
    the extra last row / column (tokens in no class) holds ``default``."""
    def classes_of(classes: tuple[tuple[int, ...], ...], ids: np.ndarray) -> np.ndarray:
        vocab = np.array([t for cls in classes for t in cls], dtype=np.int64)
        label = np.array([c for c, cls in enumerate(classes) for _ in cls], dtype=np.int64)
        order = np.argsort(vocab)
        idx = kernels.value_index(ids, vocab[order])
        return np.where(idx >= 0, label[order][np.maximum(idx, 0)], len(classes))

    q, k = node.param("q"), node.param("k")
    table = np.full((len(q) + 1, len(k) + 1), node.param("default"), dtype=np.float32)
    table[:-1, :-1] = np.asarray(node.param("w"), dtype=np.float32).reshape(len(q), len(k))
    return classes_of(q, query_ids), classes_of(k, key_ids), table


def _class_weight(node: Prim, ctx: Context) -> np.ndarray:
    qc, kc, table = class_tables(node, ctx.ids, ctx.ids)
    return kernels.score_class_table(qc, kc, table, ctx.lengths, ctx.causal, out=ctx.buf())


def _class_weight_cells(node: Prim, cells: Cells) -> np.ndarray:
    qc, kc, table = class_tables(node, cells.row_tok, cells.cell_key)
    return table[qc[cells.row_of_cell], kc]


_primitive("class_weight", (Param("q", "idclasses"), Param("k", "idclasses"), Param("w", "matrix"),
                            Param("default", "nonneg", 1.0)), _class_weight,
           "token classes (disjoint id lists): every visible key scores w[c][e] where the query token is in "
           "class q[c] and the key token in class k[e], default (default 1) when either is in no class",
           "weighs each key by its token's class and the query's ({w}; other pairs ×{default})",
           cost=2, keywords=True, cells=_class_weight_cells)


def _match_args(node: Prim, ctx: Context) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """``match``'s query and key value indices, its pair table and whether it keeps only the closest key."""
    qf, kf = node.param("q"), node.param("k")
    pairs = np.array([(ctx.value_id(qf, a), ctx.value_id(kf, b)) for a, b in node.param("pairs")],
                     dtype=np.int64).reshape(-1, 2)
    qvocab, qinv = np.unique(pairs[:, 0], return_inverse=True)
    kvocab, kinv = np.unique(pairs[:, 1], return_inverse=True)
    table = np.zeros((qvocab.size, kvocab.size), dtype=np.bool_)
    table[qinv.reshape(-1), kinv.reshape(-1)] = True
    qidx = kernels.value_index(ctx.feature(node.param("q")), qvocab)
    kidx = kernels.value_index(ctx.feature(node.param("k")), kvocab)
    return qidx, kidx, table, node.param("select") == "closest"


def _match(node: Prim, ctx: Context) -> np.ndarray:
    qidx, kidx, table, closest = _match_args(node, ctx)
    return kernels.score_match(qidx, kidx, table, ctx.lengths, closest, ctx.causal, out=ctx.buf())


def _match_sparse(node: Prim, ctx: Context) -> Any:
    qidx, kidx, table, closest = _match_args(node, ctx)
    return kernels.sparse_match(qidx, kidx, table, ctx.lengths, closest, ctx.causal, *ctx.leaf())


_primitive("match", (Param("q", "feature"), Param("k", "feature"), Param("pairs", "pairs"),
                     Param("select", "select", "closest")), _match,
           "keys whose (query value, key value) pair is listed; closest keeps only the nearest (largest j <= i "
           "when causal, else smallest |i-j|, ties to the left); pos values may be tag names, dep values label names",
           "attends to {select} whose {k} pairs with its own {q} (query → key: {pairs})", cost=2, keywords=True,
           support=lambda node: 1 if node.param("select") == "closest" else COUNTED, sparse=_match_sparse)

# --------------------------------------------------------------------------------------------
# structure primitives (word, sentence and dependency arrays)
# --------------------------------------------------------------------------------------------

_primitive("sentence_start", (),
           lambda node, ctx: kernels.score_group_start(ctx.feature("sent"), ctx.lengths, ctx.causal, out=ctx.buf()),
           "the first token of the query's sentence", "attends to the start of its sentence", features=("sent",),
           support=1,
           sparse=lambda node, ctx: kernels.sparse_group_start(ctx.feature("sent"),
                                                               ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("word_start", (),
           lambda node, ctx: kernels.score_group_start(ctx.feature("word"), ctx.lengths, ctx.causal, out=ctx.buf()),
           "the first token of the query's word", "attends to the start of its word", features=("word",),
           support=1,
           sparse=lambda node, ctx: kernels.sparse_group_start(ctx.feature("word"),
                                                               ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("same_word", (),
           lambda node, ctx: kernels.score_same_group(ctx.feature("word"), ctx.lengths, ctx.causal, out=ctx.buf()),
           "every visible token of the query's word (the query included)", "attends to the tokens of its own word",
           features=("word",), support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_same_group(ctx.feature("word"),
                                                              ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("same_lemma", (),
           lambda node, ctx: kernels.score_same_value(ctx.feature("lemma"), ctx.lengths, ctx.causal, out=ctx.buf()),
           "the other visible tokens with the query's lemma (earlier ones when causal; tokens without a lemma "
           "match nothing)", "attends to other tokens with its own lemma", features=("lemma",), support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_same_value(ctx.feature("lemma"),
                                                              ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("dep_head", (),
           lambda node, ctx: kernels.score_dep_head(ctx.feature("dep_head"), ctx.lengths, ctx.causal, out=ctx.buf()),
           "the token holding the query's dependency head", "attends to its dependency head",
           features=("dep_head",), support=1,
           sparse=lambda node, ctx: kernels.sparse_dep_head(ctx.feature("dep_head"),
                                                            ctx.lengths, ctx.causal, *ctx.leaf()))
_primitive("dep_children", (),
           lambda node, ctx: kernels.score_dep_children(ctx.feature("dep_head"), ctx.lengths, ctx.causal,
                                                        out=ctx.buf()),
           "the tokens whose dependency head is the query", "attends to its dependency children",
           features=("dep_head",), support=COUNTED,
           sparse=lambda node, ctx: kernels.sparse_dep_children(ctx.feature("dep_head"),
                                                                ctx.lengths, ctx.causal, *ctx.leaf()))

# --------------------------------------------------------------------------------------------
# combinators
# --------------------------------------------------------------------------------------------


def _mix(node: Mix, ctx: Context) -> np.ndarray:
    (w0, t0), rest = node.terms[0], node.terms[1:]
    out = ctx.eval(t0)
    kernels.mix_scale(out, float(w0))
    for w, t in rest:
        part = ctx.eval(t)
        kernels.mix_accumulate(out, part, float(w))
        ctx.release(part)
    return out


def _tail(clause: str) -> str:
    """A clause after its first one: "attends to X" reads "to X"."""
    return clause[len("attends "):] if clause.startswith("attends to ") else clause


def _and(parts: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _share(x: float) -> str:
    """A share as a percentage ("70%", "<1%")."""
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def _flat_terms(node: Mix, part: float = 1.0) -> list[tuple[float, Any]]:
    """A mixture's terms as (fraction of the mixture, term), nested mixtures multiplied out."""
    total = sum(w for w, _ in node.terms)
    out: list[tuple[float, Any]] = []
    for w, t in node.terms:
        out += _flat_terms(t, part * w / total) if isinstance(t, Mix) else [(part * w / total, t)]
    return out


def _portion(share: float | None) -> str:
    """The " (40%)" after a clause that is that share of the row; nothing for the whole row or an unknown share."""
    return f" ({_share(share)})" if share is not None and share < 1.0 - 1e-9 else ""


def _states_shares(node: Node) -> bool:
    """Whether a clause states its own shares of the row (mixtures, and gates and fallbacks choosing per row)."""
    return isinstance(node, (Mix, Gate, Fallback))


def _mix_gloss(node: Mix, gloss: Callable[..., str]) -> dict[str, str]:
    """Each term once, at its share of the row (nested mixtures multiplied out, so no "60% of (40% ...)")."""
    base = getattr(gloss, "share", 1.0)
    terms = _flat_terms(node)
    if len(terms) == 1:
        return {"terms": gloss(terms[0][1])}
    parts = []
    for k, (frac, t) in enumerate(terms):
        share = None if base is None else base * frac
        clause = gloss(t, share=share)
        clause = clause if k == 0 else _tail(clause)
        if base is None:
            parts.append(f"{clause} (weight {float(f'{frac:.2g}'):g})")
        else:
            parts.append(clause if _states_shares(t) else clause + _portion(share))
    return {"terms": _and(parts)}


def _inner(gloss: Callable[..., str]) -> float | None:
    """The share a product's or sharpen's argument gets: the whole row at the root, else undefined (None)."""
    return 1.0 if getattr(gloss, "share", 1.0) == 1.0 else None


def _branch(gloss: Callable[..., str], node: Node) -> str:
    """A gate's or fallback's branch, with the share of the row it stands for when inside a mixture."""
    clause = gloss(node)
    return clause if _states_shares(node) else clause + _portion(getattr(gloss, "share", 1.0))


def _sum(node: Sum, ctx: Context) -> np.ndarray:
    (w0, t0), rest = node.terms[0], node.terms[1:]
    out = ctx.eval(t0)
    kernels.raw_scale(out, float(w0))
    for w, t in rest:
        part = ctx.eval(t)
        kernels.raw_accumulate(out, part, float(w))
        ctx.release(part)
    kernels.row_normalize(out)
    return out


def _sum_gloss(node: Sum, gloss: Callable[..., str]) -> dict[str, str]:
    weighted = any(w != 1.0 for w, _ in node.terms)
    parts = []
    for k, (w, t) in enumerate(node.terms):
        clause = gloss(t, share=None)  # raw scores added up: no shares of the row inside
        clause = clause if k == 0 else _tail(clause)
        parts.append(f"{clause} (weight {float(f'{w:.2g}'):g})" if weighted else clause)
    return {"terms": _and(parts)}


def _article(phrase: str) -> str:
    """``phrase`` with "a"/"an" in front, unless it is a quoted token."""
    if phrase.startswith("'"):
        return phrase
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def _fallback(node: Fallback, ctx: Context) -> np.ndarray:
    out = ctx.eval(node.args[0])
    for alt in node.args[1:]:
        if not kernels.empty_rows(out).any():
            break
        part = ctx.eval(alt)
        kernels.fallback_rows(out, part)
        ctx.release(part)
    return out


def _gate(node: Gate, ctx: Context) -> np.ndarray:
    qmask = ctx.pred_mask(node.pred)
    inside = np.arange(ctx.n)[None, :] < ctx.lengths[:, None]
    if not (qmask & inside).any():
        return ctx.eval(node.other)
    out = ctx.eval(node.then)
    if not (qmask | ~inside).all():
        part = ctx.eval(node.other)
        kernels.gate_rows(qmask, out, part)
        ctx.release(part)
    return out


def sharpen_exponents(node: Sharpen, ids: np.ndarray) -> np.ndarray:
    """float64 exponent per query token of ``sharpen(A, t, by=...)``: one sorted lookup, whatever the class count."""
    vocab = np.array([t for _, cls in node.by for t in cls], dtype=np.int64)
    exps = np.array([tk for tk, cls in node.by for _ in cls], dtype=np.float64)
    order = np.argsort(vocab, kind="stable")
    idx = kernels.value_index(ids, vocab[order])
    return np.ascontiguousarray(np.where(idx >= 0, exps[order][np.maximum(idx, 0)], float(node.t)))


def _sharpen(node: Sharpen, ctx: Context) -> np.ndarray:
    out = ctx.eval(node.arg)
    if node.by:
        kernels.sharpen_rows_by(out, sharpen_exponents(node, ctx.ids))
    else:
        kernels.sharpen_rows(out, float(node.t))
    return out


def _mul(node: Mul, ctx: Context) -> np.ndarray:
    out = ctx.eval(node.args[0])
    for other in node.args[1:]:
        part = ctx.eval(other)
        kernels.multiply(out, part)
        ctx.release(part)
    return out


register_combinator(CombinatorSpec(
    "mix", Mix, "w1*A + w2*B + ...", "1 to MAX_NODES terms, weights 0 < w <= MAX_WEIGHT (1e30)", _mix,
    "the sum of the row-normalized components, weights finite and > 0 (0.7*prev(1) + 0.3*first() puts 0.7 on "
    "the previous token and 0.3 on BOS whatever the components' scales; an empty row contributes nothing)",
    "{terms}", _mix_gloss, cost=1, cost_per_child=True, sparse=mix_sparse, cells=MIX_CELLS))
register_combinator(CombinatorSpec(
    "sum", Sum, "sum(w1*A, w2*B, ...)", "1 to MAX_NODES terms, weights 0 < w <= MAX_WEIGHT (1e30)", _sum,
    "the weighted sum of the components' raw scores, each row normalized once at the end (EAPS's \"add raw "
    "weights, then normalize each row\"; a weight of 1 may be left out: sum(2*prev(1), first()))",
    "{terms}, adding up raw scores", _sum_gloss, cost=1, cost_per_child=True, sparse=sum_sparse, cells=SUM_CELLS))
register_combinator(CombinatorSpec(
    "fallback", Fallback, "fallback(A, B, ...)", "2 to MAX_NODES arguments", _fallback,
    "per row, the first argument whose row is non-empty",
    "{first}, otherwise {rest}",
    lambda node, gloss: {"first": _branch(gloss, node.args[0]),
                         "rest": ", otherwise ".join(_tail(_branch(gloss, a)) for a in node.args[1:])}, cost=2,
    cost_per_child=True, sparse=fallback_sparse, support=max, cells=FALLBACK_CELLS))
register_combinator(CombinatorSpec(
    "gate", Gate, "gate(PRED, A, B)", "PRED as for recent; ids=[..]: 1 to MAX_IDS (65536) token ids", _gate,
    "rows whose query satisfies PRED take A, the others B (gate(tok(\"Lily\"), A, B) / gate(ids=[..], A, B) is the "
    "query-in-set gate)",
    "when the query is {pred}, {then}; otherwise {other}",
    lambda node, gloss: {"pred": _article(gloss(node.pred)), "then": _branch(gloss, node.then),
                         "other": _tail(_branch(gloss, node.other))}, cost=2, sparse=gate_sparse, support=max,
    cells=GATE_CELLS))
register_combinator(CombinatorSpec(
    "sharpen", Sharpen, "sharpen(A, t) / sharpen(A, t, by=[[t1, [ids..]], ..])",
    "0 < t <= MAX_EXPONENT (1e6); by: 1 to MAX_CLASSES (256) disjoint classes, MAX_IDS (65536) ids in all",
    _sharpen,
    "A**t, renormalized per row (t > 0); with by, queries whose token is in a listed (disjoint) id set take "
    "that set's exponent instead",
    "{arg}, sharpened to the power {t}",
    lambda node, gloss: {"arg": gloss(node.arg, share=_inner(gloss)),
                         "t": f"{float(f'{node.t:.2g}'):g}" + (" (per query token class)" if node.by else "")},
    cost=4, sparse=lambda node, ctx: sharpen_sparse(node, ctx, sharpen_exponents), support=max, cells=SHARPEN_CELLS))
register_combinator(CombinatorSpec(
    "mul", Mul, "mul(A, B, ...)", "2 to MAX_NODES arguments", _mul,
    "elementwise product (intersection of supports); mul(profile, key_weight, class_weight) adds them as logits",
    "{args}, the scores multiplied",
    lambda node, gloss: {"args": _and([gloss(a, share=_inner(gloss)) if k == 0 else
                                       _tail(gloss(a, share=_inner(gloss))) for k, a in enumerate(node.args)])},
    cost=1, cost_per_child=True, sparse=mul_sparse, support=min, cells=MUL_CELLS))

