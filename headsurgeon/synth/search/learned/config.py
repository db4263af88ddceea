"""Hyper-parameters of the learned searcher and the features it may read."""
from __future__ import annotations

from dataclasses import dataclass

from ....core import InputError

#: cheap features (no spaCy) every search considers by default.
DEFAULT_FEATURES: tuple[str, ...] = ("token", "word_start", "punct", "cap", "newline", "sent_end")
#: further features a caller may add (``pos`` and ``dep_head`` need spaCy; index features list many values).
OPTIONAL_FEATURES: tuple[str, ...] = ("pos", "sent", "word", "position", "dep_head")
ARRAY_FEATURES = ("word", "word_start", "sent", "sent_end", "punct", "cap", "newline", "pos", "dep_head")
SELECTS = ("closest", "all")
EPS = 1e-9


@dataclass(frozen=True)
class LearnedConfig:
    """Hyper-parameters of the learned searcher (the defaults are the measured ones; see the module doc)."""

    steps: int = 150  # Adam steps per head with Gumbel annealing
    batch_size: int = 16  # sequences per step
    rows: int = 32  # query rows sampled per sequence and step
    refit_rows: int = 16  # query rows per synth sequence for the mixture refit
    lr: float = 0.05  # Adam learning rate (the paper's)
    tau_start: float = 3.0  # Gumbel temperature, geometric from tau_start to tau_end
    tau_end: float = 0.01
    terms: tuple[str, ...] = ("closest", "all")  # one match term per entry, with its select mode
    features: tuple[str, ...] = DEFAULT_FEATURES  # candidate features for both the query and the key side
    top_tokens: int = 32  # token buckets: the most frequent ids on synth (+ an "other" bucket)
    max_values: int = 32  # other features: the most frequent values (+ "other")
    max_pairs: int = 48  # readability cap on the pairs of one match term
    offsets: int = 8  # prev(1) .. prev(offsets) as positional terms (next(k) too when not causal)
    decays: tuple[float, ...] = (0.5, 0.8, 0.95)  # decay(rate) positional terms
    loss: str = "kl"  # "kl" (real vs predicted rows), "jsd" or "iou" (1 - soft IoU on the sampled rows)
    refit_steps: int = 60  # Adam steps refitting the mixture weights on the discretized components
    refit_loss: str = "iou"  # the refit's loss (IoU selects, so the weights are tuned for it)
    min_weight: float = 0.01  # mixture terms lighter than this (after refit) are dropped
    init_scale: float = 0.1  # std of the initial predicate logits
    sparsity: float = 3e-3  # penalty per expected active pair of the gated block, ramped up linearly from 0
    block_search: bool = True  # after training, try every feature pair's predicate block (see block_search)
    query_gate: tuple[str, ...] = ("word_start", "punct", "cap", "newline", "sent_end")  # flags a second,
    # gated mixture may split the queries on: gate(FLAG, mixture A, mixture B); () disables it
    gate_prior: float = 0.0  # initial gate logit -gate_prior * log(values): a head start for small features
    max_synth: int = 256  # at most this many synth sequences are used for fitting (evenly spaced)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise InputError(f"steps and batch_size must be >= 1; got {self.steps}, {self.batch_size}")
        if not 0 < self.tau_end <= self.tau_start:
            raise InputError(f"need 0 < tau_end <= tau_start; got {self.tau_start} -> {self.tau_end}")
        bad = [t for t in self.terms if t not in SELECTS]
        if bad:
            raise InputError(f"terms must be select modes from {SELECTS}; got {bad}")
        from ... import dsl  # the DSL loads numba; the CLI reads this config to build its flags

        unknown = [f for f in self.features if f not in dsl.MATCH_FEATURES]
        if unknown or not self.features:
            raise InputError(f"features must be a non-empty subset of {dsl.MATCH_FEATURES}; unknown: {unknown}")
        if any(f not in dsl.FLAGS for f in self.query_gate):
            raise InputError(f"query_gate flags must come from {dsl.FLAGS}; got {self.query_gate}")
        for name in ("loss", "refit_loss"):
            if getattr(self, name) not in ("kl", "jsd", "iou"):
                raise InputError(f"{name} must be 'kl', 'jsd' or 'iou'; got {getattr(self, name)!r}")
        if any(not 0.0 < r < 1.0 for r in self.decays):
            raise InputError(f"decay rates must lie in (0, 1); got {self.decays}")
