"""Small compositions per head for the size budgets (headsurgeon/synth/program.py ``BUDGETS``): single primitives, mixes of at
most three short terms, raw ``sum``s of two or three short terms, query gates (flags incl. ``quote``, ``pos=``,
``dep=``), fallbacks, ``key_in_set`` over a handful of key tokens and short profiles, and the per-budget choice
of which candidates to keep."""
from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from ... import dsl
from ...program import BUDGETS, Program
from ...sequence import Sequence as TokenSequence
from ...vocab import Vocabulary
from .compose import best_single_loss, extend, mixture, walk
from .fitset import MIN_WINDOWS, FitSet
from .mixtures import GramStats, beam_mixtures
from .util import significant

#: primitives a short mix may use: positional rules, and anything whose text stays this short
SHORT_TEXT = 26
POSITIONAL = frozenset({"self", "first", "prev", "next", "window", "decay", "uniform"})
#: the largest key_in_set written for a small program (ids render as token strings)
MAX_KEY_IDS = 8
#: raw weights tried for the terms of a small ``sum`` (first term, second term)
SUM_WEIGHTS: tuple[tuple[float, float], ...] = ((1.0, 1.0), (2.0, 1.0), (1.0, 2.0), (4.0, 1.0), (1.0, 4.0))
#: finite size bands of the budgets, smallest first
BANDS: tuple[int, ...] = tuple(sorted(b for b in BUDGETS if b is not None))


def vocabulary_of(sequences: Sequence[TokenSequence]) -> Vocabulary:
    """A Vocabulary built from the token strings the sequences show (ids never seen render as ``<id N>``)."""
    names: dict[int, str] = {}
    for s in sequences:
        for i, t in zip(np.asarray(s.ids).tolist(), s.tokens):
            names.setdefault(int(i), str(t))
    size = max(names, default=-1) + 1
    return Vocabulary([names.get(i, f"<id {i}>") for i in range(size)])


def rendered_chars(program: Program, vocab: Vocabulary | None, limit: int | None = None) -> int:
    """Characters of the program rendered with token strings (an estimate while the DSL still prints ids).

    With ``limit``, a program of more than ``limit`` nodes and literals is not rendered: each of them takes at
    least one character, so its size (returned instead) already says it is longer than ``limit``.
    """
    if limit is not None and program.size > limit:
        return program.size
    text = program.render(vocab)
    if vocab is None or not program.has_tree or text != program.text:
        return len(text)
    extra = 0
    for node in walk(program.node):
        ids: tuple = ()
        if isinstance(node, dsl.Prim) and node.name == "key_in_set":
            ids = tuple(node.param("ids"))
        elif isinstance(node, dsl.Gate) and node.pred.kind == "ids":
            ids = tuple(node.pred.value)
        extra += sum(len(json.dumps(vocab.token(int(t)))) - len(str(int(t))) for t in ids)
    return len(text) + max(extra, 0)


def band_of(chars: int) -> int | None:
    """The smallest finite budget the program fits in (None: only the unbounded one)."""
    for b in BANDS:
        if chars <= b:
            return b
    return None


def short_mask(nodes: list[dsl.Node]) -> tuple[np.ndarray, np.ndarray]:
    """(short, positional) boolean masks over the library primitives."""
    short = np.array([len(dsl.to_text(n)) <= SHORT_TEXT for n in nodes], dtype=bool)
    positional = np.array([isinstance(n, dsl.Prim) and n.name in POSITIONAL for n in nodes], dtype=bool)
    return short | positional, positional


def key_sets(fs: FitSet, hi: int, sizes: tuple[int, ...] = (1, 2, 4, MAX_KEY_IDS), min_cells: int = 40,
             min_windows: int = MIN_WINDOWS) -> list[tuple[int, ...]]:
    """Key-token sets the head favours: tokens ranked by mean attention per visible cell (key 0 left to first()).

    A token must be a key in at least ``min_windows`` fit windows: one occurrence early in one window already
    has ``min_cells`` cells, and a head that uses position 1 as a second sink would otherwise name that window's
    word (tests/synth/test_enumerative.py shows the case).
    """
    keep = ~fs.cell_first
    keys, real = fs.cell_key[keep], fs.real[hi][keep].astype(np.float64)
    if keys.size == 0:
        return []
    mass = np.bincount(keys, weights=real)
    count = np.bincount(keys)
    common = (count >= min_cells) & (key_windows(fs, count.size) >= min_windows)
    avg = np.divide(mass, count, out=np.zeros_like(mass), where=common)
    base = float(real.sum() / max(keys.size, 1))
    order = [int(t) for t in np.argsort(-avg, kind="stable") if avg[t] > 2.0 * base]
    return list(dict.fromkeys(tuple(sorted(order[:k])) for k in sizes if len(order) >= 1 and order[:k]))


def key_windows(fs: FitSet, size: int) -> np.ndarray:
    """[size] the number of fit windows in which each token id stands at a key position after the first."""
    return fs.token_windows(np.arange(fs.R) > fs.seq_row_start[fs.row_window], size)


def key_in_set(ids: tuple[int, ...]) -> dsl.Node:
    """``key_in_set(ids=[...])`` as a tree."""
    return dsl.parse(f"key_in_set(ids=[{', '.join(map(str, ids))}])")


def short_profiles(fs: FitSet, hi: int, lengths: tuple[int, ...] = (2, 3, 5)) -> list[dsl.Node]:
    """``profile(w=[..], tail=.., bos=..)`` with few weights: the head's mean attention per offset, 2 digits."""
    real = fs.real[hi].astype(np.float64)
    rest = ~fs.cell_first & (fs.cell_d >= 0)
    d = fs.cell_d[rest]
    mass = np.bincount(d, weights=real[rest])
    count = np.maximum(np.bincount(d), 1)
    per = mass / count
    bos = float(real[fs.cell_first].mean()) if fs.cell_first.any() else 0.0
    out = []
    for n in lengths:
        if per.size <= n:
            continue
        w = per[:n]
        tail = float(mass[n:].sum() / max(count[n:].sum(), 1))
        top = max(float(w.max()), bos, tail, 1e-12)
        ws = [significant(x / top, 2) for x in w]
        if not any(ws):
            continue
        text = (f"profile(w=[{', '.join(f'{x:g}' for x in ws)}], tail={significant(tail / top, 2):g}, "
                f"bos={significant(bos / top, 2):g})")
        out.append(dsl.parse(text))
    return out


def _mixes(st: GramStats, h: int, allowed: np.ndarray, nodes: list[dsl.Node], max_terms: int, per_size: int,
           require: int | None = None) -> list[dsl.Node]:
    """The best ``per_size`` NNLS mixtures of each size up to ``max_terms`` (rounded; ``require``: a term index)."""
    got: dict[int, int] = {}
    out = []
    for _loss, sup, w in beam_mixtures(st, h, allowed, 4, max_terms, 8):
        if require is not None and require not in sup:
            continue
        if got.get(len(sup), 0) >= per_size:
            continue
        node = mixture(nodes, sup, w)
        if node is not None:
            got[len(sup)] = got.get(len(sup), 0) + 1
            out.append(node)
    return out


def propose_small(fs: FitSet, hi: int, tot: GramStats, groups: list[GramStats], nodes: list[dsl.Node],
                  sparse: list[int], gates: int = 4) -> list[dsl.Node]:
    """Small compositions for one head (each a handful of terms; deduplicated, in a stable order)."""
    P = len(nodes)
    short, positional = short_mask(nodes)
    props: list[dsl.Node] = []
    by_jsd = [int(p) for p in np.argsort(fs.prim_jsd[hi], kind="stable") if short[p]]
    by_iou = [int(p) for p in np.argsort(-fs.prim_iou[hi], kind="stable") if short[p]]
    props += [nodes[p] for p in by_jsd[:6] + by_iou[:3]]
    mixes = _mixes(tot, hi, short, nodes, 3, 2)
    mixes += _mixes(tot, hi, positional, nodes, 3, 1)
    props += mixes
    anchors = [m for m in mixes if isinstance(m, dsl.Mix)][:2]
    # fallbacks: a sparse rule where it applies, a short mix (or first()) elsewhere
    for p in [j for j in sorted(sparse, key=lambda j: fs.prim_jsd[hi, j]) if short[j]][:3]:
        for anchor in anchors[:1] + [dsl.Prim("first")]:
            props.append(dsl.Fallback((nodes[p], anchor)))
    # gates on query predicates: a single rule or a 2-term mix per side
    if gates > 0 and groups:
        screen = []
        for g, grp in enumerate(groups):
            inn, out = grp, tot - grp
            if inn.pp[hi] > 0 and out.pp[hi] > 0 and fs.pred_windows[g] >= MIN_WINDOWS:
                screen.append((best_single_loss(inn, hi) + best_single_loss(out, hi), g))
        for _proxy, g in sorted(screen)[:gates]:
            inn, out = groups[g], tot - groups[g]
            a = _mixes(inn, hi, short, nodes, 2, 1)
            b = _mixes(out, hi, short, nodes, 2, 1)
            for na, nb in zip(a, b):
                if na != nb:
                    props.append(dsl.Gate(fs.preds[g], na, nb))
    # a handful of key tokens, alone and mixed with up to two short rules
    memo: dict = {}
    for ids in key_sets(fs, hi):
        node = key_in_set(ids)
        props.append(node)
        props.append(dsl.Fallback((node, dsl.Prim("first"))))
        ext = extend(tot, fs, hi, fs.values(node, memo)[0])
        props += _mixes(ext, 0, np.append(short, True), nodes + [node], 3, 1, require=P)
    props += short_profiles(fs, hi)
    props += raw_sums(fs, hi, [nodes[p] for p in by_jsd[:3] + by_iou[:1]]
                      + [key_in_set(ids) for ids in key_sets(fs, hi)[:1]])
    return list(dict.fromkeys(props))


def raw_sums(fs: FitSet, hi: int, terms: list[dsl.Node], pairs: int = 3) -> list[dsl.Node]:
    """``sum`` of two short terms (weights SUM_WEIGHTS) over ``terms`` + prev(1) + first(), and of three
    (weights 1) extending the ``pairs`` best pairs by synth JSD (EAPS's "add raw weights" idiom)."""
    pool = list(dict.fromkeys(terms + [dsl.Prim("first"), dsl.parse("prev(1)")]))
    pool = [t for t in pool if _in_library(fs, t)][:6]
    two = [dsl.Sum(((a, pool[i]), (b, pool[j]))) for i in range(len(pool)) for j in range(i + 1, len(pool))
           for a, b in SUM_WEIGHTS]
    if not two:
        return []
    memo: dict = {}
    jsd = fs.jsd(fs.patterns(two, memo), hi)
    out: list[dsl.Node] = list(two)
    for k in np.argsort(jsd, kind="stable")[:pairs]:
        base = two[int(k)]
        used = {t for _, t in base.terms}
        out += [dsl.Sum(base.terms + ((1.0, t),)) for t in pool if t not in used]
    return out


def _in_library(fs: FitSet, node: dsl.Node) -> bool:
    """Whether the fit set can evaluate a primitive (a library entry or one with compact semantics)."""
    return node in fs.index or (isinstance(node, dsl.Prim) and node.name in ("profile", "key_weight",
                                                                            "class_weight", "key_in_set"))


def keep_per_band(chars: list[int], jsd: np.ndarray, iou: np.ndarray, by_jsd: int, by_iou: int) -> list[int]:
    """Indices to keep: per finite budget, the ``by_jsd`` best by JSD and ``by_iou`` best by IoU among those that fit."""
    keep: list[int] = []
    for b in BANDS:
        fit = [k for k in range(len(chars)) if chars[k] <= b]
        keep += sorted(fit, key=lambda k: (jsd[k], k))[:by_jsd]
        keep += sorted(fit, key=lambda k: (-iou[k], k))[:by_iou]
    return list(dict.fromkeys(keep))
