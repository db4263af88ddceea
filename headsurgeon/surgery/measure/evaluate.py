"""What a swap costs: perplexity (token-weighted; pseudo-perplexity for masked LMs), per-head ΔPPL,
replacement sweeps with random baselines, and Spearman(IoU, ΔPPL) with a bootstrap interval. KL(base ‖ hybrid)
beside ΔPPL, with paired bootstrap intervals over windows, is headsurgeon/surgery/measure/divergence.py (what eval reports).

Headless encoders (no LM head, headsurgeon/surgery/models/headless.py) are measured by ``embedding_distance`` instead
(headsurgeon/surgery/measure/embedding.py): the cosine distance between base and hybrid mean-pooled final hidden states."""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Sequence as Seq

import numpy as np
import torch
from tqdm.auto import tqdm

from ...synth.programset import ProgramMap, ProgramSet
from ...synth.trust import TrustPrograms
from ...synth.sequence import Sequence
from ..batches import padded_batch
from .embedding import EMBEDDING_METRIC, EvaluationError, check_batch_size, embedding_distance, sentence_embeddings
from ..models.loading import ModelHandle, load_model
from ..swap.hybrid import HybridModel
from ..swap.replace import replace_heads
from .sweep import sweep_arms, sweep_heads, sweep_programs, trusted_programs
from ...core import Head


__all__ = ["EvaluationError", "check_batch_size", "perplexity", "window_losses", "per_head_delta_ppl",
           "replacement_sweep", "sweep_heads", "sweep_arms", "spearman_ci",
           "embedding_distance", "sentence_embeddings", "EMBEDDING_METRIC"]


def _handle_and_call(model: Any) -> tuple[ModelHandle, Any]:
    if isinstance(model, HybridModel):
        return model.handle, model
    handle = load_model(model)
    return handle, lambda ids, attention_mask=None: handle.forward(ids, attention_mask)


def _register(model: Any, sequences: list[Sequence]) -> None:
    if isinstance(model, HybridModel):
        model.register_sequences(sequences)


@torch.no_grad()
def perplexity(model: Any, sequences: list[Sequence], batch_size: int = 16, progress: bool = True) -> float:
    """exp(mean next-token cross-entropy) over all predicted tokens (token-weighted, batched).

    Encoders with a masked-LM head get pseudo-perplexity: each token masked in turn and predicted.
    """
    nll, count = window_losses(model, sequences, batch_size, progress)
    if count.sum() == 0:
        raise EvaluationError("no predicted tokens: every sequence has a single token; use longer windows")
    return math.exp(float(nll.sum()) / float(count.sum()))


@torch.no_grad()
def window_losses(model: Any, sequences: list[Sequence], batch_size: int = 16,
                  progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per window: the summed next-token (or masked-token) negative log-likelihood and the tokens it covers."""
    check_batch_size(batch_size)
    handle, call = _handle_and_call(model)
    if not handle.has_lm_head:
        raise EvaluationError(f"{handle.name} has no language-model head, so perplexity is undefined for it; measure "
                              f"replacements with {EMBEDDING_METRIC}(model, hybrid, sequences), the cosine distance "
                              "between base and hybrid mean-pooled final hidden states")
    if not sequences:
        raise EvaluationError("perplexity needs at least one sequence; give a corpus with more documents or raise "
                              "max_sequences")
    _register(model, sequences)
    if not handle.causal:
        return _pseudo_losses(handle, call, sequences, batch_size, progress)
    total, count = np.zeros(len(sequences)), np.zeros(len(sequences), dtype=np.int64)
    order = sorted(range(len(sequences)), key=lambda i: sequences[i].n)
    bar = tqdm(total=len(sequences), desc="perplexity", unit="seq", disable=not progress, leave=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for start in range(0, len(order), batch_size):
            rows = order[start: start + batch_size]
            ids, mask = padded_batch([sequences[i] for i in rows])
            logits = call(ids, attention_mask=mask).float().cpu()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            target = ids[:, 1:]
            nll = -logp.gather(-1, target[..., None])[..., 0]
            valid = mask[:, 1:].bool()
            total[rows] = torch.where(valid, nll, torch.zeros_like(nll)).sum(1).double().numpy()
            count[rows] = valid.sum(1).numpy()
            bar.update(len(rows))
    bar.close()
    return total, count


def _pseudo_losses(handle: ModelHandle, call: Any, sequences: list[Sequence], batch_size: int,
                   progress: bool) -> tuple[np.ndarray, np.ndarray]:
    mask_id = getattr(handle.tokenizer, "mask_token_id", None)
    if mask_id is None or not handle.is_masked_lm:
        raise EvaluationError(f"{handle.name} is bidirectional without a masked-LM head and mask token: "
                              "perplexity is undefined for it")
    total, count = np.zeros(len(sequences)), np.zeros(len(sequences), dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, s in enumerate(tqdm(sequences, desc="pseudo-perplexity", unit="seq", disable=not progress,
                                   leave=False)):
            positions = list(range(1 if s.has_bos else 0, s.n))
            for start in range(0, len(positions), batch_size):
                chunk = positions[start: start + batch_size]
                ids = torch.from_numpy(s.ids).repeat(len(chunk), 1)
                rows = torch.arange(len(chunk))
                cols = torch.tensor(chunk)
                ids[rows, cols] = mask_id
                logits = call(ids, attention_mask=torch.ones_like(ids)).float().cpu()
                logp = torch.log_softmax(logits[rows, cols], dim=-1)
                total[k] -= float(logp[rows, torch.from_numpy(s.ids[chunk])].sum())
                count[k] += len(chunk)
    return total, count


def per_head_delta_ppl(model: Any, programs: ProgramSet | ProgramMap, sequences: list[Sequence],
                       base_ppl: float | None = None, progress: bool = True, trust_programs: TrustPrograms = False,
                       **kw: Any) -> dict[tuple[int, int], float]:
    """Relative perplexity change (ppl_hybrid / ppl_base − 1) with one head replaced at a time."""
    programs = trusted_programs(programs, trust_programs)
    handle = load_model(model)
    base = base_ppl if base_ppl is not None else perplexity(handle, sequences, progress=False, **kw)
    out: dict[tuple[int, int], float] = {}
    for key, program in tqdm(list(programs.items()), desc="per-head ΔPPL", disable=not progress):
        head = Head.parse(key)
        with replace_heads(handle, {head: program}) as hybrid:
            out[head] = perplexity(hybrid, sequences, progress=False, **kw) / base - 1.0
    return out


def replacement_sweep(model: Any, programs: ProgramSet | ProgramMap, sequences: list[Sequence],
                      order: Seq[Any] | None = None, steps: Seq[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
                      seed: int = 0, out_png: str | Path | None = None, progress: bool = True,
                      title: str = "", trust_programs: TrustPrograms = False) -> list[dict[str, Any]]:
    """Deprecated: headsurgeon/surgery/measure/sweep.py ``sweep_programs`` (the same arguments, the same rows)."""
    warnings.warn("replacement_sweep is deprecated: use `from headsurgeon.surgery.measure.sweep import sweep_programs` (the "
                  "same arguments and rows)", DeprecationWarning, stacklevel=2)
    return sweep_programs(model, programs, sequences, order=order, steps=steps, seed=seed, out_png=out_png,
                          progress=progress, title=title, trust_programs=trust_programs)


def spearman_ci(x: Seq[float], y: Seq[float], n_boot: int = 2000, seed: int = 0,
                level: float = 0.95) -> tuple[float, float, float]:
    """Spearman's rho of x and y with a percentile bootstrap confidence interval (rho, low, high)."""
    from scipy.stats import spearmanr

    xs, ys = np.asarray(x, float), np.asarray(y, float)
    if xs.shape != ys.shape or xs.size < 3:
        raise EvaluationError("spearman_ci needs two equally long series of at least 3 values")
    rho = float(spearmanr(xs, ys).statistic)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = rng.integers(0, xs.size, xs.size)
        if np.unique(xs[idx]).size < 2 or np.unique(ys[idx]).size < 2:
            continue
        boots.append(spearmanr(xs[idx], ys[idx]).statistic)
    lo, hi = np.nanpercentile(boots, [100 * (1 - level) / 2, 100 * (1 + level) / 2]) if boots else (np.nan, np.nan)
    return rho, float(lo), float(hi)
