"""Small programs from a fitted learned head: its heaviest few terms (match terms with few pairs, positional
terms), reweighted, one mixture per query side, so that the learned searcher proposes candidates across sizes."""
from __future__ import annotations

from dataclasses import replace

from .head import LearnedHead, MatchTerm

#: match terms with more pairs than this are left out of the pruned programs (they cannot be read at a glance)
MAX_PAIRS = 8


def _rounded(weights: list[float]) -> list[float]:
    """Weights normalized to sum 1 and rounded to 2 decimals (a zero keeps the smallest visible weight)."""
    total = sum(weights) or 1.0
    return [max(round(w / total, 2), 0.01) for w in weights]


def pruned_heads(head: LearnedHead, sizes: tuple[int, ...] = (1, 2, 3), max_pairs: int = MAX_PAIRS) -> list[LearnedHead]:
    """Ungated heads holding only the ``n`` heaviest terms of each side of ``head``, for each ``n`` in ``sizes``."""
    sides = [(head.matches, head.positional)]
    if head.gate is not None:
        sides.append((head.other_matches, head.other_positional))
    out: list[LearnedHead] = []
    for matches, positional in sides:
        terms: list[tuple[float, MatchTerm | str]] = [(w, t) for w, t in matches if 0 < t.n_pairs <= max_pairs]
        terms += positional  # a positional term is its component's name
        terms.sort(key=lambda x: -x[0])
        for n in sizes:
            kept = terms[:n]
            if len(kept) < n and n > 1:
                break
            if not kept:
                continue
            ws = _rounded([w for w, _ in kept])
            out.append(replace(head, gate=None, other_matches=[], other_positional=[],
                               matches=[(w, t) for w, (_, t) in zip(ws, kept) if not isinstance(t, str)],
                               positional=[(w, t) for w, (_, t) in zip(ws, kept) if isinstance(t, str)]))
    return out
