"""The discretized Transformer Program: every gate, predicate and MLP replaced by its argmax, in numpy.

``discretize(model, vocab, labels)`` reads a trained ``TransformerProgram`` and returns a
``DiscreteProgram``: which variable each head reads for Q/K/V, each predicate as a map from query value to
the accepted key value, each MLP as a lookup table over its two inputs, and the classifier weights per
variable value (float64). ``DiscreteProgram.predict`` runs it vectorized; the decompiled Python module
(``decompile.py``) runs the same computation one token at a time and must agree exactly.

Semantics (identical in ``predict`` and the decompiled source):

* a categorical head at query ``i`` selects, among keys ``j`` (``j <= i`` when causal) whose key value is
  ``pred[query value]``, the one of smallest ``closeness(i, j)`` (nearest; left before right at equal
  distance; the query itself last); with no match it selects position 0 (BOS); the output is the value
  variable at the selected key;
* a numerical head outputs the sum of its value variable over the matching keys (a count when the value
  is ``ones``); ``num_bounds`` holds each numerical variable's largest possible value
  (``ones``: 1; a head: ``n_ctx`` times its value's bound);
* categorical MLP outputs are table lookups; a numerical MLP is its trained ReLU network evaluated in
  float64 (hidden unit by hidden unit, in a fixed order) and the argmax taken, so any integer input
  gives the same answer in numpy and in the decompiled Python (which prints it as a table when the
  inputs' ranges are small);
* logits = sum over categorical variables (stream order) of ``w_cat[var][value]``, then over numerical
  variables of ``value * w_num[var]``, accumulated in float64 in that order; the label is the first
  maximum among unmasked labels.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .model import MLPs, TransformerProgram
from ..core import InputError


def closeness_np(n: int) -> np.ndarray:
    """numpy twin of ``model.closeness``: rank of key j for query i, lower preferred, the query itself last."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    rank = 2 * np.abs(i - j) - (j < i).astype(np.int64)
    return np.where(i == j, 2 * n, rank)


@dataclass
class CatHead:
    """A categorical head: Q/K/V variable names and ``pred[a]`` = key value accepted for query value ``a``."""

    layer: int
    head: int
    q: str
    k: str
    v: str
    pred: list[int]

    @property
    def name(self) -> str:
        return f"attn_{self.layer}_{self.head}"


@dataclass
class NumHead:
    """A numerical head: Q/K variable names, its predicate map and the numerical variable it sums."""

    layer: int
    head: int
    q: str
    k: str
    pred: list[int]
    v: str = "ones"

    @property
    def name(self) -> str:
        return f"num_attn_{self.layer}_{self.head}"


@dataclass
class MLPTable:
    """An MLP: categorical ones as a lookup table ``table[a][b]`` (output value for input values a, b);
    numerical ones as float64 weights (``w_a``, ``w_b``, ``b_in`` per hidden unit, ``w_out [hidden][k]``,
    ``b_out [k]``) evaluated by ``numeric_mlp``."""

    layer: int
    index: int
    numeric: bool
    a: str
    b: str
    table: list[list[int]] | None = None
    weights: dict | None = None

    @property
    def name(self) -> str:
        return f"{'num_mlp' if self.numeric else 'mlp'}_{self.layer}_{self.index}"

    @property
    def network(self) -> dict:
        """A numerical MLP's weights (a categorical one has a table instead)."""
        if self.weights is None:
            raise ValueError(f"{self.name} is categorical: it holds a lookup table, not weights")
        return self.weights

    @property
    def lookup(self) -> list[list[int]]:
        """A categorical MLP's table (a numerical one has weights instead)."""
        if self.table is None:
            raise ValueError(f"{self.name} is numerical: it holds weights, not a lookup table")
        return self.table


def numeric_mlp(weights: dict, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Output value of a numerical MLP for integer inputs ``a``, ``b`` (any shape), in float64 with the
    exact operation order the decompiled Python uses: ``h_j = relu(w_a[j]*a + w_b[j]*b + b_in[j])``,
    ``out_c = b_out[c] + h_0*w_out[0][c] + h_1*w_out[1][c] + ...``, then the first maximum."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    w_out = np.asarray(weights["w_out"], dtype=np.float64)
    acc = np.broadcast_to(np.asarray(weights["b_out"], dtype=np.float64), (*a.shape, w_out.shape[1])).copy()
    for j, (wa, wb, bi) in enumerate(zip(weights["w_a"], weights["w_b"], weights["b_in"])):
        h = wa * a + wb * b + bi
        h = np.where(h > 0.0, h, 0.0)
        acc = acc + h[..., None] * w_out[j]
    return acc.argmax(-1)


@dataclass
class DiscreteProgram:
    """A discretized Transformer Program over padded token-id arrays (0 = PAD, position 0 = BOS)."""

    name: str
    vocab: list[str]
    labels: list[str]
    d_var: int
    n_ctx: int
    causal: bool
    masked_labels: list[int]
    cat_vars: list[str]
    num_vars: list[str]
    value_labels: dict[str, list]
    num_bounds: dict[str, int]
    layers: list[dict]
    w_cat: dict[str, list[list[float]]]
    w_num: dict[str, list[float]]
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ structure
    def cat_heads(self) -> list[CatHead]:
        return [h for layer in self.layers for h in layer["cat_heads"]]

    def num_heads(self) -> list[NumHead]:
        return [h for layer in self.layers for h in layer["num_heads"]]

    def mlps(self) -> list[MLPTable]:
        return [m for layer in self.layers for m in layer["cat_mlps"] + layer["num_mlps"]]

    # ------------------------------------------------------------------ execution
    def predict(self, x: np.ndarray, trace: dict | None = None) -> np.ndarray:
        """Label ids ``[B, N]`` for token ids ``[B, N]`` (0 = PAD; predictions at PAD positions are 0).

        With a ``trace`` dict, every variable's values ``[B, N]`` are stored in it by name, and each
        categorical head's selected key index as ``"{head}_selected"``.
        """
        x = np.asarray(x, dtype=np.int64)
        if x.ndim != 2:
            raise InputError(f"expected token ids of shape [batch, length], got {x.shape}")
        b, n = x.shape
        if n > self.n_ctx:
            raise InputError(f"length {n} exceeds n_ctx={self.n_ctx}")
        real = x != 0
        keymask = real[:, None, :] & real[:, :, None]
        if self.causal:
            keymask &= np.tri(n, dtype=bool)[None]
        rank = closeness_np(n)[None].astype(np.float64)
        cat: dict[str, np.ndarray] = {"tokens": x, "positions": np.broadcast_to(np.arange(n), (b, n)).copy()}
        num: dict[str, np.ndarray] = {"ones": np.ones((b, n), dtype=np.int64)}

        def matches(q, k, pred):
            want = np.asarray(pred, dtype=np.int64)[cat[q]]
            return (want[:, :, None] == cat[k][:, None, :]) & keymask

        for layer in self.layers:
            new_cat: dict[str, np.ndarray] = {}
            for h in layer["cat_heads"]:
                m = matches(h.q, h.k, h.pred)
                j = np.where(m, rank, np.inf).argmin(-1)
                j = np.where(m.any(-1), j, 0)
                if trace is not None:
                    trace[f"{h.name}_selected"] = j
                new_cat[f"{h.name}_outputs"] = np.take_along_axis(cat[h.v], j, axis=1)
            for h in layer["num_heads"]:
                m = matches(h.q, h.k, h.pred)
                num[f"{h.name}_outputs"] = (m * num[h.v][:, None, :]).sum(-1).astype(np.int64)
            cat.update(new_cat)
            for mt in layer["cat_mlps"]:
                cat[f"{mt.name}_outputs"] = np.asarray(mt.table, dtype=np.int64)[cat[mt.a], cat[mt.b]]
            for mt in layer["num_mlps"]:
                cat[f"{mt.name}_outputs"] = numeric_mlp(mt.weights, num[mt.a], num[mt.b]).astype(np.int64)
        logits = np.zeros((b, n, len(self.labels)), dtype=np.float64)
        for var in self.cat_vars:
            logits = logits + np.asarray(self.w_cat[var], dtype=np.float64)[cat[var]]
        for var in self.num_vars:
            logits = logits + num[var][..., None] * np.asarray(self.w_num[var], dtype=np.float64)
        logits[..., self.masked_labels] = -np.inf
        if trace is not None:
            trace.update(cat)
            trace.update(num)
        return np.where(real, logits.argmax(-1), 0)

    # ------------------------------------------------------------------ serialization
    def to_json(self) -> dict:
        """JSON-ready dict (no pickle); ``from_json`` inverts it."""
        layers = []
        for layer in self.layers:
            layers.append({key: [vars(item) for item in items] for key, items in layer.items()})
        return {
            "name": self.name,
            "vocab": self.vocab,
            "labels": self.labels,
            "d_var": self.d_var,
            "n_ctx": self.n_ctx,
            "causal": self.causal,
            "masked_labels": self.masked_labels,
            "cat_vars": self.cat_vars,
            "num_vars": self.num_vars,
            "value_labels": self.value_labels,
            "num_bounds": self.num_bounds,
            "layers": layers,
            "w_cat": self.w_cat,
            "w_num": self.w_num,
        }

    @classmethod
    def from_json(cls, obj: dict) -> "DiscreteProgram":
        kinds = {"cat_heads": CatHead, "num_heads": NumHead, "cat_mlps": MLPTable, "num_mlps": MLPTable}
        layers = [{key: [kinds[key](**item) for item in items] for key, items in layer.items()} for layer in obj["layers"]]
        return cls(**{**obj, "layers": layers})


def _value_labels(model: TransformerProgram, vocab: list[str]) -> dict[str, list]:
    """Label of every value of every categorical variable; ``None`` for values that cannot occur."""
    cfg = model.cfg
    k = cfg.d_var
    labels: dict[str, list] = {
        "tokens": [vocab[i] if 0 < i < len(vocab) else None for i in range(k)],
        "positions": [i if i < cfg.n_ctx else None for i in range(k)],
    }
    for l, layer in enumerate(model.layers):
        names_in = cfg.cat_var_names(l)
        if layer.cat_attn is not None:
            for h, v in enumerate(layer.cat_attn.v.choice()):
                labels[f"attn_{l}_{h}_outputs"] = list(labels[names_in[v]])
        for m in range(cfg.n_cat_mlps):
            labels[f"mlp_{l}_{m}_outputs"] = list(range(k))
        for m in range(cfg.n_num_mlps):
            labels[f"num_mlp_{l}_{m}_outputs"] = list(range(k))
    return labels


@torch.no_grad()
def _mlp_tables(mlps: MLPs, k: int) -> list[list[list[int]]]:
    """Run every categorical MLP on every pair of one-hot input values and take the argmax."""
    eye = torch.eye(k)
    a = eye.repeat_interleave(k, 0).unsqueeze(0).expand(mlps.n, -1, -1).contiguous()
    b = eye.repeat(k, 1).unsqueeze(0).expand(mlps.n, -1, -1).contiguous()
    out = mlps.logits(a, b)
    return [out[m].argmax(-1).reshape(k, k).tolist() for m in range(mlps.n)]


@torch.no_grad()
def _mlp_weights(mlps: MLPs) -> list[dict]:
    """float64 weights of every numerical MLP (see ``numeric_mlp``)."""
    out = []
    for m in range(mlps.n):
        out.append({
            "w_a": mlps.w_a[m, 0].double().tolist(),
            "w_b": mlps.w_b[m, 0].double().tolist(),
            "b_in": mlps.b_in[m, 0].double().tolist(),
            "w_out": mlps.w_out[m].double().tolist(),
            "b_out": mlps.b_out[m, 0].double().tolist(),
        })
    return out


@torch.no_grad()
def discretize(model: TransformerProgram, vocab: list[str], labels: list[str], name: str = "program") -> DiscreteProgram:
    """Argmax every choice of a trained model into a ``DiscreteProgram``."""
    cfg = model.cfg
    if len(vocab) != cfg.n_tokens or len(labels) != cfg.n_labels:
        raise InputError(
            f"vocab/labels ({len(vocab)}/{len(labels)}) do not match the model ({cfg.n_tokens}/{cfg.n_labels}); "
            "pass the vocabularies of the data the model was trained on"
        )
    layers = []
    bounds: dict[str, int] = {"ones": 1}
    for l, layer in enumerate(model.layers):
        names_in = cfg.cat_var_names(l)
        nums_in = cfg.num_var_names(l)
        entry: dict[str, list] = {"cat_heads": [], "num_heads": [], "cat_mlps": [], "num_mlps": []}
        if layer.cat_attn is not None:
            a = layer.cat_attn
            pred = a.pred.choice().tolist()
            for h, (q, kk, v) in enumerate(zip(a.q.choice(), a.key.choice(), a.v.choice())):
                entry["cat_heads"].append(CatHead(l, h, names_in[q], names_in[kk], names_in[v], pred[h]))
        if layer.num_attn is not None:
            a = layer.num_attn
            pred = a.pred.choice().tolist()
            values = [nums_in[i] for i in a.v.choice()] if a.v is not None else ["ones"] * cfg.n_heads_num
            for h, (q, kk) in enumerate(zip(a.q.choice(), a.key.choice())):
                entry["num_heads"].append(NumHead(l, h, names_in[q], names_in[kk], pred[h], values[h]))
                bounds[f"num_attn_{l}_{h}_outputs"] = cfg.n_ctx * bounds[values[h]]
        mid_names = names_in + [f"attn_{l}_{h}_outputs" for h in range(cfg.n_heads_cat)]
        mid_nums = nums_in + [f"num_attn_{l}_{h}_outputs" for h in range(cfg.n_heads_num)]
        for key, mlps, names in (("cat_mlps", layer.cat_mlp, mid_names), ("num_mlps", layer.num_mlp, mid_nums)):
            if mlps is None:
                continue
            params = _mlp_weights(mlps) if mlps.numeric else _mlp_tables(mlps, cfg.d_var)
            for m, (ia, ib) in enumerate(zip(mlps.gate_a.choice(), mlps.gate_b.choice())):
                if mlps.numeric:
                    entry[key].append(MLPTable(l, m, True, names[ia], names[ib], weights=params[m]))
                else:
                    entry[key].append(MLPTable(l, m, False, names[ia], names[ib], table=params[m]))
        layers.append(entry)
    cat_vars, num_vars = cfg.cat_var_names(), cfg.num_var_names()
    w_cat = model.w_cat.detach().double()
    w_num = model.w_num.detach().double()
    return DiscreteProgram(
        name=name,
        vocab=list(vocab),
        labels=list(labels),
        d_var=cfg.d_var,
        n_ctx=cfg.n_ctx,
        causal=cfg.causal,
        masked_labels=list(cfg.masked_labels),
        cat_vars=cat_vars,
        num_vars=num_vars,
        value_labels=_value_labels(model, vocab),
        num_bounds=bounds,
        layers=layers,
        w_cat={v: w_cat[i].tolist() for i, v in enumerate(cat_vars)},
        w_num={v: w_num[i].tolist() for i, v in enumerate(num_vars)},
    )
