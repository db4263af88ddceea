"""The DSL spec: each primitive and combinator declared once, and the registries everything else derives from.

A ``PrimitiveSpec`` holds a primitive's name, parameters (each with a kind from ``bounds.KINDS``, which
carries its bound and check), the feature arrays it reads, its kernel (an evaluate function over the
evaluation context), its cost, a one-line doc and a gloss template. The parser's checks, the reference
evaluator's dispatch, the docs tables, the LLM prompt's DSL reference and ``gloss`` all read these
registries; ``register_primitive`` adds one (docs/architecture.md has the recipe). The enumerative searcher's fit
set evaluates trees on its compact cells through the declarations' ``cells`` adapters (headsurgeon/synth/dsl/cell_combinators.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .bounds import KINDS
from ...core import InputError

if TYPE_CHECKING:  # types named for the checker only: the kernels import the spec themselves, and the nodes are read, not built, here
    from headsurgeon.kernels.sparse import SparseRows

    from .nodes import Node

# A kernel takes a node and the evaluation context (headsurgeon/synth/dsl/context.py, which reads this registry).
Kernel = Callable[[Any, Any], np.ndarray]
# A primitive's cells kernel takes the node and a fit set's cells (headsurgeon/synth/dsl/cell_combinators.py ``Cells``).
CellsKernel = Callable[[Any, Any], np.ndarray]
# A sparse kernel takes the same node and context and returns compressed rows (headsurgeon/synth/dsl/sparse.py).
SparseKernel = Callable[[Any, Any], "SparseRows"]
# A positional primitive's scores from query and key positions (int64 tensors that broadcast): float64 scores.
PositionKernel = Callable[[Any, Any, Any], Any]

__all__ = [
    "REQUIRED", "Kernel", "CellsKernel", "SparseKernel", "PositionKernel", "ChildGlossFn", "Param", "PrimitiveSpec", "CellsAdapter", "CombinatorSpec",
    "PRIMITIVE_SPECS", "COMBINATOR_SPECS", "register_primitive", "unregister_primitive", "register_combinator",
    "unregister_combinator", "combinator_for", "require_combinator",
    "PRIMITIVES", "PRIMITIVE_COST", "KIND_BOUNDS", "COMBINATOR_BOUNDS", "COMBINATOR_COST", "COUNTED",
]

#: ``support`` of a primitive whose keys pass a token test (same token, key sets, match): at most N per row,
#: few in text, counted by its sparse kernel at run time.
COUNTED = "counted"


class _Required:
    """The default of a required parameter."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Param:
    """One parameter: its name, its kind (a key of ``bounds.KINDS``) and its default (``REQUIRED`` if none)."""

    name: str
    kind: str
    default: Any = REQUIRED


@dataclass(frozen=True)
class PrimitiveSpec:
    """The one declaration of a primitive.

    ``kernel(node, ctx)`` returns the raw scores float32 [B, N, N] (taking its buffer from ``ctx.buf()``);
    ``features`` names the feature arrays it always reads (parameters of kind ``pred`` or ``feature`` add
    theirs); ``gloss`` is an English clause with ``{param}`` placeholders; ``keywords`` prints the
    parameters as ``name=value``; ``json_scalar`` writes a one-parameter primitive as ``{"prev": 1}``;
    ``check(params)`` checks relations between parameters (after each one passed its own bound);
    ``gloss_cases`` lists ``((("k", 1),), "attends to the previous token")`` sentences used instead of
    ``gloss`` when the node's parameters hold those values.
    ``support`` bounds the keys a query row can score: an int or ``support(node) -> int`` (prev: 1,
    window(a, b): b-a+1), ``COUNTED``, or None (every visible key: dense); with it, ``sparse(node, ctx)``
    returns the scores as compressed rows (``headsurgeon.kernels.sparse.SparseRows``), which is how
    trees of such primitives are evaluated (headsurgeon/synth/dsl/sparse.py). ``cells(node, cells)`` gives the raw scores [C]
    of a primitive the enumerative searcher fits (profile, key_weight, class_weight, key_in_set) on a fit set's
    compact cells (headsurgeon/synth/dsl/cell_combinators.py ``Cells``); the other primitives' cells come from their kernels.
    ``position(node, i, j)`` gives a positional primitive's raw float64 scores from query positions ``i`` and key
    positions ``j`` (torch int64 tensors that broadcast), before masking: the learned searcher's differentiable rows
    (headsurgeon/synth/search/learned/rows.py) are built from it.
    """

    name: str
    params: tuple[Param, ...]
    kernel: Kernel
    doc: str
    gloss: str
    features: tuple[str, ...] = ()
    cost: int = 1
    keywords: bool = False
    json_scalar: bool = False
    check: Callable[[Mapping[str, Any]], None] | None = None
    gloss_cases: tuple[tuple[tuple[tuple[str, Any], ...], str], ...] = ()
    support: int | str | Callable[[Any], int] | None = None
    sparse: SparseKernel | None = None
    cells: CellsKernel | None = None
    position: PositionKernel | None = None

    @property
    def takes_pred(self) -> bool:
        """Whether the primitive's only parameter is a predicate (written ``name(PRED)``)."""
        return len(self.params) == 1 and self.params[0].kind == "pred"

    @property
    def signature(self) -> str:
        """The call as documented, e.g. ``prev(k)`` or ``key_in_set(ids=[..])``."""
        if self.takes_pred:
            return f"{self.name}(PRED)"
        if self.keywords:
            inner = ", ".join(f"{p.name}={KINDS[p.kind].placeholder}" for p in self.params)
        else:
            inner = ", ".join(p.name for p in self.params)
        return f"{self.name}({inner})"


class ChildGlossFn(Protocol):
    """What a combinator's ``gloss_fields`` gets to render its children (headsurgeon/synth/dsl/docs.py ``ChildGloss``)."""

    share: float | None

    def __call__(self, child: Any, share: float | None = ...) -> str: ...


@dataclass(frozen=True)
class CellsAdapter:
    """A combinator on a fit set's compact cells (headsurgeon/synth/dsl/cell_combinators.py): ``values(node, cells, memo)`` gives
    (row-normalized scores [C] with empty rows 0, empty rows [R]), ``raw(node, cells, memo)`` the raw scores [C]
    its dense kernel hands a ``sum``."""

    values: Callable[[Any, Any, dict], tuple[np.ndarray, np.ndarray]]
    raw: Callable[[Any, Any, dict], np.ndarray]


@dataclass(frozen=True)
class CombinatorSpec:
    """The one declaration of a combinator: its node type, syntax, bound, cost, kernel, doc and gloss.

    ``cost`` counts per term or argument when ``cost_per_child``; ``gloss_fields(node, gloss)`` gives the
    values of the ``gloss`` template's placeholders (``gloss(child, share=...)`` renders a child, ``gloss.share``
    is the node's share of the attention row: headsurgeon/synth/dsl/docs.py ``ChildGloss``). ``sparse(node, ctx)`` is
    the kernel on compressed rows (its children evaluated sparse), ``support(bounds)`` the children's
    per-row key bounds combined (mix: their sum; fallback, gate: the largest; mul: the smallest). ``cells`` is the
    combinator on the enumerative fit set's compact cells (a ``CellsAdapter``).
    """

    name: str
    node_type: type
    syntax: str
    bound: str
    kernel: Kernel
    doc: str
    gloss: str
    gloss_fields: Callable[[Any, ChildGlossFn], dict[str, str]]
    cost: int
    cost_per_child: bool = False
    sparse: SparseKernel | None = None
    support: Callable[[list[float]], float] = sum
    cells: CellsAdapter | None = None


PRIMITIVE_SPECS: dict[str, PrimitiveSpec] = {}
COMBINATOR_SPECS: dict[str, CombinatorSpec] = {}
_BY_TYPE: dict[type, CombinatorSpec] = {}


def register_primitive(spec: PrimitiveSpec) -> PrimitiveSpec:
    """Add a primitive to the DSL (parser, evaluator, JSON, docs and gloss all see it at once)."""
    if spec.name in PRIMITIVE_SPECS or spec.name in COMBINATOR_SPECS:
        raise InputError(f"DSL name {spec.name!r} is already declared")
    if spec.support is not None and spec.sparse is None:
        raise InputError(f"{spec.name} declares support {spec.support!r} but no sparse kernel; give both or neither")
    for p in spec.params:
        if p.kind not in KINDS:
            raise InputError(f"{spec.name}({p.name}=...) has unknown kind {p.kind!r}; kinds: {', '.join(KINDS)}")
    PRIMITIVE_SPECS[spec.name] = spec
    return spec


def unregister_primitive(name: str) -> None:
    """Remove a primitive added with ``register_primitive`` (tests use it to clean up)."""
    del PRIMITIVE_SPECS[name]


def register_combinator(spec: CombinatorSpec) -> CombinatorSpec:
    """Declare a combinator (its node type, parsing and printing live in nodes.py, text.py and jsonform.py)."""
    COMBINATOR_SPECS[spec.name] = spec
    _BY_TYPE[spec.node_type] = spec
    return spec


def unregister_combinator(name: str) -> None:
    """Remove a combinator added with ``register_combinator`` (tests use it to clean up)."""
    del _BY_TYPE[COMBINATOR_SPECS.pop(name).node_type]


def combinator_for(node: Node) -> CombinatorSpec | None:
    """The spec of a combinator node (None for anything else)."""
    return _BY_TYPE.get(type(node))


def require_combinator(node: Node) -> CombinatorSpec:
    """The spec of a node that is not a primitive; TypeError for anything that is no DSL node."""
    spec = _BY_TYPE.get(type(node))
    if spec is None:
        raise TypeError(f"not a DSL node: {node!r}")
    return spec


class _View(Mapping):
    """A read-only mapping computed from a registry on every access (so registered entries show at once)."""

    def __init__(self, source: Mapping[str, Any], project: Callable[[Any], Any]) -> None:
        self._source, self._project = source, project

    def __getitem__(self, key: str) -> Any:
        return self._project(self._source[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._source)

    def __len__(self) -> int:
        return len(self._source)

    def __repr__(self) -> str:
        return repr(dict(self))


#: name -> ((param name, kind, default), ...) of every primitive (default ``REQUIRED`` when required)
PRIMITIVES: Mapping[str, tuple[tuple[str, str, Any], ...]] = _View(
    PRIMITIVE_SPECS, lambda s: tuple((p.name, p.kind, p.default) for p in s.params))
#: name -> estimated passes over the B x N x N score cells of the primitive's kernel (plus its lookups)
PRIMITIVE_COST: Mapping[str, int] = _View(PRIMITIVE_SPECS, lambda s: s.cost)
#: parameter kind -> its bound, as documented
KIND_BOUNDS: Mapping[str, str] = _View(KINDS, lambda k: k.bound)
#: combinator -> its bound, as documented
COMBINATOR_BOUNDS: Mapping[str, str] = _View(COMBINATOR_SPECS, lambda s: s.bound)
#: combinator -> its own work (mix: per term, fallback and mul: per argument)
COMBINATOR_COST: Mapping[str, int] = _View(COMBINATOR_SPECS, lambda s: s.cost)
