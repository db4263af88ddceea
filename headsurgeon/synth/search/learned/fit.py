"""Fitting one head: Gumbel-annealed training of the soft model, discretization (argmax gates, thresholded
predicates, block search, pruning), and a refit of the mixture weights for soft IoU."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from .config import LearnedConfig
from .head import LearnedHead, MatchTerm
from .model import (QueryRows, SoftHead, TrainData, gated, gather_rows, mix_rows, query_flags, query_rows, row_loss,
                    sample_rows)
from .rows import select_rows
from .space import FeatureSpace


def hard_table(model: SoftHead, t: int, space: FeatureSpace, q: int | None = None, k: int | None = None) -> MatchTerm:
    """Term ``t`` discretized: argmax gates (or the given features) and the thresholded predicate block."""
    q = int(model.gate_q[t].argmax()) if q is None else q
    k = int(model.gate_k[t].argmax()) if k is None else k
    offs, sizes = space.offsets, space.sizes
    block = model.pred[t, offs[q]: offs[q] + sizes[q], offs[k]: offs[k] + sizes[k]].detach() > 0
    table = block.numpy().copy()
    table[-1, :] = False
    table[:, -1] = False
    return MatchTerm(q, k, table, model.selects[t])


def hard_match(term: MatchTerm, data: TrainData, space: FeatureSpace, rows: QueryRows) -> tuple[torch.Tensor, torch.Tensor]:
    """bool match cells [B, R, N] of a discretized term and the local (query, key) values' flat pair index."""
    offs = space.offsets
    qv = torch.gather(data.slots[term.q][rows.idx], 1, rows.qi) - offs[term.q]
    kv = data.slots[term.k][rows.idx] - offs[term.k]
    m = torch.from_numpy(term.table)[qv[:, :, None], kv[:, None, :]] & rows.vis
    return m, qv[:, :, None] * term.table.shape[1] + kv[:, None, :]


def prune(term: MatchTerm, data: TrainData, space: FeatureSpace, real: torch.Tensor, max_pairs: int,
           chunk: int = 32) -> MatchTerm:
    """Drop pairs that select no key on synth; keep at most ``max_pairs`` by captured real attention mass.

    For ``closest``, a pair that only ever selects position 0 is dropped too: the no-match fallback goes
    there already, and any other match is closer.
    """
    if term.n_pairs == 0:
        return term
    size = term.table.size
    mass = torch.zeros(size, dtype=torch.float64)
    used = torch.zeros(size, dtype=torch.long)
    B, n = data.lengths.shape[0], data.n
    for b0 in range(0, B, chunk):
        idx = torch.arange(b0, min(B, b0 + chunk))
        rows = query_rows(data, idx, torch.arange(n).expand(idx.shape[0], n))
        m, flat = hard_match(term, data, space, rows)
        chosen = (select_rows(m.float(), term.select, rows.order, hard=True) > 0) & m
        if term.select == "closest":  # choosing position 0 is what the fallback does anyway
            chosen[:, :, 0] = False
        sel = flat[chosen]
        mass.index_add_(0, sel, real[idx][chosen].double())
        used.index_add_(0, sel, torch.ones_like(sel))
    keep = (used > 0).reshape(term.table.shape).numpy() & term.table
    if keep.sum() > max_pairs:
        score = mass.numpy().copy()
        score[~keep.reshape(-1)] = -np.inf
        top = np.lexsort((np.arange(size), -score))[:max_pairs]
        keep = np.zeros(size, dtype=bool)
        keep[top] = True
        keep = keep.reshape(term.table.shape)
    return replace(term, table=keep)


def block_search(model: SoftHead, space: FeatureSpace, data: TrainData, rows: QueryRows, target: torch.Tensor,
                  terms: list[MatchTerm], hard: list[torch.Tensor], cfg: LearnedConfig) -> None:
    """Per term, try every (query feature, key feature) block of the trained predicate in place of the gates'
    argmax and keep the one whose discretized mixture has the lowest ``refit_loss`` (in place).

    The gates settle early, while the temperature is high; a block the gates left behind (e.g. key=punct
    instead of key=token listing the frequent punctuation ids) may discretize better.
    """
    F_ = len(space.names)
    if model.qgate is None:
        def predict(comps: list[torch.Tensor]) -> torch.Tensor:
            return mix_rows(model.mix, comps, rows)
    else:
        flag = query_flags(data, rows)[int(model.qgate.argmax())]

        def predict(comps: list[torch.Tensor]) -> torch.Tensor:
            return gated(model.mix, model.mix_other, flag, comps, rows)
    for t in range(len(terms)):
        best = float(row_loss(predict(hard), target, rows, cfg.refit_loss))
        for q in range(F_):
            for k in range(F_):
                if (q, k) == (terms[t].q, terms[t].k):
                    continue
                cand = hard_table(model, t, space, q, k)
                if cand.n_pairs == 0:
                    continue
                cand_rows = select_rows(hard_match(cand, data, space, rows)[0].float(), cand.select, rows.order,
                                         hard=True)
                trial = hard[:t] + [cand_rows] + hard[t + 1:]
                loss = float(row_loss(predict(trial), target, rows, cfg.refit_loss))
                if loss < best - 1e-6:
                    best, terms[t], hard[t] = loss, cand, cand_rows


def round_weight(w: float) -> float:
    """``w`` to 4 significant digits."""
    return float(f"{w:.4g}")


def fit_head(real: np.ndarray, data: TrainData, space: FeatureSpace, cfg: LearnedConfig,
             seed: int = 0) -> list[LearnedHead]:
    """Fit, discretize and decompile one head from its synth patterns ``real`` [B, N, N] (float16/32).

    Returns the single-mixture model, then (with ``cfg.query_gate``) the query-gated one; both share the
    discretized match terms.
    """
    gen = torch.Generator().manual_seed(int(seed))
    n = data.n
    real_t = torch.from_numpy(np.ascontiguousarray(real[:, :n, :n]))
    specs = data.specs
    model = SoftHead(space, cfg, len(specs), gen)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history = []
    for step in range(cfg.steps):
        frac = step / max(cfg.steps - 1, 1)
        tau = cfg.tau_start * (cfg.tau_end / cfg.tau_start) ** frac
        rows = sample_rows(data, cfg.batch_size, cfg.rows, gen)
        pred, pairs = model(data, rows, tau, gen)
        loss = row_loss(pred, gather_rows(real_t, rows).float(), rows, cfg.loss) + cfg.sparsity * frac * pairs
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(float(loss.detach()))

    with torch.no_grad():  # discretize: argmax gates, threshold predicates, prune pairs
        rows = sample_rows(data, 0, cfg.refit_rows, gen, all_seqs=True)
        target = gather_rows(real_t, rows).float()
        terms = [hard_table(model, t, space) for t in range(len(cfg.terms))]
        hard = [select_rows(hard_match(t, data, space, rows)[0].float(), t.select, rows.order, hard=True)
                for t in terms]
        if cfg.block_search:  # on a quarter of the refit rows: 2 x F^2 discretized mixtures to compare
            few = replace(rows, qi=rows.qi[:, ::4], valid=rows.valid[:, ::4], vis=rows.vis[:, ::4],
                          order=rows.order[:, ::4], pos=rows.pos if rows.shared else rows.pos[:, :, ::4],
                          pos_ne=rows.pos_ne if rows.shared else rows.pos_ne[:, :, ::4])
            block_search(model, space, data, few, target[:, ::4], terms, [h[:, ::4] for h in hard], cfg)
        terms = [prune(t, data, space, real_t, cfg.max_pairs) for t in terms]
        hard = [select_rows(hard_match(t, data, space, rows)[0].float(), t.select, rows.order, hard=True)
                for t in terms]
    heads = []
    # refit the mixture weights on the discretized components: one mixture, then (optionally) two gated ones
    refits: list[tuple[str | None, list[torch.Tensor]]] = [(None, [model.mix.detach().clone()])]
    if model.qgate is not None:
        assert model.mix_other is not None, "LearnedModel makes qgate and mix_other together"
        flag_idx = int(model.qgate.argmax())
        refits.append((data.gate_flags[flag_idx], [model.mix.detach().clone(), model.mix_other.detach().clone()]))
        flag_rows = query_flags(data, rows)[flag_idx]
    for gate, init in refits:
        params = [torch.nn.Parameter(x) for x in init]
        opt2 = torch.optim.Adam(params, lr=cfg.lr)

        def predict(ws: list[torch.Tensor], comps: list[torch.Tensor], r: QueryRows,
                    gate: str | None = gate) -> torch.Tensor:
            return mix_rows(ws[0], comps, r) if gate is None else gated(ws[0], ws[1], flag_rows, comps, r)

        for _ in range(cfg.refit_steps):
            loss = row_loss(predict(params, hard, rows), target, rows, cfg.refit_loss)
            opt2.zero_grad()
            loss.backward()
            opt2.step()
        mixtures, logits, keeps = [], [], []
        for p in params:
            m, pos, w, keep_pos = finalize(torch.softmax(p.detach(), 0).double().numpy(), terms, specs, cfg)
            mixtures.append((m, pos))
            logits.append(w)
            keeps.append(keep_pos)
        head = LearnedHead(space, data.causal, *mixtures[0], history=history)
        if gate is not None:
            head.gate = gate
            head.other_matches, head.other_positional = mixtures[1]
        with torch.no_grad():  # the loss of exactly the rounded, pruned discretized model
            if gate is None:
                pred = mix_rows(logits[0], hard, rows.select_pos(keeps[0]))
            else:
                pred = (flag_rows[..., None] * mix_rows(logits[0], hard, rows.select_pos(keeps[0]))
                        + (1 - flag_rows[..., None]) * mix_rows(logits[1], hard, rows.select_pos(keeps[1])))
            head.loss = float(row_loss(pred, target, rows, cfg.refit_loss))
        heads.append(head)
    return heads


def finalize(weights: np.ndarray, terms: list[MatchTerm], specs: list[str], cfg: LearnedConfig
              ) -> tuple[list[tuple[float, MatchTerm]], list[tuple[float, str]], torch.Tensor, list[int]]:
    """Fold empty match terms into first(), drop light terms, round; -> (matches, positional, logits, kept specs).

    The logits cover every match term (-inf where dropped) and the kept positional terms, so that
    ``mix_rows(logits, match_rows, rows.select_pos(kept))`` is exactly the rounded mixture.
    """
    T = len(terms)
    weights = weights.copy()
    first_at = specs.index("first()")
    for t, term in enumerate(terms):  # a match term with no pair left is first(): fold its weight there
        if term.n_pairs == 0:
            weights[T + first_at] += weights[t]
            weights[t] = 0.0
    weights = np.where(weights >= cfg.min_weight * weights.max(), weights, 0.0)
    weights = weights / weights.sum()
    rounded = np.array([round_weight(w) for w in weights])
    matches = [(float(rounded[t]), terms[t]) for t in range(T) if rounded[t] > 0]
    keep_pos = [p for p in range(len(specs)) if rounded[T + p] > 0]
    positional = [(float(rounded[T + p]), specs[p]) for p in keep_pos]
    logits = torch.log(torch.tensor(np.concatenate([rounded[:T], rounded[T:][keep_pos]]), dtype=torch.float32))
    return matches, positional, logits, keep_pos
