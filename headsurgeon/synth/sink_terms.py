"""Sink as a side term: candidates ``(1-s)·CORE + s·first()`` that name what a head moves first, for selection.

Most heads park most of their attention on the first token, whose value vector moves little
(headsurgeon/surgery/patterns/value_norms.py). Searchers fit their mixtures to the raw pattern, so what a head does besides the sink
arrives with a weight of a few percent (``0.98*first() + 0.02*induction()``). Here each core, the part of a leading
candidate other than ``first()`` (and the ``induction()`` template), is paired with ``first()`` at a few sink shares;
selection (headsurgeon/synth/select.py) scores them like every other candidate, so value-weighted selection can choose the share
that matches what the head moves. A mixture gives a core's empty rows to its other terms (headsurgeon/synth/dsl/catalog.py
``_mix``), so ``0.1*induction() + 0.9*first()`` is induction where there is a match and the sink elsewhere.
"""
from __future__ import annotations

from typing import Any, Iterable

from . import dsl
from .program import Program

__all__ = ["SINK_SHARES", "CORE_TEMPLATES", "cores_of", "side_term_programs"]

#: the sink shares tried for each core (the first token's share of each row where the core has keys)
SINK_SHARES: tuple[float, ...] = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95)
#: cores tried for every head besides those taken from its candidates
CORE_TEMPLATES: tuple[str, ...] = ("induction()", "prev(1)")
_FIRST = Program.parse("first()").node


def _mentions_first(node: dsl.Node) -> bool:
    return node == _FIRST or any(_mentions_first(c) for c in dsl.children(node))


def _core(node: dsl.Node) -> tuple[tuple[float, dsl.Node], ...] | None:
    """``node`` without the sink, as mixture terms: a root mixture's terms other than ``first()`` (their weights
    summing to 1), or the node itself; None when nothing is left or ``first()`` sits deeper (a gate, a sum)."""
    terms = node.terms if isinstance(node, dsl.Mix) else ((1.0, node),)
    rest = [(w, t) for w, t in terms if t != _FIRST]
    if not rest or any(_mentions_first(t) for _, t in rest):
        return None
    total = sum(w for w, _ in rest)
    return tuple((w / total, t) for w, t in rest)


def cores_of(programs: Iterable[Program], templates: Iterable[str] = CORE_TEMPLATES) -> list[Any]:
    """Distinct cores (mixture terms) of ``programs`` (DSL trees only) and of ``templates``, in that order."""
    out: dict[Any, None] = {}
    for p in programs:
        core = _core(p.node) if p.has_tree else None
        if core is not None:
            out.setdefault(core)
    for t in templates:
        out.setdefault(((1.0, Program.parse(t).node),))
    return list(out)


def side_term_programs(cores: Iterable[Any], shares: Iterable[float] = SINK_SHARES) -> list[Program]:
    """``(1-s)*CORE + s*first()`` for every core and share, the core's terms written first (weights to 2 digits)."""
    out = []
    for core in cores:
        for s in shares:
            try:
                terms = [(round((1 - s) * w, 2), t) for w, t in core]
                out.append(Program.from_node(dsl.make_mix([(w, t) for w, t in terms if w > 0] + [(s, _FIRST)])))
            except Exception:  # noqa: BLE001 - a core the DSL refuses inside a mixture is skipped
                continue
    return out
