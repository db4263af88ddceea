"""headsurgeon/synth/dsl/memo.py: a derived value is computed once per node object, equals the unmemoized value, and is
forgotten with its node."""
from __future__ import annotations

import gc
import pickle

from headsurgeon.synth import dsl
from headsurgeon.synth.dsl import memo as memo_module
from headsurgeon.synth.dsl.jsonform import to_json
from headsurgeon.synth.dsl.printer import _combinator_text, _prim_text
from headsurgeon.synth.dsl.size import _literals

TABLE = "mul(profile(w=[1, 0.5], bos=2), class_weight(q=[[3, 7]], k=[[5, 9]], w=[[4]]))"


def test_a_value_is_computed_once_per_node_object():
    node = dsl.parse("prev(1)")
    calls = []
    for _ in range(3):
        assert memo_module.memo(node, "probe", lambda: calls.append(1) or "v") == "v"
    assert calls == [1]
    other = dsl.parse("prev(1)")  # an equal node is another object: its own entry
    memo_module.memo(other, "probe", lambda: calls.append(1) or "v")
    assert calls == [1, 1]


def test_memoized_text_size_and_json_equal_the_direct_computation():
    import json

    node = dsl.parse(f"0.6*{TABLE} + 0.4*prev(1)")
    for _ in range(2):  # the second round reads the memo
        assert dsl.to_text(node) == _combinator_text(node, None)
        assert dsl.canonical_json(node) == json.dumps(to_json(node), sort_keys=True, separators=(",", ":"))
        prim = node.terms[0][1].args[1]
        assert dsl.size(prim) == 1 + sum(_literals(v) for _, v in prim.params)
        assert dsl.to_text(prim) == _prim_text(prim, None)
    assert dsl.parse(dsl.to_text(node)) == node


def test_the_memo_is_dropped_with_its_node_and_never_pickled():
    node = dsl.parse(TABLE)
    dsl.to_text(node)
    key = id(node)
    assert key in memo_module._MEMO
    assert b"class_weight(" not in pickle.dumps(node)  # the cached text does not travel
    del node
    gc.collect()
    assert key not in memo_module._MEMO


def test_a_node_hash_is_the_dataclass_hash_computed_once(monkeypatch):
    """Nodes hash as the tuple of their fields (what the frozen dataclasses computed), once per node object."""
    from dataclasses import fields

    node = dsl.parse(TABLE)
    for n in [node, *node.args]:
        assert hash(n) == hash(tuple(getattr(n, f.name) for f in fields(n)))
    fresh = dsl.parse(TABLE)
    assert hash(fresh) == hash(node) and fresh == node and len({node, fresh}) == 1
    real_memo = memo_module.memo
    asked = []
    monkeypatch.setattr("headsurgeon.synth.dsl.nodes.memo",
                        lambda n, name, compute: real_memo(n, name, lambda: asked.append(name) or compute()))
    probe = dsl.parse("mul(profile(w=[1, 0.25]), key_weight(w=[[3, 2]]))")
    for _ in range(3):
        hash(probe)
    assert asked.count("hash") == 3  # the Mul and its two primitives, each once


def test_a_programs_canonical_form_and_hash_are_computed_on_first_use_only():
    import hashlib

    from headsurgeon.synth.program import Program

    program = Program.parse(TABLE)
    assert program._canonical is None and program._hash is None  # rendering needs neither
    assert program.hash == hashlib.sha256(program.canonical.encode("utf-8")).hexdigest()
    assert program.canonical == "dsl:" + dsl.canonical_json(program.node)
    back = pickle.loads(pickle.dumps(program))
    assert back == program and back.hash == program.hash and hash(back) == hash(program)
