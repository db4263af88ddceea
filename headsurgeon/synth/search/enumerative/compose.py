"""Compositions proposed per head from the fit set: fitted mixtures, query gates, fallbacks, sharpened rows and
softmax tables, as DSL trees."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ... import dsl
from ...program import Program
from .fitset import MIN_WINDOWS, FitSet
from .mixtures import GramStats, beam_mixtures, mix_node
from .tables import QUERY_PROFILES, TABLE_CLASSES, fit_loglinear


def sparse_primitives(library: list[Program]) -> list[int]:
    """Library positions of primitives whose rows may be empty (candidates for ``fallback``)."""
    dense = {"self", "first", "uniform", "decay", "sentence_start", "word_start", "same_word"}
    return [k for k, p in enumerate(library) if isinstance(p.node, dsl.Prim) and p.node.name not in dense]


def fallback_rules(fs: FitSet, library: list[Program]) -> list[int]:
    """The sparse primitives that fire in at least MIN_WINDOWS fit windows: a fallback on a rule that never fires
    equals its anchor on the fit set and acts only on text the search never saw."""
    return [p for p in sparse_primitives(library) if fs.prim_windows[p] >= MIN_WINDOWS]


def hypothesis(program: Program) -> str:
    """A one-line description of a found program."""
    node = program.node
    if isinstance(node, dsl.Prim):
        return f"attends by the single rule {program.text}"
    if isinstance(node, dsl.Mix):
        return f"a fitted mixture of {len(node.terms)} rules"
    if isinstance(node, dsl.Gate):
        return "query-dependent: one mixture where the query satisfies the gate, another elsewhere"
    if isinstance(node, dsl.Fallback):
        return "a sparse rule where it applies, a fitted mixture elsewhere"
    if isinstance(node, dsl.Sharpen):
        return "a fitted mixture with sharpened/flattened rows"
    return "composed rule"


def walk(node: dsl.Node) -> Iterable[dsl.Node]:
    """Every node of the tree, depth first."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        stack.extend(dsl.children(cur))


def used_primitives(nodes: list[dsl.Node], library: list[Program]) -> list[Program]:
    """The library primitives appearing in the trees, in library order."""
    seen = {n for node in nodes for n in walk(node) if isinstance(n, dsl.Prim)}
    return [p for p in library if p.node in seen]


def used_preds(nodes: list[dsl.Node], preds: list[dsl.Pred]) -> list[dsl.Pred]:
    """The query predicates gating the trees, in ``preds`` order."""
    seen = {n.pred for node in nodes for n in walk(node) if isinstance(n, dsl.Gate)}
    return [p for p in preds if p in seen]


def best_single_loss(st: GramStats, h: int) -> float:
    """Least-squares loss of the best one-primitive fit (``pp - r_k^2 / G_kk`` over r_k > 0)."""
    diag = np.diag(st.G)
    gain = np.where((st.R[h] > 0) & (diag > 0), st.R[h] ** 2 / np.where(diag > 0, diag, 1.0), 0.0)
    return float(st.pp[h] - gain.max(initial=0.0))


def mixture(nodes: list[dsl.Node], support: tuple[int, ...], w: np.ndarray) -> dsl.Node | None:
    """The rounded mix of ``nodes[support]`` with weights ``w`` (None when every weight rounds to 0)."""
    return mix_node([(float(x), nodes[j]) for x, j in zip(w, support)])


def extend(st: GramStats, fs: FitSet, h: int, m: np.ndarray) -> GramStats:
    """Head h's statistics with one more component ``m`` [C] (row-normalized) appended."""
    P = st.G.shape[0]
    gm = (fs.X @ m).astype(np.float64)
    G = np.empty((P + 1, P + 1))
    G[:P, :P] = st.G
    G[:P, P] = G[P, :P] = gm
    G[P, P] = float(m.astype(np.float64) @ m)
    R = np.concatenate([st.R[h], [float(fs.real[h].astype(np.float64) @ m)]])[None]
    return GramStats(G, R, st.pp[h: h + 1])


def propose(fs: FitSet, hi: int, tot: GramStats, groups: list[GramStats], nodes: list[dsl.Node],
             sparse: list[int], beam: int, max_terms: int, gates: int,
             keys: np.ndarray | None = None) -> list[dsl.Node]:
    """Every composition the search tries for one head (DSL trees, deduplicated, in a stable order)."""
    P = len(nodes)
    allowed = np.ones(P, dtype=bool)
    props: list[dsl.Node] = []
    gated: list = []
    if gates > 0 and groups:
        # cheap screen: the best single-primitive fit inside and outside each query group
        screen = []
        for g, grp in enumerate(groups):
            inn, out = grp, tot - grp
            if inn.pp[hi] <= 0 or out.pp[hi] <= 0 or fs.pred_windows[g] < MIN_WINDOWS:
                continue
            screen.append((best_single_loss(inn, hi) + best_single_loss(out, hi), g))
        screen.sort()
        for _proxy, g in screen[: 2 * gates]:
            inn, out = groups[g], tot - groups[g]
            a = beam_mixtures(inn, hi, allowed, 2, max_terms, 4)
            b = beam_mixtures(out, hi, allowed, 2, max_terms, 4)
            if a and b:
                gated.append((a[0][0] + b[0][0], g, a[0], b[0]))
        gated.sort(key=lambda x: (x[0], x[1]))
        for _loss, g, a, b in gated[:gates]:
            na, nb = mixture(nodes, a[1], a[2]), mixture(nodes, b[1], b[2])
            if na is not None and nb is not None and na != nb:
                props.append(dsl.Gate(fs.preds[g], na, nb))
    if keys is not None:
        # softmax-like tables (positional profile x key-token weights, tempered per query class) ...
        loglin = fit_loglinear(fs, hi, keys)
        loglin += fit_loglinear(fs, hi, keys, classes=TABLE_CLASSES)
        loglin += fit_loglinear(fs, hi, keys, classes=TABLE_CLASSES, profiles=QUERY_PROFILES)
        if gated:  # the query split that best separates two behaviours gets a profile per side
            loglin += fit_loglinear(fs, hi, keys, split=fs.preds[gated[0][1]], classes=TABLE_CLASSES)[-1:]
        memo: dict = {}
        top = int(np.argmax(fs.iou(fs.patterns(loglin, memo), hi)))
        props += loglin
        # ... and the best of them as one more component of the mixtures below
        ext = extend(tot, fs, hi, fs.values(loglin[top], memo)[0])
        ext_nodes = nodes + [loglin[top]]
        for _loss, sup, w in beam_mixtures(ext, 0, np.ones(P + 1, dtype=bool), 2, min(max_terms, 4), 6)[:6]:
            if P in sup and len(sup) > 1:
                node = mixture(ext_nodes, sup, w)
                if node is not None:
                    props.append(node)
        del memo
    props += [nodes[int(p)] for p in np.argsort(fs.prim_jsd[hi], kind="stable")[:3]]
    props += [nodes[int(p)] for p in np.argsort(-fs.prim_iou[hi], kind="stable")[:2]]
    mixes = beam_mixtures(tot, hi, allowed, beam, max_terms, max(2 * beam, 4))
    per_size: dict[int, int] = {}
    best: list[tuple[tuple[int, ...], np.ndarray]] = []
    for _loss, sup, w in mixes:
        if per_size.get(len(sup), 0) >= 2:
            continue
        node = mixture(nodes, sup, w)
        if node is None:
            continue
        per_size[len(sup)] = per_size.get(len(sup), 0) + 1
        props.append(node)
        if len(best) < 2 and len(sup) > 1:
            best.append((sup, w))
    refined = []
    for sup, w in best[:1]:
        node = mixture(nodes, sup, fs.refine(hi, sup, w))
        if node is not None:
            props.append(node)
            refined.append(node)
    anchors = refined[:1] or [p for p in props if isinstance(p, dsl.Mix)][:1]
    for anchor in anchors:
        for p in sorted(sparse, key=lambda j: fs.prim_jsd[hi, j])[:2]:
            props.append(dsl.Fallback((nodes[p], anchor)))
        for t in (0.5, 1.5, 2.0, 3.0):
            props.append(dsl.Sharpen(anchor, t))
    return list(dict.fromkeys(props))
