"""The JSON form: ``to_json`` / ``from_json`` (``from_json(to_json(t)) == t``), ``canonical_json`` and a
bounded ``json_loads``.

A node is an object with one key, e.g. ``{"mix": [[0.7, {"prev": 1}], [0.3, {"first": {}}]]}``;
primitive names and parameters come from the spec (headsurgeon/synth/dsl/spec.py), bounds from headsurgeon/synth/dsl/bounds.py.
The canonical JSON is what program hashes are computed from, so its form must not change.
"""
from __future__ import annotations

import json
from typing import Any

from ..errors import excerpt
from .bounds import (MAX_DEPTH, MAX_LITERAL_CHARS, MAX_NODES, _Budget, _check_text_size, _DEPTH_MESSAGE, _err,
                     _make_pred, _NODES_MESSAGE, _show)
from .build import _checked, _measure, make_mix, make_prim, make_sharpen, make_sum, validate
from .memo import memo
from .nodes import SCALARS, Fallback, Gate, Mix, Mul, Node, Pred, Prim, Sharpen, Sum
from .spec import COMBINATOR_SPECS, PRIMITIVE_SPECS

__all__ = ["to_json", "from_json", "canonical_json", "json_loads"]


def _pred_to_json(p: Pred) -> Any:
    if p.kind == "flag":
        return p.value
    if p.kind in ("pos", "dep"):
        return {p.kind: p.value}
    return {"ids": list(p.value)}


def _pred_from_json(obj: Any, where: str) -> Pred:
    if isinstance(obj, str):
        return _make_pred(obj, None, where)
    if isinstance(obj, dict) and len(obj) == 1:
        (k, v), = obj.items()
        return _make_pred(v, k, where)
    raise _err(f"{where}: a predicate is a flag name string, {{\"pos\": TAG}}, {{\"dep\": LABEL}} or "
               f"{{\"ids\": [...]}}; "
               f"got {_show(obj)}")


def _json_value(v: Any) -> Any:
    if isinstance(v, tuple):
        if set(map(type, v)) <= SCALARS:
            return list(v)  # a row of scalars (a fitted table holds thousands)
        return [_json_value(x) for x in v]
    if isinstance(v, Pred):
        return _pred_to_json(v)
    return v


def to_json(node: Node) -> Any:
    """The JSON-serializable form (dicts, lists, numbers, strings); the tree is validated first."""
    return _to_json(validate(node))


def _to_json(node: Node) -> Any:
    """``to_json`` of a validated tree (recursion depth at most MAX_DEPTH)."""
    if isinstance(node, Prim):
        spec = PRIMITIVE_SPECS[node.name]
        if not node.params:
            return {node.name: {}}
        if spec.json_scalar:
            return {node.name: node.params[0][1]}
        if spec.takes_pred:
            return {node.name: _pred_to_json(node.params[0][1])}
        return {node.name: {k: _json_value(v) for k, v in node.params if v is not None}}
    if isinstance(node, Mix):
        return {"mix": [[w, _to_json(t)] for w, t in node.terms]}
    if isinstance(node, Sum):
        return {"sum": [[w, _to_json(t)] for w, t in node.terms]}
    if isinstance(node, Fallback):
        return {"fallback": [_to_json(a) for a in node.args]}
    if isinstance(node, Mul):
        return {"mul": [_to_json(a) for a in node.args]}
    if isinstance(node, Gate):
        return {"gate": [_pred_to_json(node.pred), _to_json(node.then), _to_json(node.other)]}
    if isinstance(node, Sharpen):
        if node.by:
            return {"sharpen": [_to_json(node.arg), node.t, [[t, list(ids)] for t, ids in node.by]]}
        return {"sharpen": [_to_json(node.arg), node.t]}
    raise TypeError(f"not a DSL node: {_show(node)}")


def _json_nodes(body: Any, name: str, least: int, example: str) -> list:
    """The node list of a JSON mix/fallback/mul: ``least``..MAX_NODES entries, checked before reading them."""
    if not isinstance(body, list) or len(body) < least:
        raise _err(f"{name} expects a list of at least {least} {example}; got {_show(body)}")
    if len(body) > MAX_NODES:
        raise _err(f"{name} lists {len(body)} entries; {_NODES_MESSAGE}")
    return body


def _from_json(obj: Any, depth: int, budget: _Budget) -> Node:
    if depth > MAX_DEPTH:
        raise _err(_DEPTH_MESSAGE)
    if not isinstance(obj, dict) or len(obj) != 1:
        raise _err(
            "each DSL node is a JSON object with exactly one key (a primitive or combinator name), "
            f"e.g. {{\"prev\": 1}}; got {_show(obj)}"
        )
    budget.tick()
    (name, body), = obj.items()
    if name in ("mix", "sum"):
        terms = []
        for item in _json_nodes(body, name, 1, "[weight, node] pairs (non-empty list)"):
            if not isinstance(item, list) or len(item) != 2:
                raise _err(f"each {name} term is [weight, node]; got {_show(item)}")
            terms.append((item[0], _from_json(item[1], depth + 1, budget)))
        return make_mix(terms) if name == "mix" else make_sum(terms)
    if name in ("fallback", "mul"):
        args = tuple(_from_json(a, depth + 1, budget) for a in _json_nodes(body, name, 2, "nodes"))
        return Fallback(args) if name == "fallback" else Mul(args)
    if name == "gate":
        if not isinstance(body, list) or len(body) != 3:
            raise _err(f"gate expects [predicate, node, node]; got {_show(body)}")
        pred = _pred_from_json(body[0], "gate")
        return Gate(pred, _from_json(body[1], depth + 1, budget), _from_json(body[2], depth + 1, budget))
    if name == "sharpen":
        if not isinstance(body, list) or len(body) not in (2, 3):
            raise _err(f"sharpen expects [node, t] or [node, t, [[t1, [ids..]], ..]]; got {_show(body)}")
        return make_sharpen(_from_json(body[0], depth + 1, budget), body[1], body[2] if len(body) == 3 else None)
    if name not in PRIMITIVE_SPECS:
        raise _err(
            f"unknown primitive {_show(name)}; primitives: {', '.join(sorted(PRIMITIVE_SPECS))}; "
            f"combinators: {', '.join(COMBINATOR_SPECS)}"
        )
    spec = PRIMITIVE_SPECS[name]
    if spec.takes_pred:
        return _checked(Prim(name, ((spec.params[0].name, _pred_from_json(body, name)),)))
    if body is None or (isinstance(body, (dict, list)) and not body):
        return make_prim(name, [], {})
    if isinstance(body, dict):
        return make_prim(name, [], body)
    if isinstance(body, list):
        return make_prim(name, body, {})
    return make_prim(name, [body], {})


def json_loads(text: str | bytes | bytearray) -> Any:
    """Parse a JSON document of at most MAX_TEXT_CHARS characters; any failure is a ProgramValidationError."""
    _check_text_size(text, "DSL JSON")
    try:
        return json.loads(text)
    except RecursionError:
        raise _err(f"DSL JSON nests too deeply; a program nests at most {MAX_DEPTH} levels (MAX_DEPTH)") from None
    except json.JSONDecodeError as e:
        raise _err(f"DSL JSON does not parse: {excerpt(str(e))}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts, or bad UTF-8
        raise _err(f"DSL JSON does not parse: {excerpt(str(e))}; numbers need at most "
                   f"{MAX_LITERAL_CHARS} characters (MAX_LITERAL_CHARS)") from None


def from_json(obj: Any) -> Node:
    """Read the JSON form (a parsed object or a JSON string) into a validated tree."""
    if isinstance(obj, (str, bytes, bytearray)):
        obj = json_loads(obj)
    node = _from_json(obj, 1, _Budget())
    _measure(node, check=False)
    return _checked(node)


def canonical_json(node: Node) -> str:
    """Compact, key-sorted JSON text: the canonical form that program hashes are computed from (validated first)."""
    return memo(node, "canonical_json",
                lambda: json.dumps(to_json(node), sort_keys=True, separators=(",", ":"), ensure_ascii=True))

