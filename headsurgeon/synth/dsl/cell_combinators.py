"""The combinators' cells adapters: each composes its children on a fit set's compact cells like its dense twin.

Referenced from the combinators' declarations in headsurgeon/synth/dsl/catalog.py (``cells=``). The cells are the visible
cells of a batch in (sequence, query, key) order, each query row a contiguous segment starting at its key-0
cell; the enumerative searcher's fit set holds them (headsurgeon/synth/search/enumerative/fitset.py ``FitSet``, which
implements ``Cells``). Each adapter repeats its dense kernel's semantics in float32 values with float64 sums
(``sum``'s saturating accumulation and the row passes compiled in headsurgeon/kernels/cell_kernels.py), so the searcher's
scores agree with the kernels' to float rounding (tests/synth/test_enumerative.py).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from headsurgeon.kernels.cell_kernels import saturating_add
from .nodes import Fallback, Gate, Mix, Mul, Node, Pred, Sharpen, Sum
from .spec import CellsAdapter

__all__ = ["Cells", "F32_MAX", "MIX_CELLS", "SUM_CELLS", "FALLBACK_CELLS", "GATE_CELLS", "SHARPEN_CELLS",
           "MUL_CELLS"]

#: float32's largest value (the kernels' ``sum`` saturates there)
F32_MAX = float(np.finfo(np.float32).max)


class Cells(Protocol):
    """What a cells adapter reads: the layout of the compact cells and the evaluation of children on them."""

    C: int  # cells
    R: int  # query rows
    row_of_cell: np.ndarray  # int64 [C]: each cell's query row
    row_tok: np.ndarray  # int64 [R]: each row's query token id
    cell_key: np.ndarray  # int64 [C]: each cell's key token id
    cell_d: np.ndarray  # int32 [C]: query position - key position
    cell_first: np.ndarray  # bool [C]: the cell of key 0

    def values(self, node: Node, memo: dict) -> tuple[np.ndarray, np.ndarray]:
        """(row-normalized scores [C] with empty rows 0, empty rows [R]) of a subtree, memoized in ``memo``."""

    def raw(self, node: Node, memo: dict) -> np.ndarray:
        """Raw scores [C] of a subtree as its dense kernel hands them to ``sum``."""

    def rownorm(self, v: np.ndarray) -> np.ndarray:
        """``v`` [C] with each row divided by its sum, in place (empty rows stay 0)."""

    def row_sums(self, v: np.ndarray) -> np.ndarray:
        """Each row's sum of ``v`` [C] -> [R]."""

    def query_rows(self, pred: Pred) -> np.ndarray:
        """Boolean [R]: the query rows whose token satisfies ``pred``."""


def normalized_raw(node: Node, cells: Cells, memo: dict) -> np.ndarray:
    """The raw scores of a combinator whose kernel normalizes its rows (sum, sharpen): its values."""
    return cells.values(node, memo)[0]


def mix_values(node: Mix, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sum of row-normalized children, normalized; empty where every child is (``_mix``)."""
    acc = np.zeros(cells.C, dtype=np.float32)
    emp = np.ones(cells.R, dtype=bool)
    for w, t in node.terms:
        v, e = cells.values(t, memo)
        acc += np.float32(w) * v
        emp &= e
    return cells.rownorm(acc), emp


def mix_raw(node: Mix, cells: Cells, memo: dict) -> np.ndarray:
    """Weighted sum of row-normalized children, not normalized again (what ``_mix`` returns)."""
    out = np.zeros(cells.C, dtype=np.float32)
    for w, t in node.terms:
        out += np.float32(w) * cells.values(t, memo)[0]
    return out


def sum_values(node: Sum, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sum of raw children (float64 sums saturating at float32's max, as ``raw_accumulate``), normalized."""
    acc = np.zeros(cells.C, dtype=np.float32)
    for w, t in node.terms:  # acc = float32(min(acc + w * raw, F32_MAX)) in float64, one compiled pass a term
        saturating_add(acc, float(w), np.ascontiguousarray(cells.raw(t, memo)))
    v = cells.rownorm(acc)
    return v, cells.row_sums(v) <= 0  # emptiness of the normalized rows


def gate_values(node: Gate, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose query satisfies the predicate take ``then``, the others ``other`` (``_gate``)."""
    rows = cells.query_rows(node.pred)
    va, ea = cells.values(node.then, memo)
    vb, eb = cells.values(node.other, memo)
    return np.where(rows[cells.row_of_cell], va, vb), np.where(rows, ea, eb)


def gate_raw(node: Gate, cells: Cells, memo: dict) -> np.ndarray:
    """The raw scores of ``then`` on the predicate's rows, of ``other`` elsewhere."""
    rows = cells.query_rows(node.pred)[cells.row_of_cell]
    return np.where(rows, cells.raw(node.then, memo), cells.raw(node.other, memo))


def fallback_values(node: Fallback, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first child whose row is non-empty (``_fallback``)."""
    v, e = cells.values(node.args[0], memo)
    for alt in node.args[1:]:
        va, ea = cells.values(alt, memo)
        v = np.where(e[cells.row_of_cell], va, v)
        e = e & ea
    return v, e


def fallback_raw(node: Fallback, cells: Cells, memo: dict) -> np.ndarray:
    """Per row, the raw scores of the first child whose row is non-empty."""
    out, e = cells.raw(node.args[0], memo), cells.values(node.args[0], memo)[1]
    for alt in node.args[1:]:
        out = np.where(e[cells.row_of_cell], cells.raw(alt, memo), out)
        e = e & cells.values(alt, memo)[1]
    return out


def sharpen_values(node: Sharpen, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """The child to the power t (float32; per query token class with ``by``), normalized (``_sharpen``)."""
    v, e = cells.values(node.arg, memo)
    if node.by:
        texp = np.full(cells.R, node.t, dtype=np.float32)
        for tk, ids in node.by:
            texp[np.isin(cells.row_tok, np.asarray(ids, dtype=np.int64))] = tk
        return cells.rownorm(np.power(v, texp[cells.row_of_cell])), e
    return cells.rownorm(np.power(v, np.float32(node.t))), e


def mul_values(node: Mul, cells: Cells, memo: dict) -> tuple[np.ndarray, np.ndarray]:
    """Elementwise product of the normalized children, normalized; empty where the product's row is (``_mul``)."""
    v = cells.values(node.args[0], memo)[0].copy()
    for other in node.args[1:]:
        v *= cells.values(other, memo)[0]
    empty = cells.row_sums(v) <= 0
    return cells.rownorm(v), empty


def mul_raw(node: Mul, cells: Cells, memo: dict) -> np.ndarray:
    """Elementwise product of the children's raw scores."""
    out = cells.raw(node.args[0], memo).copy()
    for other in node.args[1:]:
        out *= cells.raw(other, memo)
    return out


MIX_CELLS = CellsAdapter(mix_values, mix_raw)
SUM_CELLS = CellsAdapter(sum_values, normalized_raw)
FALLBACK_CELLS = CellsAdapter(fallback_values, fallback_raw)
GATE_CELLS = CellsAdapter(gate_values, gate_raw)
SHARPEN_CELLS = CellsAdapter(sharpen_values, normalized_raw)
MUL_CELLS = CellsAdapter(mul_values, mul_raw)
