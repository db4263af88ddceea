"""The Transformer Program model: a transformer whose residual stream is a list of named one-hot variables.

Stream layout (Friedman, Wettig & Chen 2023, section 3):

* categorical variables, each a (soft) one-hot over ``k = d_var`` values: ``tokens``, ``positions``, then
  per layer one variable per categorical head (``attn_{l}_{h}_outputs``), per categorical MLP
  (``mlp_{l}_{m}_outputs``) and per numerical MLP (``num_mlp_{l}_{m}_outputs``);
* numerical variables, one scalar each: ``ones`` (1 at every token), then per layer one per numerical
  head (``num_attn_{l}_{h}_outputs``).

Modules read whole variables through Gumbel-softmax gates over the variables present so far (one gate for
Q, one for K, one for V; two for an MLP), so after ``argmax`` every read names exactly one variable.

* Categorical attention: the query value ``a`` selects key value ``pred[a]`` (a k x k predicate matrix,
  row-wise Gumbel-softmax); each query attends to the *closest* matching key (``closeness`` below) and to
  BOS (position 0) when no key matches; the output is the value variable at the chosen key.
* Numerical attention: the same predicate, but the output is the sum, over the matching keys, of a
  numerical variable chosen by a V gate (``ones`` makes it a count; a previous head's output makes it a
  sum of counts), as in the paper's code. ``num_value_gate=False`` fixes V to ``ones`` (count-only).
* Categorical MLP: two categorical variables -> ReLU MLP -> a new categorical variable (argmax).
* Numerical MLP: two numerical variables -> ReLU MLP -> a new categorical variable (argmax).
* Classifier: a linear map over the concatenated stream (numerical variables as raw values).

With ``hard=True`` every gate, predicate, attention and MLP output is an argmax (the discretized model);
with ``hard=False`` they are Gumbel-softmax samples at temperature ``tau`` (training).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn
from ..core import InputError

NEG = -1e30


@dataclass
class ModelConfig:
    """Shape of a Transformer Program; ``d_var`` (k) must cover the vocabulary and ``n_ctx`` positions."""

    n_tokens: int
    n_labels: int
    n_ctx: int
    d_var: int
    n_layers: int = 1
    n_heads_cat: int = 2
    n_heads_num: int = 2
    n_cat_mlps: int = 1
    n_num_mlps: int = 1
    d_mlp: int = 64
    causal: bool = False
    masked_labels: list[int] = field(default_factory=lambda: [0])
    num_value_gate: bool = True

    def __post_init__(self) -> None:
        if self.n_tokens > self.d_var:
            raise InputError(
                f"vocabulary of {self.n_tokens} tokens does not fit d_var={self.d_var}; raise d_var to at least "
                f"{self.n_tokens}"
            )
        if self.n_ctx > self.d_var:
            raise InputError(f"n_ctx={self.n_ctx} positions do not fit d_var={self.d_var}; raise d_var to {self.n_ctx}")
        for name in ("n_layers", "n_heads_cat", "n_heads_num", "n_cat_mlps", "n_num_mlps"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InputError(f"unknown ModelConfig keys {sorted(unknown)}; expected a subset of {sorted(names)}")
        return cls(**d)

    # ---- variable bookkeeping (shared with discretize/decompile) ----
    def cat_var_names(self, upto_layer: int | None = None) -> list[str]:
        """Categorical variable names in stream order (all of them, or those present at a layer's input)."""
        names = ["tokens", "positions"]
        for l in range(self.n_layers if upto_layer is None else upto_layer):
            names += [f"attn_{l}_{h}_outputs" for h in range(self.n_heads_cat)]
            names += [f"mlp_{l}_{m}_outputs" for m in range(self.n_cat_mlps)]
            names += [f"num_mlp_{l}_{m}_outputs" for m in range(self.n_num_mlps)]
        return names

    def num_var_names(self, upto_layer: int | None = None) -> list[str]:
        """Numerical variable names in stream order."""
        names = ["ones"]
        for l in range(self.n_layers if upto_layer is None else upto_layer):
            names += [f"num_attn_{l}_{h}_outputs" for h in range(self.n_heads_num)]
        return names


def closeness(n: int) -> torch.Tensor:
    """Rank of key j for query i (lower = preferred): ``2|i-j| - [j < i]`` so nearer keys win and the left
    neighbour beats the right one at equal distance; the query itself ranks last (``2n``), as in the paper."""
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    rank = 2 * (i - j).abs() - (j < i).long()
    return torch.where(i == j, torch.full_like(rank, 2 * n), rank)


def position_bias(n: int) -> torch.Tensor:
    """Additive attention bias implementing ``closeness``: in (-1, 0) for other keys, -2 for the query itself."""
    rank = closeness(n).double()
    bias = -rank / (2 * n)
    return torch.where(rank == 2 * n, torch.full_like(bias, -2.0), bias).float()


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim; spelled out below 16 values, where torch's CPU kernel is slower."""
    if x.shape[-1] >= 16:
        return x.softmax(-1)
    e = (x - x.amax(-1, keepdim=True).detach()).exp()
    return e / e.sum(-1, keepdim=True)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last dim, with the same small-size workaround as ``_softmax``."""
    if x.shape[-1] >= 16:
        return x.log_softmax(-1)
    y = x - x.amax(-1, keepdim=True).detach()
    return y - y.exp().sum(-1, keepdim=True).log()


def _sample(logits: torch.Tensor, tau: float, hard: bool) -> torch.Tensor:
    """Gumbel-softmax sample over the last dim during training; a one-hot argmax when ``hard``.

    The noise is ``-log(-log(U))`` from ``torch.rand`` (same law as ``F.gumbel_softmax``, ~4x cheaper on CPU).
    """
    if hard:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    with torch.no_grad():
        gumbel = torch.rand_like(logits).clamp_min_(1e-20).log_().neg_().log_().neg_()
    return _softmax((logits + gumbel) / tau)


class Gate(nn.Module):
    """``n_reads`` Gumbel-softmax choices among ``n_vars`` variables (one row per read)."""

    def __init__(self, n_reads: int, n_vars: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.randn(n_reads, n_vars) / math.sqrt(n_vars))

    def forward(self, tau: float, hard: bool) -> torch.Tensor:
        return _sample(self.logits, tau, hard)

    def choice(self) -> list[int]:
        """The variable index each read picks after discretization."""
        return self.logits.argmax(-1).tolist()


class Predicate(nn.Module):
    """Per head a k x k matrix: row ``a`` (query value) is a Gumbel-softmax over the key value it accepts."""

    def __init__(self, n_heads: int, k: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.randn(n_heads, k, k) / math.sqrt(k))

    def forward(self, tau: float, hard: bool) -> torch.Tensor:
        return _sample(self.logits, tau, hard)

    def choice(self) -> torch.Tensor:
        """``[n_heads, k]``: the key value each query value accepts."""
        return self.logits.argmax(-1)


def _read(stream: torch.Tensor | list[torch.Tensor], gate: torch.Tensor) -> torch.Tensor:
    """Mix variables ``[V, ...]`` by gate rows ``[R, V]`` -> ``[R, ...]`` (contiguous result).

    ``stream`` may be a list of blocks that together hold the ``V`` variables: one matmul per block,
    accumulated, instead of concatenating the whole stream every layer.
    """
    if isinstance(stream, torch.Tensor):
        stream = [stream]
    out, start = None, 0
    for block in stream:
        v = block.shape[0]
        flat = block.reshape(v, -1)
        g = gate[:, start : start + v]
        out = g @ flat if out is None else torch.addmm(out, g, flat)
        start += v
    assert out is not None, "a residual stream has at least one block"
    return out.reshape(gate.shape[0], *stream[0].shape[1:])


def _match(q: torch.Tensor, pred: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Soft predicate ``[H, B, N(query), N(key)]`` = ``sum_{a,c} q[a] pred[a, c] key[c]`` for reads ``[H, B, N, k]``."""
    h, b, n, k = q.shape
    want = torch.bmm(q.reshape(h, b * n, k), pred).reshape(h * b, n, k)
    return torch.bmm(want, key.reshape(h * b, n, k).transpose(1, 2)).reshape(h, b, n, n)


class CatAttention(nn.Module):
    """Categorical heads: hard attention to the closest key whose value matches the query's (BOS if none)."""

    def __init__(self, n_heads: int, n_vars: int, k: int) -> None:
        super().__init__()
        self.n_heads, self.k = n_heads, k
        self.q, self.key, self.v = Gate(n_heads, n_vars), Gate(n_heads, n_vars), Gate(n_heads, n_vars)
        self.pred = Predicate(n_heads, k)

    def gates(self, tau: float, hard: bool) -> list[torch.Tensor]:
        return [self.q(tau, hard), self.key(tau, hard), self.v(tau, hard)]

    def forward(self, q, kk, v, mask, bias, tau: float, hard: bool) -> torch.Tensor:
        """``q, kk, v``: reads ``[H, B, N, k]``; ``bias`` holds the closeness bias and NEG where masked;
        returns the new variables ``[H, B, N, k]``."""
        h, b, n, k = q.shape
        scores = _match(q, self.pred(tau, hard), kk) * mask  # [H, B, N, N] in [0, 1]
        total = scores.sum(-1, keepdim=True)
        default = F.relu(1.0 - total / (total + 1e-10))  # 1 where nothing matched: attend to BOS
        first = torch.zeros(n, device=q.device)
        first[0] = 1.0
        logits = (torch.log(scores + default * first + 1e-20) + bias) * (1.0 / math.sqrt(self.k))
        attn = _sample(logits, tau, hard)
        return torch.bmm(attn.reshape(h * b, n, n), v.reshape(h * b, n, k)).reshape(h, b, n, k)


class NumAttention(nn.Module):
    """Numerical heads: the sum of a numerical variable over the keys whose value matches the query's
    (with V = ``ones``, the number of matching keys)."""

    def __init__(self, n_heads: int, n_vars: int, k: int, n_num_vars: int = 0) -> None:
        super().__init__()
        self.q, self.key = Gate(n_heads, n_vars), Gate(n_heads, n_vars)
        self.v = Gate(n_heads, n_num_vars) if n_num_vars else None
        self.pred = Predicate(n_heads, k)

    def gates(self, tau: float, hard: bool) -> list[torch.Tensor]:
        return [self.q(tau, hard), self.key(tau, hard)]

    def forward(self, q, kk, x_num, mask, tau: float, hard: bool) -> torch.Tensor:
        """``q, kk``: reads ``[H, B, N, k]``; ``x_num [Vn, B, N]``; returns the sums ``[H, B, N]``."""
        scores = _match(q, self.pred(tau, hard), kk) * mask
        if self.v is None:
            return scores.sum(-1)
        v = _read(x_num, self.v(tau, hard))  # [H, B, N]
        return (scores * v.unsqueeze(-2)).sum(-1)  # elementwise: cheaper than a batch of N x 1 matmuls


class MLPs(nn.Module):
    """``n`` MLPs reading two variables each (gates ``a`` and ``b``) and writing one categorical variable each.

    ``numeric=False``: inputs are categorical variables ``[V, B, N, k]``; ``numeric=True``: numbers ``[V, B, N]``.
    """

    def __init__(self, n: int, n_vars: int, k: int, d_mlp: int, numeric: bool) -> None:
        super().__init__()
        self.n, self.k, self.numeric = n, k, numeric
        d_in = 1 if numeric else k
        self.gate_a, self.gate_b = Gate(n, n_vars), Gate(n, n_vars)
        self.w_a = nn.Parameter(torch.randn(n, d_in, d_mlp) / math.sqrt(d_mlp))
        self.w_b = nn.Parameter(torch.randn(n, d_in, d_mlp) / math.sqrt(d_mlp))
        self.b_in = nn.Parameter(torch.zeros(n, 1, d_mlp))
        self.w_out = nn.Parameter(torch.randn(n, d_mlp, k) / math.sqrt(k))
        self.b_out = nn.Parameter(torch.zeros(n, 1, k))

    def logits(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Inputs ``[n, M, d_in]`` each -> log-probabilities ``[n, M, k]`` (also used to extract lookup tables)."""
        # one matmul over [a, b] (the two reads side by side): ~3% less CPU per step than two plus an add
        h = F.relu(torch.baddbmm(self.b_in, torch.cat([a, b], -1), torch.cat([self.w_a, self.w_b], 1)))
        return _log_softmax(torch.baddbmm(self.b_out, h, self.w_out))

    def forward(self, x: torch.Tensor | list[torch.Tensor], tau: float, hard: bool) -> torch.Tensor:
        """``x``: the stream (or its blocks); returns the new categorical variables ``[n, B, N, k]``."""
        shape = (x if isinstance(x, torch.Tensor) else x[0]).shape[1:3]
        m = shape[0] * shape[1]
        d_in = 1 if self.numeric else self.k
        # both reads in one matmul (one backward pass over the stream instead of two outer products)
        ab = _read(x, torch.cat([self.gate_a(tau, hard), self.gate_b(tau, hard)], 0)).reshape(2 * self.n, m, d_in)
        return _sample(self.logits(ab[: self.n], ab[self.n :]), tau, hard).reshape(self.n, *shape, self.k)


class Layer(nn.Module):
    """One block: categorical + numerical attention on the layer input, then categorical MLPs (reading the
    stream with this layer's head outputs) and numerical MLPs (reading the numbers with this layer's counts)."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        k = cfg.d_var
        n_cat = len(cfg.cat_var_names(layer))
        n_num = len(cfg.num_var_names(layer))
        self.hc, self.hn = cfg.n_heads_cat, cfg.n_heads_num
        self.cat_attn = CatAttention(cfg.n_heads_cat, n_cat, k) if cfg.n_heads_cat else None
        n_values = n_num if cfg.num_value_gate else 0
        self.num_attn = NumAttention(cfg.n_heads_num, n_cat, k, n_values) if cfg.n_heads_num else None
        self.cat_mlp = MLPs(cfg.n_cat_mlps, n_cat + cfg.n_heads_cat, k, cfg.d_mlp, False) if cfg.n_cat_mlps else None
        self.num_mlp = MLPs(cfg.n_num_mlps, n_num + cfg.n_heads_num, k, cfg.d_mlp, True) if cfg.n_num_mlps else None

    def forward(self, x_cat: list[torch.Tensor], x_num, mask, bias, tau, hard):
        """``x_cat``: blocks ``[V_i, B, N, k]`` holding the categorical variables in stream order (the
        stream is concatenated once per layer for the head reads; each layer's new variables form one
        block); ``x_num [Vn, B, N]``. Returns the blocks and numbers with this layer's variables appended."""
        gates = []
        if self.cat_attn is not None:
            gates += self.cat_attn.gates(tau, hard)
        if self.num_attn is not None:
            gates += self.num_attn.gates(tau, hard)
        blocks = list(x_cat)
        stream = None
        if gates:
            hc, hn = self.hc, self.hn
            sizes = [hc] * (3 if hc else 0) + [hn] * (2 if hn else 0)
            stream = torch.cat(x_cat, 0) if len(x_cat) > 1 else x_cat[0]  # one copy beats chained addmm
            reads = torch.split(_read(stream, torch.cat(gates, 0)), sizes, 0)  # every Q/K/V read at once
            if self.cat_attn is not None:
                blocks.append(self.cat_attn(*reads[:3], mask, bias, tau, hard))
                reads = reads[3:]
            if self.num_attn is not None:
                x_num = torch.cat([x_num, self.num_attn(*reads, x_num, mask, tau, hard)], 0)
        new = blocks[len(x_cat) :]
        if self.cat_mlp is not None:
            new.append(self.cat_mlp(([stream] if stream is not None else list(x_cat)) + new, tau, hard))
        if self.num_mlp is not None:
            new.append(self.num_mlp(x_num, tau, hard))
        base = [stream] if stream is not None else list(x_cat)
        if not new:
            return base, x_num
        return [*base, torch.cat(new, 0) if len(new) > 1 else new[0]], x_num  # one block per layer


class TransformerProgram(nn.Module):
    """A Transformer Program: ``forward(ids) -> logits [B, N, n_labels]``; token id 0 is padding."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Layer(cfg, l) for l in range(cfg.n_layers))
        n_cat = len(cfg.cat_var_names())
        n_num = len(cfg.num_var_names())
        # classifier: one [k, n_labels] block per categorical variable, one row per numerical variable
        self.w_cat = nn.Parameter(torch.randn(n_cat, cfg.d_var, cfg.n_labels) / math.sqrt(cfg.n_labels))
        self.w_num = nn.Parameter(torch.randn(n_num, cfg.n_labels) / math.sqrt(cfg.n_labels))
        self.register_buffer("bias", position_bias(cfg.n_ctx), persistent=False)
        label_mask = torch.zeros(cfg.n_labels, dtype=torch.bool)
        label_mask[list(cfg.masked_labels)] = True
        self.register_buffer("label_mask", label_mask, persistent=False)

    def attention_mask(self, ids: torch.Tensor) -> torch.Tensor:
        """``[1, B, N, N]`` float: 1 where both positions are real tokens (and key <= query when causal)."""
        real = (ids != 0).float()
        mask = real.unsqueeze(-1) * real.unsqueeze(-2)
        if self.cfg.causal:
            mask = torch.tril(mask)
        return mask.unsqueeze(0)

    def embed(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Initial streams: one-hot tokens and positions ``[2, B, N, k]``, and ``ones`` ``[1, B, N]``."""
        b, n = ids.shape
        if n > self.cfg.n_ctx:
            raise InputError(f"sequence of length {n} exceeds n_ctx={self.cfg.n_ctx}; truncate or retrain")
        k = self.cfg.d_var
        tok = F.one_hot(ids, k).float()
        pos = F.one_hot(torch.arange(n, device=ids.device), k).float().expand(b, n, k)
        return torch.stack([tok, pos], 0), torch.ones(1, b, n, device=ids.device)

    def forward(self, ids: torch.Tensor, tau: float = 1.0, hard: bool = False) -> torch.Tensor:
        x_cat, x_num = self.embed(ids)
        b, n = ids.shape
        mask = self.attention_mask(ids)
        bias = (self.bias[:n, :n] + NEG * (1.0 - mask)).contiguous()
        blocks = [x_cat]
        for layer in self.layers:
            blocks, x_num = layer(blocks, x_num, mask, bias, tau, hard)
        logits = x_num.reshape(-1, b * n).t() @ self.w_num
        start = 0
        for block in blocks:  # classifier, block by block: sum_v onehot_v @ w_cat[v]
            v, k = block.shape[0], block.shape[-1]
            logits = logits + torch.bmm(block.reshape(v, b * n, k), self.w_cat[start : start + v]).sum(0)
            start += v
        return logits.reshape(b, n, -1).masked_fill(self.label_mask, NEG)

    @torch.no_grad()
    def predict(self, ids: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
        """Argmax labels of the discretized (hard) model, ``[B, N]``."""
        was = self.training
        self.eval()
        out = [self(ids[i : i + batch_size], hard=True).argmax(-1) for i in range(0, len(ids), batch_size)]
        self.train(was)
        return torch.cat(out, 0) if out else torch.zeros_like(ids)
