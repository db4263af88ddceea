"""The soft (Gumbel) model trained per head: training tensors, sampled query rows, the relaxed mixture of match
and positional terms, and its losses."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from .config import EPS, LearnedConfig
from .rows import gumbel_softmax, key_order, positional_rows, relaxed_bernoulli, select_rows
from .space import FeatureSpace


@dataclass
class TrainData:
    """Padded training tensors of the synth split, shared by all heads."""

    slots: torch.Tensor  # int64 [F, B, N] global slot of every feature at every position
    onehot: torch.Tensor  # float32 [B, N, D] multi-hot (one slot per feature)
    lengths: torch.Tensor  # int64 [B]
    n: int
    causal: bool
    specs: list[str]  # positional DSL terms
    order: torch.Tensor  # int64 [N, N] keys by closeness per query row
    pos: torch.Tensor | None  # causal: float32 [T, N, N] row-normalized positional components
    pos_ne: torch.Tensor | None  # causal: float32 [T, N] non-empty flags
    gate_flags: tuple[str, ...] = ()  # flags the queries may be gated on
    flags: torch.Tensor | None = None  # float32 [G, B, N]: 1 where the position has the flag


def make_data(space: FeatureSpace, arrays: dict[str, np.ndarray], lengths: np.ndarray, specs: list[str],
               causal: bool, gate_flags: tuple[str, ...] = ()) -> TrainData:
    """The synth split's training tensors (slots, multi-hot, positional components, gate flags)."""
    slots = torch.from_numpy(space.encode(arrays))
    F_, B, n = slots.shape
    onehot = torch.zeros(B, n, space.dim, dtype=torch.float32)
    for f in range(F_):
        onehot.scatter_(2, slots[f][..., None], 1.0)
    pos = pos_ne = None
    if causal:  # under a causal mask, row i of a positional term does not depend on the sequence length
        p, ne = positional_rows(specs, torch.tensor([n]), n, True)
        pos, pos_ne = p[:, 0].float(), ne[:, 0].float()
    flags = torch.stack([torch.from_numpy(arrays[f] == 1).float() for f in gate_flags]) if gate_flags else None
    return TrainData(slots, onehot, torch.from_numpy(np.asarray(lengths, dtype=np.int64)), n, causal, specs,
                 key_order(n), pos, pos_ne, tuple(gate_flags), flags)


@dataclass
class QueryRows:
    """A batch of query rows: sequence ``idx`` [B] and query positions ``qi`` [B, R]."""

    idx: torch.Tensor
    qi: torch.Tensor
    valid: torch.Tensor  # bool [B, R] (qi inside the length)
    vis: torch.Tensor  # bool [B, R, N]
    order: torch.Tensor  # int64 [B, R, N]
    pos: torch.Tensor  # float32 [T, N, N] (causal: shared by all sequences) or [T, B, R, N]
    pos_ne: torch.Tensor  # float32 [T, N] or [T, B, R]

    @property
    def shared(self) -> bool:
        """True when the positional components are shared by all sequences (causal)."""
        return self.pos.dim() == 3

    def select_pos(self, keep: list[int]) -> "QueryRows":
        """The same rows with only the positional terms ``keep``."""
        return replace(self, pos=self.pos[keep], pos_ne=self.pos_ne[keep])


def query_rows(data: TrainData, idx: torch.Tensor, qi: torch.Tensor) -> QueryRows:
    """Rows ``qi`` [B, R] of sequences ``idx`` [B], with their visibility, key order and positional terms."""
    lens = data.lengths[idx]
    n = data.n
    j = torch.arange(n)
    valid = qi < lens[:, None]
    vis = (j[None, None, :] < lens[:, None, None]) & valid[..., None]
    if data.causal:
        vis = vis & (j[None, None, :] <= qi[..., None])
        pos, pos_ne = data.pos, data.pos_ne
    else:
        pos, pos_ne = (x.float() for x in positional_rows(data.specs, lens, n, False, qi))
    return QueryRows(idx, qi, valid, vis, data.order[qi], pos, pos_ne)


def gather_rows(x: torch.Tensor, rows: QueryRows) -> torch.Tensor:
    """Rows ``rows.qi`` of ``x[rows.idx]`` ([B_all, N, ...] -> [B, R, ...])."""
    sub = x[rows.idx]
    shape = rows.qi.shape + sub.shape[2:]
    index = rows.qi.reshape(rows.qi.shape + (1,) * (sub.dim() - 2)).expand(shape)
    return torch.gather(sub, 1, index)


def sample_rows(data: TrainData, n_seq: int, n_rows: int, gen: torch.Generator, all_seqs: bool = False) -> QueryRows:
    """Random sequences (or all of them) and random query rows inside each one's length."""
    B = data.lengths.shape[0]
    idx = torch.arange(B) if all_seqs else torch.randperm(B, generator=gen)[:n_seq]
    lens = data.lengths[idx].double()
    qi = (torch.rand(idx.shape[0], n_rows, generator=gen, dtype=torch.float64) * lens[:, None]).long()
    return query_rows(data, idx, qi.clamp(max=data.n - 1))


class SoftHead(torch.nn.Module):
    """Soft (Gumbel) / hard mixture of match terms and positional terms for one head."""

    def __init__(self, space: FeatureSpace, cfg: LearnedConfig, n_pos: int, gen: torch.Generator) -> None:
        super().__init__()
        T, D = len(cfg.terms), space.dim
        self.selects = cfg.terms
        self.pred = torch.nn.Parameter(torch.randn(T, D, D, generator=gen) * cfg.init_scale)
        prior = -cfg.gate_prior * torch.log(torch.tensor(space.sizes, dtype=torch.float32))
        self.gate_q = torch.nn.Parameter(prior.repeat(T, 1))
        self.gate_k = torch.nn.Parameter(prior.repeat(T, 1))
        self.mix = torch.nn.Parameter(torch.zeros(T + n_pos))
        G = len(cfg.query_gate)
        self.qgate = torch.nn.Parameter(torch.zeros(G)) if G else None  # which flag gates the queries
        self.mix_other = torch.nn.Parameter(torch.zeros(T + n_pos)) if G else None  # unflagged queries' mixture
        self.register_buffer("slot_feature", torch.from_numpy(space.slot_feature()))
        self.register_buffer("keep", torch.from_numpy(~space.other_mask()).float())

    def forward(self, data: TrainData, rows: QueryRows, tau: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Soft predicted attention [B, R, N] of the sampled rows, and the expected number of active pairs."""
        keep2 = self.keep[:, None] * self.keep[None, :]
        q_oh = gather_rows(data.onehot, rows)
        k_oh = data.onehot[rows.idx]
        visf = rows.vis.float()
        out = []
        pairs = torch.zeros(())
        for t, select in enumerate(self.selects):
            s = relaxed_bernoulli(self.pred[t], tau, gen, False) * keep2
            gq = gumbel_softmax(self.gate_q[t], tau, gen, False)[self.slot_feature]
            gk = gumbel_softmax(self.gate_k[t], tau, gen, False)[self.slot_feature]
            m = torch.matmul(torch.matmul(q_oh * gq, s), (k_oh * gk).transpose(1, 2)) * visf
            out.append(select_rows(m.clamp(0.0, 1.0), select, rows.order, hard=False))
            pairs = pairs + (gq.detach()[:, None] * s * gk.detach()[None, :]).sum()  # entries only, not gates
        if self.qgate is None:
            return mix_rows(self.mix, out, rows), pairs
        g = gumbel_softmax(self.qgate, tau, gen, False)
        flag = torch.einsum("g,gbr->br", g, query_flags(data, rows))
        return gated(self.mix, self.mix_other, flag, out, rows), pairs


def query_flags(data: TrainData, rows: QueryRows) -> torch.Tensor:
    """The gate flags of the sampled queries: float32 [G, B, R]."""
    assert data.flags is not None, "a model gates its queries only on data with gate flags (train_data's gate_flags)"
    sub = data.flags[:, rows.idx]
    return torch.gather(sub, 2, rows.qi[None].expand(sub.shape[0], -1, -1))


def gated(mix_a: torch.Tensor, mix_b: torch.Tensor, flag: torch.Tensor, match_rows: list[torch.Tensor],
           rows: QueryRows) -> torch.Tensor:
    """Rows whose query has the flag (``flag`` [B, R] in [0, 1]) take mixture A, the others mixture B."""
    return flag[..., None] * mix_rows(mix_a, match_rows, rows) + (1.0 - flag[..., None]) * mix_rows(mix_b, match_rows, rows)


def mix_rows(mix_logits: torch.Tensor, match_rows: list[torch.Tensor], rows: QueryRows) -> torch.Tensor:
    """Mixture of match rows (never empty) and positional components with softmax weights."""
    w = torch.softmax(mix_logits, 0)
    T = len(match_rows)
    if rows.shared:  # mix the [T, N, N] components once, then take the sampled rows
        num = torch.einsum("t,tij->ij", w[T:], rows.pos)[rows.qi]
        den = torch.einsum("t,ti->i", w[T:], rows.pos_ne)[rows.qi]
    else:
        num = torch.einsum("t,tbij->bij", w[T:], rows.pos)
        den = torch.einsum("t,tbi->bi", w[T:], rows.pos_ne)
    for t, r in enumerate(match_rows):
        num = num + w[t] * r
        den = den + w[t]
    return num / den.clamp_min(EPS)[..., None] * rows.vis


def row_loss(pred: torch.Tensor, real: torch.Tensor, rows: QueryRows, kind: str) -> torch.Tensor:
    """Mean over valid rows (kl, jsd) or over sequences (iou, on the sampled rows) of the discrepancy."""
    valid = rows.valid.float()
    if kind == "iou":
        inter = torch.minimum(pred, real).sum((1, 2))
        union = torch.maximum(pred, real).sum((1, 2)).clamp_min(EPS)
        return 1.0 - (inter / union).mean()
    q = pred.clamp_min(1e-6) * rows.vis
    q = q / q.sum(-1, keepdim=True).clamp_min(EPS)
    lp = torch.log(real.clamp_min(1e-30))
    if kind == "kl":
        per_row = (real * (lp - torch.log(q.clamp_min(1e-30)))).sum(-1)
    else:
        m = 0.5 * (real + q)
        lm = torch.log(m.clamp_min(1e-30))
        kl_p = (real * (lp - lm)).sum(-1)
        kl_q = (q * (torch.log(q.clamp_min(1e-30)) - lm)).sum(-1)
        per_row = torch.sqrt((0.5 * (kl_p + kl_q)).clamp_min(1e-8))
    return (per_row * valid).sum() / valid.sum().clamp_min(1.0)
