"""Building and checking trees: bind a primitive's arguments against its spec, and walk whole trees.

One check for text, JSON and trees built in code: ``make_prim`` checks each parameter against its kind
(headsurgeon/synth/dsl/bounds.py) as declared in the spec (headsurgeon/synth/dsl/spec.py); ``validate`` walks a tree enforcing
MAX_DEPTH, MAX_NODES and MAX_COST and each node's bounds; ``features_needed`` reads the spec's features.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .bounds import (KINDS, MAX_COST, MAX_DEPTH, MAX_NODES, MAX_WEIGHT, _as_float, _check_pred, _DEPTH_MESSAGE,
                     _err, _mix_weight, _NODES_MESSAGE, _sharpen_classes, _sharpen_exponent, _show)
from .nodes import Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum, children
from .spec import COMBINATOR_SPECS, PRIMITIVE_SPECS, REQUIRED, require_combinator

__all__ = ["make_prim", "make_mix", "make_sum", "make_sharpen", "validate", "cost", "features_needed"]


def _unknown(name: Any) -> Exception:
    return _err(f"unknown primitive {_show(name)}; primitives: {', '.join(sorted(PRIMITIVE_SPECS))}; "
                f"combinators: {', '.join(COMBINATOR_SPECS)}")


def make_prim(name: str, positional: Sequence[Any], keywords: Mapping[str, Any]) -> Prim:
    """Bind positional/keyword arguments to a primitive's parameters, with clear errors."""
    if not isinstance(name, str) or name not in PRIMITIVE_SPECS:
        raise _unknown(name)
    spec = PRIMITIVE_SPECS[name]
    sig = ", ".join(p.name for p in spec.params)
    if len(positional) > len(spec.params):
        raise _err(f"{name}({sig}) takes {len(spec.params)} argument(s); got {len(positional) + len(keywords)}")
    bound: dict[str, Any] = {}
    for p, value in zip(spec.params, positional):
        bound[p.name] = value
    names = {p.name for p in spec.params}
    for key, value in keywords.items():
        if key not in names:
            raise _err(f"{name}() has no parameter {_show(key)}; its signature is {name}({sig})")
        if key in bound:
            raise _err(f"{name}() got parameter {key!r} twice")
        bound[key] = value
    params = []
    for p in spec.params:
        if p.name not in bound:
            if p.default is REQUIRED:
                raise _err(f"{name}({sig}) is missing parameter {p.name!r}")
            bound[p.name] = p.default
        bound[p.name] = KINDS[p.kind].check(bound[p.name], f"{name}({p.name}=...)", bound)
        params.append((p.name, bound[p.name]))
    if spec.check is not None:
        spec.check(bound)
    return _checked(Prim(name, tuple(params)))


def make_mix(terms: Sequence[tuple[Any, Any]]) -> Mix:
    """A mix of ``(weight, node)`` terms, the weights checked."""
    if not terms:
        raise _err("mix needs at least one [weight, expression] term")
    return Mix(tuple((_mix_weight(w), node) for w, node in terms))


def _sum_weight(w: Any) -> float:
    """A sum weight: 0 < w <= MAX_WEIGHT."""
    wf = _as_float(w, "sum weight")
    if not 0.0 < wf <= MAX_WEIGHT:
        raise _err(f"sum weights must be > 0 and at most {MAX_WEIGHT:g} (MAX_WEIGHT; scores are float32); got {wf}")
    return wf


def make_sum(terms: Sequence[tuple[Any, Any]]) -> Sum:
    """A raw sum of ``(weight, node)`` terms (rows normalized once at the end), the weights checked."""
    if not terms:
        raise _err("sum needs at least one [weight, expression] term")
    if len(terms) > MAX_NODES:
        raise _err(f"sum lists {len(terms)} terms; {_NODES_MESSAGE}")
    return Sum(tuple((_sum_weight(w), node) for w, node in terms))


def make_sharpen(arg: Any, t: Any, by: Any = None) -> Sharpen:
    """``sharpen(arg, t)``, or with per-query-token exponents ``by=[[t1, [ids..]], ..]``, checked."""
    tf = _sharpen_exponent(t, "sharpen(A, t) exponent t")
    if by is None or (isinstance(by, (list, tuple)) and not by):
        return Sharpen(arg, tf)
    return Sharpen(arg, tf, _sharpen_classes(by))

# Nodes known to satisfy every bound (checked primitives, validated roots), by identity.
N = TypeVar("N", bound=Node)  # _checked hands back the node type it was given

_CHECKED: "weakref.WeakValueDictionary[int, Node]" = weakref.WeakValueDictionary()


def _checked(node: N) -> N:
    """Record that ``node`` passed its checks, so ``validate`` need not repeat them."""
    try:
        _CHECKED[id(node)] = node
    except TypeError:  # not weakly referenceable: it is simply checked again next time
        pass
    return node


def _is_checked(node: object) -> bool:
    return _CHECKED.get(id(node)) is node


def _node_cost(node: Node) -> int:
    """Estimated passes over the score cells that ``node`` itself makes (children not included)."""
    if isinstance(node, Prim):
        return PRIMITIVE_SPECS[node.name].cost
    spec = require_combinator(node)
    return spec.cost * len(children(node)) if spec.cost_per_child else spec.cost


def _spec_params(name: Any) -> tuple:
    spec = PRIMITIVE_SPECS.get(name) if isinstance(name, str) else None
    return spec.params if spec is not None else ()


def _node_args(args: Any, name: str) -> None:
    """fallback/mul arguments: a tuple of 2..MAX_NODES nodes."""
    if not isinstance(args, tuple) or not 2 <= len(args) <= MAX_NODES:
        raise _err(f"{name} needs a tuple of 2 to {MAX_NODES} expressions (MAX_NODES); got {_show(args)}")


def _check_node(node: Node) -> None:
    """Check one node built in code against its bounds (its children are checked on their own)."""
    if isinstance(node, Prim):
        if (not isinstance(node.params, tuple) or len(node.params) > len(_spec_params(node.name))
                or any(not isinstance(p, tuple) or len(p) != 2 for p in node.params)):
            raise _err(f"{_show(node.name)}: params must be a tuple of (name, value) pairs, one per parameter "
                       "of the primitive's spec")
        make_prim(node.name, [], dict(node.params))
    elif isinstance(node, Mix):
        if not isinstance(node.terms, tuple) or not 1 <= len(node.terms) <= MAX_NODES:
            raise _err(f"mix needs a tuple of 1 to {MAX_NODES} (weight, expression) terms (MAX_NODES)")
        for term in node.terms:
            if not isinstance(term, tuple) or len(term) != 2:
                raise _err(f"each mix term is (weight, expression); got {_show(term)}")
            _mix_weight(term[0])
    elif isinstance(node, Sum):
        if not isinstance(node.terms, tuple) or not 1 <= len(node.terms) <= MAX_NODES:
            raise _err(f"sum needs a tuple of 1 to {MAX_NODES} (weight, expression) terms (MAX_NODES)")
        for term in node.terms:
            if not isinstance(term, tuple) or len(term) != 2:
                raise _err(f"each sum term is (weight, expression); got {_show(term)}")
            _sum_weight(term[0])
    elif isinstance(node, (Fallback, Mul)):
        _node_args(node.args, "fallback" if isinstance(node, Fallback) else "mul")
    elif isinstance(node, Gate):
        if not isinstance(node.pred, Pred):
            raise _err(f"gate(PRED, A, B) needs a predicate; got {_show(node.pred)}")
        _check_pred(node.pred, "gate()")
    elif isinstance(node, Sharpen):
        _sharpen_exponent(node.t, "sharpen(A, t) exponent t")
        if node.by:
            _sharpen_classes(node.by)
    else:
        raise _err(f"not a DSL node: {_show(node)}")


def _measure(node: Node, check: bool) -> int:
    """Walk the tree (iteratively) enforcing MAX_DEPTH, MAX_NODES and MAX_COST; ``check``: every node's bounds too.

    Returns the program's cost.
    """
    count = total = 0
    stack = [(node, 1)]
    while stack:
        cur, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise _err(_DEPTH_MESSAGE)
        if count > MAX_NODES:
            raise _err(_NODES_MESSAGE)
        if check and not _is_checked(cur):
            _check_node(cur)
        total += _node_cost(cur)
        if total > MAX_COST:
            raise _err(f"program's estimated cost exceeds MAX_COST ({MAX_COST} passes over the score cells; "
                       "see dsl.cost): use fewer terms, or fewer sharpen/match/class nodes")
        stack.extend((c, depth + 1) for c in children(cur))
    return total


def validate(node: Node) -> Node:
    """Check a tree, however it was built, against every bound of the module docstring; return it.

    Raises ProgramValidationError. Trees from ``parse`` / ``from_json`` and trees validated before are
    recognized (by identity) and not walked again.
    """
    if _is_checked(node):
        return node
    _measure(node, check=True)
    return _checked(node)


def cost(node: Node) -> int:
    """The program's estimated cost: passes over the B x N x N score cells (bounded by MAX_COST)."""
    validate(node)
    return _measure(node, check=False)


def features_needed(node: Node) -> frozenset[str]:
    """Names of the feature arrays (``batch_feature_arrays``) the program reads."""
    need: set[str] = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        stack.extend(children(cur))
        preds = [cur.pred] if isinstance(cur, Gate) else []
        if isinstance(cur, Prim):
            spec = PRIMITIVE_SPECS[cur.name]
            need.update(spec.features)
            for p in spec.params:
                value = cur.param(p.name)
                if p.kind == "pred":
                    preds.append(value)
                elif p.kind == "feature" and value not in ("token", "position"):
                    need.add(value)
        for pred in preds:
            if pred.kind == "flag":
                need.add(pred.value)
            elif pred.kind in ("pos", "dep"):
                need.add(pred.kind)
    return frozenset(need)
