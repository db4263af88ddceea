"""Attention rows in torch: visible cells, positional terms (each primitive's ``position`` scores, declared beside its
kernel in headsurgeon/synth/dsl/catalog.py), closest/all selection of matching keys (exact when hard, Gumbel-relaxed when soft).
The tests check them against the kernels."""
from __future__ import annotations

import torch

from ... import dsl
from .config import EPS, LearnedConfig
from ....core import InputError


def positional_specs(cfg: LearnedConfig, causal: bool) -> list[str]:
    """DSL text of the fixed relative-position terms of the mixture."""
    specs = ["first()", "self()"] + [f"prev({k})" for k in range(1, cfg.offsets + 1)]
    if not causal:
        specs += [f"next({k})" for k in range(1, cfg.offsets + 1)]
    specs += ["uniform()"] + [f"decay({r!r})" for r in cfg.decays]
    return specs


def visible(lengths: torch.Tensor, n: int, causal: bool) -> torch.Tensor:
    """bool [B, N, N] visible cells."""
    pos = torch.arange(n)
    inside = pos[None, :] < lengths[:, None]
    vis = inside[:, :, None] & inside[:, None, :]
    if causal:
        vis = vis & (pos[None, None, :] <= pos[None, :, None])
    return vis


def positional_rows(specs: list[str], lengths: torch.Tensor, n: int, causal: bool,
                qi: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-normalized components [T, B, R, N] and non-empty flags [T, B, R] (float64) of positional DSL terms.

    Rows are the query positions ``qi`` [B, R] (default: every position, R = N) of sequences of ``lengths``.
    """
    if qi is None:
        qi = torch.arange(n).expand(lengths.shape[0], n)
    i = qi[:, :, None]
    j = torch.arange(n)[None, None, :]
    vis = (j < lengths[:, None, None]) & (i < lengths[:, None, None])
    if causal:
        vis = vis & (j <= i)
    vis = vis.double()
    comps = []
    for text in specs:
        node = dsl.parse(text)
        spec = dsl.PRIMITIVE_SPECS.get(node.name) if isinstance(node, dsl.Prim) else None
        if spec is None or spec.position is None:
            raise InputError(f"{text} is not a positional primitive with position= scores in its declaration "
                             "(headsurgeon/synth/dsl/catalog.py); the learned searcher's terms need one")
        comps.append(spec.position(node, i, j) * vis)
    stack = torch.stack(comps)  # [T, B, R, N]
    total = stack.sum(-1)
    nonempty = (total > 0).double()
    stack = stack / total.clamp_min(1e-300)[..., None]
    return stack, nonempty


def key_order(n: int) -> torch.Tensor:
    """Per query row, keys ordered by closeness: (|i - j|, left before right) -> int64 [N, N] permutation."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    key = (i - j).abs() * 2 + (j > i).long()
    return torch.argsort(key, dim=1, stable=True)


def select_rows(m: torch.Tensor, select: str, order: torch.Tensor, hard: bool) -> torch.Tensor:
    """Match probabilities m [B, R, N] (zero off the visible grid) -> attention rows with BOS fallback.

    ``order`` [R, N] or [B, R, N]: each row's keys by closeness (:func:`key_order`). closest: key j gets
    ``m_ij * prod_{j' closer than j} (1 - m_ij')``; all: ``m_ij / sum_j m_ij``; the no-match mass
    ``prod_j (1 - m_ij)`` goes to position 0. Exact (no clamping) when ``hard``.
    """
    idx = order.expand(m.shape)
    if hard:
        mb = m > 0.5
        any_match = mb.any(-1)
        if select == "closest":
            mp = torch.gather(mb, 2, idx)
            first = mp & (torch.cumsum(mp.long(), dim=2) == 1)
            rows = torch.zeros_like(m).scatter(2, idx, first.to(m.dtype))
        else:
            rows = mb.to(m.dtype) / mb.sum(-1, keepdim=True).clamp_min(1).to(m.dtype)
        rows[..., 0] += (~any_match).to(m.dtype)
        return rows
    logs = torch.log1p(-m.clamp(max=1.0 - 1e-6))
    empty = torch.exp(logs.sum(-1))  # [B, N]
    if select == "closest":
        lp = torch.gather(logs, 2, idx)
        before = torch.cumsum(lp, dim=2) - lp  # exclusive prefix sum in closeness order
        rows = torch.zeros_like(m).scatter(2, idx, torch.gather(m, 2, idx) * torch.exp(before))
    else:
        rows = (1.0 - empty)[..., None] * m / m.sum(-1, keepdim=True).clamp_min(EPS)
    bos = torch.zeros_like(m)
    bos[..., 0] = empty
    return rows + bos


def gumbel_softmax(logits: torch.Tensor, tau: float, gen: torch.Generator, hard: bool) -> torch.Tensor:
    """A Gumbel-softmax sample over the last axis (the argmax one-hot when ``hard``)."""
    if hard:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    u = torch.rand(logits.shape, generator=gen, dtype=logits.dtype).clamp(1e-10, 1 - 1e-10)
    return torch.softmax((logits - torch.log(-torch.log(u))) / tau, dim=-1)


def relaxed_bernoulli(logits: torch.Tensor, tau: float, gen: torch.Generator, hard: bool) -> torch.Tensor:
    """A relaxed Bernoulli sample per entry (``logits > 0`` when ``hard``)."""
    if hard:
        return (logits > 0).to(logits.dtype)
    u = torch.rand(logits.shape, generator=gen, dtype=logits.dtype).clamp(1e-10, 1 - 1e-10)
    return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / tau)
