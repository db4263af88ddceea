"""What a swap does to the model's predictions, per window: KL(base ‖ other) of the next-token distributions and both
negative log-likelihoods, summed over the predicted tokens; and their paired bootstrap intervals over windows.

Every cost the library reports comes from these sums (headsurgeon/surgery/measure/eval_report.py, headsurgeon/surgery/measure/head_costs.py, headsurgeon/build/):
KL is the mean per predicted token (token-weighted, like perplexity), ΔNLL the mean per-token change in
cross-entropy, ΔPPL = exp(ΔNLL) − 1. Windows are resampled whole, both runs together (paired), and each resample's
means are weighted by its predicted tokens.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from ...core import InputError
from ...synth.sequence import Sequence
from ..batches import padded_batch
from ..models.handle import ModelHandle

__all__ = ["WindowCosts", "CostSummary", "summarize", "means", "token_costs", "BaseDistributions", "window_costs",
           "base_costs"]


@dataclass
class WindowCosts:
    """Per window: summed KL(base ‖ other), summed base and other NLL, and the predicted tokens they cover."""

    kl: np.ndarray
    nll_base: np.ndarray
    nll_other: np.ndarray
    tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not (len(self.kl) == len(self.nll_base) == len(self.nll_other) == n):
            raise InputError("WindowCosts: kl, nll_base, nll_other and tokens must hold one value per window")

    @classmethod
    def zeros(cls, n: int) -> "WindowCosts":
        return cls(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64))

    def summary(self, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> "CostSummary":
        return summarize(self, n_boot=n_boot, seed=seed, level=level)


def _wide(point: float, low: float, high: float) -> bool:
    """Whether an interval is wider than the effect it bounds: it reaches zero, or reaches further than |point| from
    the point on either side (an effect of +4.7% ± 100% says nothing)."""
    if high <= low:
        return False  # no spread at all (e.g. the base against itself)
    return bool(low <= 0.0 <= high or max(point - low, high - point) > abs(point))


#: a single window leaves the bootstrap nothing to resample: its interval has no width yet says nothing, so it is wide
MIN_WINDOWS = 2


@dataclass(frozen=True)
class CostSummary:
    """Mean per-token KL(base ‖ other), ΔNLL and ΔPPL, each with a paired bootstrap interval over windows."""

    kl: float
    kl_ci95: tuple[float, float]
    delta_nll: float
    delta_nll_ci95: tuple[float, float]
    delta_ppl: float
    delta_ppl_ci95: tuple[float, float]
    tokens: int
    windows: int

    @property
    def kl_wide(self) -> bool:
        """KL is never negative, so its interval is too wide when it reaches further than the estimate from it."""
        return self.windows < MIN_WINDOWS or _wide(self.kl, *self.kl_ci95)

    @property
    def delta_wide(self) -> bool:
        return self.windows < MIN_WINDOWS or _wide(self.delta_ppl, *self.delta_ppl_ci95)

    def to_json(self) -> dict[str, Any]:
        return {"kl": self.kl, "kl_ci95": list(self.kl_ci95), "delta_nll": self.delta_nll,
                "delta_nll_ci95": list(self.delta_nll_ci95), "delta_ppl_pct": 100 * self.delta_ppl,
                "delta_ppl_ci95_pct": [100 * self.delta_ppl_ci95[0], 100 * self.delta_ppl_ci95[1]],
                "tokens": self.tokens, "windows": self.windows, "kl_wide": self.kl_wide,
                "delta_wide": self.delta_wide}

    def describe(self) -> str:
        """One line: ΔPPL and KL with their intervals, and the tokens they were counted over."""
        lo, hi = self.delta_ppl_ci95
        klo, khi = self.kl_ci95
        warn = []
        if self.delta_wide:
            warn.append("ΔPPL interval wider than the effect")
        if self.kl_wide:
            warn.append("KL interval wider than the effect")
        tail = f" [{'; '.join(warn)}]" if warn else ""
        return (f"ΔPPL {100 * self.delta_ppl:+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}], KL {self.kl:.4f} "
                f"[{klo:.4f}, {khi:.4f}] nats/token over {self.tokens} predicted tokens in {self.windows} windows"
                f"{tail}")


def _arrays(costs: WindowCosts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(kl, base NLL, other NLL, tokens) as float64, refusing a measurement without a predicted token."""
    tokens = np.asarray(costs.tokens, dtype=np.float64)
    if tokens.sum() <= 0:
        raise InputError("no predicted tokens to measure: every window has a single token; use longer windows")
    kl, nb, no = (np.asarray(a, dtype=np.float64) for a in (costs.kl, costs.nll_base, costs.nll_other))
    return kl, nb, no, tokens


def _means(kl: np.ndarray, nb: np.ndarray, no: np.ndarray, tokens: np.ndarray) -> tuple[float, float]:
    total = tokens.sum()
    return float(kl.sum() / total), float((no.sum() - nb.sum()) / total)


def means(costs: WindowCosts) -> tuple[float, float]:
    """(mean per-token KL, mean per-token ΔNLL), token-weighted: the point estimates :func:`summarize` bootstraps."""
    return _means(*_arrays(costs))


def summarize(costs: WindowCosts, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> CostSummary:
    """Point estimates and paired percentile bootstrap intervals; windows resampled whole, means token-weighted."""
    kl, nb, no, tokens = _arrays(costs)
    total = tokens.sum()
    point_kl, point_dnll = _means(kl, nb, no, tokens)
    rng = np.random.default_rng(seed)
    n = len(tokens)
    idx = rng.integers(0, n, size=(n_boot, n))
    t = np.maximum(tokens[idx].sum(1), 1.0)
    boot_kl = kl[idx].sum(1) / t
    boot_dnll = (no[idx].sum(1) - nb[idx].sum(1)) / t
    q = [(1 - level) / 2, (1 + level) / 2]
    klo, khi = (float(x) for x in np.quantile(boot_kl, q))
    dlo, dhi = (float(x) for x in np.quantile(boot_dnll, q))
    return CostSummary(point_kl, (klo, khi), point_dnll, (dlo, dhi), math.expm1(point_dnll),
                       (math.expm1(dlo), math.expm1(dhi)), int(total), n)


def _nll(logp: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row: the summed negative log-likelihood of ``targets`` under ``logp`` over the ``valid`` positions."""
    nll = -logp.gather(-1, targets[..., None])[..., 0]
    return torch.where(valid, nll, torch.zeros_like(nll)).sum(1).double()


def token_costs(base_logp: torch.Tensor, other_logits: torch.Tensor, targets: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of a batch: summed KL(base ‖ other), base NLL, other NLL and predicted-token count.

    ``base_logp``: log-softmax of the base at the predicting positions [B, T, V]; ``other_logits`` the other model's
    logits there; ``targets`` the tokens predicted [B, T]; ``valid`` [B, T] marks predicted tokens.
    """
    rows, vocab = base_logp.shape[0] * base_logp.shape[1], base_logp.shape[-1]
    base_rows, other_rows = base_logp.reshape(rows, vocab), other_logits.reshape(rows, vocab)
    flat_targets = targets.reshape(rows, 1)
    kl, other_nll = torch.empty(rows), torch.empty(rows)
    for start in range(0, rows, _KL_ROWS):  # temporaries of a few MB, not four of the batch's [B, T, V] size
        part = slice(start, start + _KL_ROWS)
        other_logp = torch.log_softmax(other_rows[part].float(), dim=-1)
        base_part = base_rows[part]
        kl[part] = (base_part.exp() * (base_part - other_logp)).sum(-1)
        other_nll[part] = -other_logp.gather(-1, flat_targets[part])[:, 0]
    kl = torch.where(valid, kl.view_as(valid).clamp_min(0.0), 0.0).sum(1).double()
    other_nll = torch.where(valid, other_nll.view_as(valid), 0.0).sum(1).double()
    return kl, _nll(base_logp, targets, valid), other_nll, valid.sum(1)


#: rows of a vocabulary-wide distribution handled at once by :func:`token_costs` (32 x 49,152 floats: 6 MB)
_KL_ROWS = 32


class BaseDistributions:
    """The base model's next-token log-probabilities on fixed batches of windows, computed once and kept while they
    fit ``max_bytes`` (recomputed per use beyond it), so each measured swap costs one forward, not two.

    A masked LM (no causal mask) predicts each token with it masked, as pseudo-perplexity does
    (headsurgeon/surgery/measure/evaluate.py ``_pseudo_losses``): a batch is up to ``batch_size`` masked copies of one window, and
    ``batches[k]`` names the window of each row.
    """

    def __init__(self, handle: ModelHandle, sequences: list[Sequence], batch_size: int = 16,
                 max_bytes: int = 1 << 30) -> None:
        if not sequences:
            raise InputError("measuring a swap needs at least one window")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise InputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        self.handle, self.sequences, self.max_bytes = handle, sequences, max_bytes
        self._masked: list[np.ndarray] | None = None  # per batch of a masked LM: the masked position of each row
        if handle.causal:
            order = sorted(range(len(sequences)), key=lambda i: (sequences[i].n, i))
            self.batches: list[list[int]] = [order[s: s + batch_size] for s in range(0, len(order), batch_size)]
        else:
            self.mask_id = _mask_id(handle)
            spans = [(i, np.arange(1 if s.has_bos else 0, s.n)) for i, s in enumerate(sequences)]
            chunks = [(i, cols[c: c + batch_size]) for i, cols in spans for c in range(0, len(cols), batch_size)]
            self.batches, self._masked = [[i] * len(cols) for i, cols in chunks], [cols for _, cols in chunks]
        self._kept: dict[int, torch.Tensor] = {}
        self._bytes = 0

    def inputs(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``k``'s ids and attention mask (a masked LM's rows each with one position masked)."""
        if self._masked is None:
            return padded_batch([self.sequences[i] for i in self.batches[k]])
        cols = torch.from_numpy(self._masked[k])
        ids = torch.from_numpy(self.sequences[self.batches[k][0]].ids).long().repeat(len(cols), 1)
        ids[torch.arange(len(cols)), cols] = self.mask_id
        return ids, torch.ones_like(ids)

    def targets(self, k: int, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the tokens batch ``k`` predicts [B, T], which of them count [B, T] bool)."""
        if self._masked is None:
            return ids[:, 1:], mask[:, 1:].bool()
        cols = self._masked[k]
        tokens = torch.from_numpy(self.sequences[self.batches[k][0]].ids[cols]).long()[:, None]
        return tokens, torch.ones_like(tokens, dtype=torch.bool)

    def predicting(self, k: int, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` of batch ``k`` at the positions that predict its targets, float32 [B, T, V] on the CPU."""
        if self._masked is None:
            return logits[:, :-1].float().cpu()
        cols = torch.from_numpy(self._masked[k]).to(logits.device)
        return logits[torch.arange(len(cols), device=logits.device), cols][:, None].float().cpu()

    @torch.no_grad()
    def logp(self, k: int, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Base log-probabilities of batch ``k`` at the predicting positions, float32 [B, T, V] on the CPU."""
        if k in self._kept:
            return self._kept[k]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits = self.handle.forward(ids, mask)
        out = torch.log_softmax(self.predicting(k, logits), dim=-1)
        size = out.numel() * out.element_size()
        if self._bytes + size <= self.max_bytes:
            self._kept[k] = out
            self._bytes += size
        return out


def _mask_id(handle: ModelHandle) -> int:
    """The mask token of a bidirectional model with a masked-LM head (otherwise nothing predicts a token)."""
    mask_id = getattr(handle.tokenizer, "mask_token_id", None)
    if mask_id is None or not handle.is_masked_lm:
        raise InputError(f"{handle.name} is bidirectional without a masked-LM head and mask token: it predicts no "
                         "token, so there is no KL or perplexity to measure")
    return int(mask_id)


def _add(out: WindowCosts, rows: list[int], kl: torch.Tensor, nll_base: torch.Tensor, nll_other: torch.Tensor,
         tokens: torch.Tensor) -> None:
    """Add a batch's per-row sums to their windows (a masked LM's rows share one window)."""
    for total, part in ((out.kl, kl), (out.nll_base, nll_base), (out.nll_other, nll_other), (out.tokens, tokens)):
        np.add.at(total, rows, part.numpy())


def window_costs(base: BaseDistributions, call: Callable[..., torch.Tensor],
                 register: Callable[[list[Sequence]], None] | None = None) -> WindowCosts:
    """Per-window KL(base ‖ call) and NLLs over ``base``'s windows; ``call(ids, attention_mask=)`` gives logits.
    ``register`` (default: the call's own ``register_sequences``, as a HybridModel has) is told the windows'
    Sequences first, so programs read their text rather than decoded ids."""
    register = register or getattr(call, "register_sequences", None)
    if register is not None:
        register(base.sequences)
    out = WindowCosts.zeros(len(base.sequences))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k, rows in enumerate(base.batches):
            ids, mask = base.inputs(k)
            base_logp = base.logp(k, ids, mask)
            logits = base.predicting(k, call(ids, attention_mask=mask))
            _add(out, rows, *token_costs(base_logp, logits, *base.targets(k, ids, mask)))
    return out


def base_costs(base: BaseDistributions) -> WindowCosts:
    """The base against itself (KL 0, its own NLL on both sides): its perplexity, from the pass every swap reuses."""
    out = WindowCosts.zeros(len(base.sequences))
    for k, rows in enumerate(base.batches):
        ids, mask = base.inputs(k)
        targets, valid = base.targets(k, ids, mask)
        nll = _nll(base.logp(k, ids, mask), targets, valid)
        _add(out, rows, torch.zeros_like(nll), nll, nll, valid.sum(1))
    return out
