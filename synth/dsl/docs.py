"""Documents derived from the spec: the markdown tables of the module docs, the LLM prompt's DSL
reference, and ``gloss``, which fills the spec's English templates for a whole tree.

Nothing here is written by hand per primitive: a primitive registered in the spec (synth/dsl/spec.py)
appears in every table, in the prompt and in glosses at once.
"""
from __future__ import annotations

import string
from typing import Any

from .bounds import FLAGS, KINDS, MATCH_FEATURES, STRUCTURE_BOUNDS
from .nodes import Pred, Prim
from .spec import COMBINATOR_SPECS, PRIMITIVE_SPECS, combinator_for

__all__ = ["primitives_table", "combinators_table", "bounds_table", "render_tables", "reference_text",
           "gloss", "template_fields"]

PREDICATES = (f"a flag ({', '.join(FLAGS)}); a POS tag pos=NOUN; or a token set ids=[3, 17] "
              '(in JSON: "punct", {"pos": "NOUN"}, {"ids": [3, 17]})')
MASK_NOTE = "``causal`` is the mask policy of the model; every primitive scores only visible keys"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def primitives_table() -> str:
    """A markdown table of every primitive: its call, what it attends to, the features it reads, its cost."""
    rows = [(f"``{s.signature}``", s.doc, ", ".join(s.features), str(s.cost)) for s in PRIMITIVE_SPECS.values()]
    return _table(("primitive", "attends to", "reads", "cost"), rows)


def combinators_table() -> str:
    """A markdown table of every combinator: its syntax, meaning and cost."""
    rows = [(f"``{c.syntax}``", c.doc, f"{c.cost} per argument" if c.cost_per_child else str(c.cost))
            for c in COMBINATOR_SPECS.values()]
    return _table(("combinator", "meaning", "cost"), rows)


def bounds_table() -> str:
    """A markdown table of every bound: per parameter kind, per combinator, and on whole programs."""
    rows = []
    for kind, k in KINDS.items():
        uses = [f"``{s.name}({p.name})``" for s in PRIMITIVE_SPECS.values() for p in s.params if p.kind == kind]
        rows.append((f"{', '.join(uses) or 'unused'} ({kind})", k.bound))
    rows += [(f"``{c.syntax}`` ({c.name})", c.bound) for c in COMBINATOR_SPECS.values()]
    rows += list(STRUCTURE_BOUNDS)
    return _table(("parameter (kind)", "bound"), rows)


def render_tables() -> str:
    """The three tables as the module docs embed them (a test checks that they do)."""
    return "\n\n".join([f"Primitives ({MASK_NOTE}):", primitives_table(), "Combinators:", combinators_table(),
                        "Bounds:", bounds_table()])


def reference_text() -> str:
    """The DSL reference the LLM prompt shows: every primitive, the predicates and every combinator."""
    lines = [f"Primitives ({MASK_NOTE.replace('``', '`')}):"]
    lines += [f"  {s.signature}: {s.doc}" for s in PRIMITIVE_SPECS.values()]
    lines += [f"Predicates (PRED): {PREDICATES}.", f"Match features (F): {', '.join(MATCH_FEATURES)}.",
              "Combinators:"]
    lines += [f"  {c.syntax}: {c.doc}" for c in COMBINATOR_SPECS.values()]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# gloss: the spec's English templates filled for a tree
# --------------------------------------------------------------------------------------------

_FLAG_WORDS = {"punct": "punctuation", "sent_end": "a sentence end", "newline": "a newline",
               "cap": "capitalized", "word_start": "a word start"}
_GLOSS_ITEMS = 4


def _words(value: Any) -> str:
    """A parameter value in a gloss: numbers plainly, long lists clipped, predicates in words."""
    if isinstance(value, Pred):
        if value.kind == "flag":
            return _FLAG_WORDS.get(value.value, value.value)
        if value.kind == "pos":
            return f"tagged {value.value}"
        return f"one of the tokens {_words(value.value)}"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_words(v) for v in value[:_GLOSS_ITEMS])
        more = f", ... ({len(value)} in all)" if len(value) > _GLOSS_ITEMS else ""
        return f"[{shown}{more}]"
    return str(value)


def template_fields(template: str) -> set[str]:
    """The placeholder names of a gloss template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def gloss(node: Any) -> str:
    """An English clause for a tree (or a predicate), from the spec's gloss templates."""
    if isinstance(node, Pred):
        return _words(node)
    if isinstance(node, Prim):
        spec = PRIMITIVE_SPECS[node.name]
        return spec.gloss.format(**{k: _words(v) for k, v in node.params})
    spec = combinator_for(node)
    if spec is None:
        raise TypeError(f"not a DSL node: {node!r}")
    return spec.gloss.format(**spec.gloss_fields(node, gloss))
