"""The attention DSL: expression trees over kernel primitives and combinators, declared once in a spec.

A DSL program is safe by construction: it can only name the primitives and combinators of the spec, so
it can be loaded from anyone and evaluated on any input by the numba kernels in
``headsurgeon.kernels.primitives``. Three equivalent forms:

* the tree (frozen dataclasses ``Prim``, ``Mix``, ``Fallback``, ``Gate``, ``Sharpen``, ``Mul``);
* JSON, e.g. ``{"mix": [[0.7, {"prev": 1}], [0.3, {"first": {}}]]}``;
* text, e.g. ``0.7*prev(1) + 0.3*first()``; with the model's ``Vocabulary`` the text names tokens by their
  strings (``recent(tok("Lily"))``, ``key_in_set(tokens=["▁the", "▁a"])``): ``parse(text, vocab=v)``,
  ``to_text(node, vocab=v)``.

``mix`` adds row-normalized components; ``sum(2*prev(1), first())`` adds raw scores and normalizes each
row once at the end (EAPS's idiom). ``round_numbers(node, 2)`` rounds every float literal to 2
significant digits.

``parse(to_text(t)) == t`` and ``from_json(to_json(t)) == t`` for every valid tree; invalid input raises
``ProgramValidationError`` saying what is wrong and what is allowed. Every parameter is bounded and every
program has a cost bound (the sum of its nodes' costs, each about one pass over the B x N x N score
cells), so an accepted program costs O(cells x MAX_COST) per batch. The checks run while text or JSON is
read and in ``validate``, which ``to_text``, ``to_json``, ``canonical_json`` and evaluation call on trees
built in code.

Modules: ``nodes`` (the tree), ``bounds`` (limits and checks; ``quote`` clips hostile values in
messages), ``spec`` (the declarations' types and registries), ``catalog`` (every primitive and
combinator), ``build`` (binding and whole-tree checks), ``text`` and ``printer`` (with ``tokens``: token
strings), ``jsonform``, ``context`` and ``evaluate`` (the reference evaluator), ``sparse`` and
``sparse_combinators`` (the same evaluation into compressed rows for trees of small support), ``docs``
(tables, the prompt reference, ``gloss``), ``labels`` (dependency labels), ``size`` and ``rounding``. The tables
below are generated from the spec when the module loads.
"""
from __future__ import annotations

from . import catalog  # noqa: F401  (declares every primitive and combinator)
from .bounds import (FLAGS, KINDS, KNOWN_POS_TAGS, MATCH_FEATURES, MAX_CLASSES, MAX_COST, MAX_DEPTH, MAX_EXPONENT,
                     MAX_IDS, MAX_LIST_DEPTH, MAX_LITERAL_CHARS, MAX_NODES, MAX_OFFSET, MAX_PAIRS, MAX_PROFILE,
                     MAX_TEXT_CHARS, MAX_VALUE, MAX_WEIGHT, SELECTS, Kind)
from .build import cost, features_needed, make_mix, make_prim, make_sharpen, make_sum, validate
from .catalog import class_tables, sharpen_exponents
from .context import Context
from .docs import PREDICATES as _PREDICATES
from .docs import gloss, reference_text, render_tables
from .evaluate import SCRATCH_BYTES, evaluate, evaluate_scores
from .jsonform import canonical_json, from_json, json_loads, to_json
from .labels import dep_labels
from .nodes import Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum, children, is_node
from .rounding import round_numbers
from .spec import (COMBINATOR_BOUNDS, COMBINATOR_COST, COMBINATOR_SPECS, KIND_BOUNDS, PRIMITIVE_COST,
                   PRIMITIVE_SPECS, PRIMITIVES, REQUIRED, CombinatorSpec, Param, PrimitiveSpec, register_primitive,
                   unregister_primitive)
from .size import size
from .sparse import evaluate_sparse, evaluate_sparse_scores, is_sparse, row_support
from .text import parse, to_text

__all__ = [
    "size", "round_numbers", "make_sum", "dep_labels",
    "Prim", "Mix", "Sum", "Fallback", "Gate", "Sharpen", "Mul", "Pred", "Node",
    "parse", "to_text", "from_json", "to_json", "canonical_json", "json_loads", "validate", "cost",
    "features_needed", "evaluate_scores", "evaluate", "evaluate_sparse", "evaluate_sparse_scores", "is_sparse",
    "row_support", "PRIMITIVES", "COMBINATORS", "FLAGS", "MATCH_FEATURES",
    "KNOWN_POS_TAGS", "SELECTS", "KIND_BOUNDS", "COMBINATOR_BOUNDS", "PRIMITIVE_COST", "COMBINATOR_COST",
    "MAX_OFFSET", "MAX_VALUE", "MAX_IDS", "MAX_CLASSES", "MAX_PAIRS", "MAX_PROFILE", "MAX_WEIGHT",
    "MAX_EXPONENT", "MAX_TEXT_CHARS", "MAX_LITERAL_CHARS", "MAX_DEPTH", "MAX_LIST_DEPTH", "MAX_NODES",
    "MAX_COST", "class_tables", "sharpen_exponents", "SCRATCH_BYTES",
    # the spec and the seams built on it
    "PrimitiveSpec", "CombinatorSpec", "Param", "Kind", "KINDS", "REQUIRED", "PRIMITIVE_SPECS",
    "COMBINATOR_SPECS", "register_primitive", "unregister_primitive", "make_prim", "make_sharpen", "make_mix",
    "children", "is_node", "gloss", "render_tables", "reference_text", "Context",
]

#: the combinators, in their declaration order
COMBINATORS: tuple[str, ...] = tuple(COMBINATOR_SPECS)

__doc__ = (__doc__ or "") + "\n" + render_tables() + "\n\nPredicates (PRED): " + _PREDICATES + ".\n"
