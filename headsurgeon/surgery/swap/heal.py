"""heal: train a chosen few neural parameters of a hybrid (or of the plain model, the control) to recover a swap's cost.

A swap leaves the rest of the network tuned to the heads it replaced; retraining the gains of the normalization layers
(``params="norms"``, a few thousand numbers) lets it re-scale around the programs while the program heads stay fixed:
they have no parameters, the hybrid's forward keeps applying them, and their Q/K rows stay put even when selected
(headsurgeon/surgery/swap/frozen_qk.py). The same call on a plain ModelHandle is the control a healed hybrid is compared with.

The healing is recorded with the weights it changed: ``handle.healing``, a list of :class:`HealReport` JSON records
(one per call), which a hybrid shows as ``hybrid.healing`` (HybridModel reaches its handle's attributes,
headsurgeon/surgery/swap/hybrid.py) and ``save_hybrid`` writes into the manifest and card (headsurgeon/hub/checkpoint/save.py, headsurgeon/hub/card.py).
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from ...core import HEAL_OBJECTIVES, HealObjective, InputError
from ...synth.sequence import Sequence
from ..batches import batches
from ..models.handle import ModelHandle
from .handle_copy import independent_handle
from .hybrid import HybridModel
from .weights import NORMS, Weight, element_count, select_weights

__all__ = ["heal", "HealReport", "healing_records", "NORMS"]

Objective = HealObjective
OBJECTIVES: tuple[Objective, ...] = HEAL_OBJECTIVES
#: Adam moves each parameter by about ``lr`` per step whatever its gradient's scale; at 5e-3 the norm gains of a
#: quarter of SmolLM2's heads swapped made the held-out KL rise from the first step, at 5e-4 it fell for 40 steps
#: (benchmarks/RESULTS.md, benchmarks/heal_sweep.py)
DEFAULT_LR = 5e-4


@dataclass
class HealReport:
    """What one ``heal`` call trained, how, on what, and how the loss moved; ``to_json`` is the checkpoint's record."""

    params: list[str]  # the trained parameters' names (the checkpoint's weight names where there are such)
    n_tensors: int
    n_elements: int  # trainable numbers, each underlying element counted once (views of one tensor share them)
    selection: list[str]  # what was asked for: ["norms"] or glob patterns
    objective: str
    teacher: str | None  # "kl": whose logits were distilled ("base (frozen copy)" or "given"); None for "lm"
    model: str  # "hybrid" (program heads applied while training) or "base" (the plain model: the control)
    heads: list[str]  # the program heads applied while training, "L3H5"; empty for the base
    steps: int
    lr: float
    optimizer: str
    batch_size: int
    seed: int
    windows: int
    tokens: int  # predicted tokens in the windows (one pass over them)
    tokens_seen: int  # predicted tokens over all steps (windows are cycled)
    loss_first: float
    loss_last: float
    losses: list[float]  # per optimizer step, on that step's batch (nats per predicted token)
    seconds: float  # the whole call, the teacher's copy included
    validation_windows: int = 0  # windows the objective was checked on (0: none given, the last step is kept)
    validation: list[list[float]] = dataclasses.field(default_factory=list)  # [step, loss] per check, step 0 first
    best_step: int | None = None  # the step whose parameters were kept (the lowest validation loss)

    def to_json(self) -> dict[str, Any]:
        """A plain dict (JSON types only): the record ``handle.healing`` keeps and manifests carry."""
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line: what was trained and how the loss moved."""
        kept = ""
        if self.validation:
            losses = dict((int(step), loss) for step, loss in self.validation)
            kept = (f"; kept step {self.best_step} (validation loss {losses[0]:.4f} → "
                    f"{losses[self.best_step or 0]:.4f} on {self.validation_windows} windows)")
        return (f"healed {self.n_tensors} tensors ({self.n_elements} numbers) of the {self.model} for {self.steps} "
                f"steps ({self.objective}, lr {self.lr:g}) on {self.windows} windows / {self.tokens} tokens: "
                f"loss {self.loss_first:.4f} → {self.loss_last:.4f}{kept} in {self.seconds:.1f}s")


def healing_records(model: Any) -> list[dict[str, Any]]:
    """The healing records of a ModelHandle or HybridModel (``.healing``), oldest first; [] when never healed."""
    found = getattr(model, "healing", None)
    return list(found) if isinstance(found, (list, tuple)) else []


# ------------------------------------------------------------------ inputs


def _target(model_or_hybrid: Any) -> tuple[ModelHandle, HybridModel | None]:
    """The handle whose weights train, and the hybrid whose programs apply (None for a plain model)."""
    if isinstance(model_or_hybrid, HybridModel):
        if not model_or_hybrid.active:
            raise InputError("this hybrid was restored; heal a live hybrid (replace_heads again) or its base handle")
        return model_or_hybrid.handle, model_or_hybrid
    if isinstance(model_or_hybrid, ModelHandle):
        return model_or_hybrid, None
    raise InputError(f"heal needs a ModelHandle (hs.load_model) or a HybridModel (hs.replace_heads), got "
                     f"{type(model_or_hybrid).__name__}; load it with hs.load_model first")


def _check_numbers(steps: Any, lr: Any, batch_size: Any, seed: Any, objective: Any) -> None:
    """Each setting in range, with the fix in the message."""
    whole = lambda x: isinstance(x, int) and not isinstance(x, bool)  # noqa: E731 - a one-line predicate beside the checks that use it
    if not (whole(steps) and steps >= 1):
        raise InputError(f"steps must be a whole number >= 1 (optimizer steps), got {steps!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise InputError(f"lr must be a finite number > 0 (default {DEFAULT_LR:g} for norm gains), got {lr!r}")
    if not (whole(batch_size) and batch_size >= 1):
        raise InputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    if not whole(seed):
        raise InputError(f"seed must be a whole number, got {seed!r}")
    if objective not in OBJECTIVES:
        raise InputError(f"objective must be 'lm' (next-token cross-entropy) or 'kl' (distil from base=), got "
                         f"{objective!r}")


def _check_windows(windows: Any, handle: ModelHandle) -> list[Sequence]:
    """Training windows: a non-empty list of Sequences that predict at least one token and fit the context."""
    if not isinstance(windows, (list, tuple)) or not windows:
        got = "an empty list" if isinstance(windows, (list, tuple)) else f"a {type(windows).__name__}"
        raise InputError(f"windows must be a non-empty list of Sequences (training windows only, e.g. "
                         f"hs.load_corpus(...)['synth']), got {got}")
    bad = [w for w in windows if not isinstance(w, Sequence)]
    if bad:
        raise InputError(f"windows must be Sequences (from hs.load_corpus or make_sequences), found a "
                         f"{type(bad[0]).__name__}")
    if all(w.n < 2 for w in windows):
        raise InputError("no window predicts a token (each has fewer than 2 tokens); use longer windows")
    longest = max(w.n for w in windows)
    if longest > handle.n_ctx:
        raise InputError(f"a window has {longest} tokens but {handle.name} reads at most {handle.n_ctx}; "
                         f"make windows of at most {handle.n_ctx} tokens")
    if not handle.causal:
        raise InputError(f"{handle.name} is bidirectional; heal trains next-token prediction, which needs a causal "
                         "language model")
    return list(windows)


def _frozen_copy(handle: ModelHandle) -> ModelHandle:
    """A deep copy of the handle's model as a teacher: its own weights, no gradients, eval mode."""
    copied = independent_handle(handle)
    for p in copied.model.parameters():
        p.requires_grad_(False)
    copied.model.eval()
    return copied


def _teacher(objective: str, base: Any, handle: ModelHandle, hybrid: HybridModel | None,
             chosen: list[Weight]) -> tuple[Any, str | None]:
    """The model whose logits "kl" distils, and how it is described; (None, None) for "lm"."""
    if objective == "lm":
        if base is not None:
            raise InputError("base= is the teacher of objective='kl'; with objective='lm' leave it out")
        return None, None
    if base is None:
        if hybrid is None:
            raise InputError("objective='kl' on a plain model needs base= (a ModelHandle whose logits are the "
                             "teacher); on a hybrid the default teacher is a frozen copy of its base")
        return _frozen_copy(handle), "base (frozen copy)"
    if not isinstance(base, (ModelHandle, HybridModel)):
        raise InputError(f"base must be a ModelHandle or HybridModel (the teacher), got {type(base).__name__}")
    if base.vocab_size != handle.vocab_size:
        raise InputError(f"the teacher's vocabulary ({base.vocab_size}) is not {handle.name}'s ({handle.vocab_size}); "
                         "distil from a model with the same tokenizer")
    trained = {w.param.untyped_storage().data_ptr() for w in chosen}
    if any(p.untyped_storage().data_ptr() in trained for p in base.model.parameters()):
        raise InputError("base shares weights with the model being healed, so the teacher would move with it; "
                         "leave base out on a hybrid (a frozen copy is taken) or pass a separately loaded model")
    return base, "given"


# ------------------------------------------------------------------ training


def _batch_stream(windows: list[Sequence], batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Padded batches cycling over the windows: epoch ``e`` is a shuffle seeded ``seed + e`` (deterministic)."""
    epoch = 0
    while True:
        yield from batches(windows, batch_size, shuffle=True, seed=seed + epoch)
        epoch += 1


def _loss(objective: str, logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
          teacher_logits: torch.Tensor | None) -> torch.Tensor:
    """Mean per predicted token: next-token cross-entropy ("lm") or KL(teacher ‖ student) ("kl"); padding masked."""
    valid = mask[:, 1:].to(logits.device).bool()
    student = logits[:, :-1].float()
    if objective == "lm":
        targets = ids[:, 1:].to(logits.device).masked_fill(~valid, -100)
        return F.cross_entropy(student.flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert teacher_logits is not None, "the kl objective distils from a teacher (_teacher makes one)"
    t = torch.log_softmax(teacher_logits[:, :-1].float().to(logits.device)[valid], dim=-1)
    return F.kl_div(torch.log_softmax(student[valid], dim=-1), t, log_target=True, reduction="batchmean")


class _Frozen:
    """Only the chosen parameters require grad (and the model runs in eval mode, no dropout) while inside; every
    parameter's requires_grad and every module's train/eval flag are put back on exit."""

    def __init__(self, model: torch.nn.Module, chosen: list[Weight]) -> None:
        self.model, self.chosen = model, {id(w.param) for w in chosen}

    def __enter__(self) -> None:
        params = {id(p): p for m in self.model.modules() for p in m.parameters(recurse=False)}
        self.grads = [(p, p.requires_grad) for p in params.values()]
        self.modes = [(m, m.training) for m in self.model.modules()]
        for p, _ in self.grads:
            p.requires_grad_(id(p) in self.chosen)
        self.model.eval()

    def __exit__(self, *exc: Any) -> None:
        for p, flag in self.grads:
            p.requires_grad_(flag)
        for m, flag in self.modes:
            m.training = flag


class _Validation:
    """Early stopping: the objective on held-apart windows every ``every`` steps (and before the first), the chosen
    parameters of the lowest loss copied aside and put back at the end, so a heal that starts fitting its training
    windows instead of the model's behaviour keeps its best point."""

    def __init__(self, windows: list[Sequence], every: int, objective: str, teacher: Any, call: Any,
                 chosen: list[Weight], batch_size: int) -> None:
        self.windows, self.every, self.objective, self.teacher, self.call = windows, every, objective, teacher, call
        self.chosen, self.batch_size = chosen, batch_size
        self.losses: list[list[float]] = []
        self.best: tuple[float, int, list[torch.Tensor]] | None = None

    def loss(self) -> float:
        """The objective per predicted token over every validation window (no gradient)."""
        total, count = 0.0, 0
        device = self.call.device
        with torch.no_grad():
            for ids, mask in batches(self.windows, self.batch_size):
                ids, mask = ids.to(device), mask.to(device)
                teacher_logits = None
                if self.teacher is not None:
                    teacher_logits = self.teacher(ids.to(self.teacher.device), mask.to(self.teacher.device))
                n = int(mask[:, 1:].sum())
                total += float(_loss(self.objective, self.call(ids, mask), ids, mask, teacher_logits)) * n
                count += n
        return total / max(count, 1)

    def check(self, step: int, last: bool = False) -> None:
        if step % self.every and not last:
            return
        loss = self.loss()
        self.losses.append([step, loss])
        if self.best is None or loss < self.best[0]:
            self.best = (loss, step, [w.param.detach().clone() for w in self.chosen])

    def restore(self) -> int | None:
        """Put the best step's parameters back; that step."""
        if self.best is None:
            return None
        with torch.no_grad():
            for w, kept in zip(self.chosen, self.best[2]):
                w.param.copy_(kept)
        return self.best[1]


def _train(call: Any, teacher: Any, objective: str, chosen: list[Weight], windows: list[Sequence], steps: int,
           lr: float, batch_size: int, seed: int, progress: bool,
           validation: _Validation | None = None) -> tuple[list[float], int]:
    """``steps`` Adam steps on the chosen parameters (checked on ``validation`` as they go); the per-step losses and
    the predicted tokens seen."""
    optimizer = torch.optim.Adam([w.param for w in chosen], lr=lr)
    device = call.device  # a ModelHandle's, or the hybrid's handle's (headsurgeon/surgery/swap/hybrid.py)
    stream = _batch_stream(windows, batch_size, seed)
    losses, seen = [], 0
    bar = tqdm(total=steps, desc=f"heal ({objective})", disable=not progress)
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if validation is not None:
            validation.check(0)
        for step in range(1, steps + 1):
            ids, mask = (t.to(device) for t in next(stream))
            teacher_logits = None
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(ids.to(teacher.device), mask.to(teacher.device))
            loss = _loss(objective, call(ids, mask), ids, mask, teacher_logits)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
            seen += int(mask[:, 1:].sum())
            bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
            bar.update(1)
            if validation is not None:
                validation.check(step, last=step == steps)
    bar.close()
    return losses, seen


def heal(model_or_hybrid: ModelHandle | HybridModel, windows: list[Sequence], params: str | list[str] = NORMS,
         steps: int = 40, lr: float = DEFAULT_LR, objective: Objective = "lm", batch_size: int = 8, seed: int = 0,
         base: ModelHandle | HybridModel | None = None, progress: bool = True,
         validation: list[Sequence] | None = None, check_every: int = 5) -> HealReport:
    """Train, in place, only ``params`` of a hybrid (programs applied) or plain model on training windows.

    ``params``: ``"norms"`` (every normalization layer's gain and bias vectors) or glob patterns over parameter names
    (``["model.layers.*.mlp.*"]``; the checkpoint's names, the bridge's and TransformerLens' all match).
    ``objective``: ``"lm"`` next-token cross-entropy, or ``"kl"`` KL(teacher ‖ model) per predicted token, the
    teacher being ``base`` (default on a hybrid: a frozen copy of its base taken now). Adam, ``steps`` steps over
    padded batches of ``batch_size`` windows, cycled in an order fixed by ``seed``. Every other parameter is frozen
    meanwhile and its requires_grad put back after. ``validation``: windows held apart from training (e.g. the select
    split) on which the objective is checked before the first step and every ``check_every`` steps; the parameters
    of the lowest check are kept (step 0: the untrained ones). The report is appended to the handle's ``healing``
    records.
    """
    started = time.perf_counter()
    handle, hybrid = _target(model_or_hybrid)
    _check_numbers(steps, lr, batch_size, seed, objective)
    windows = _check_windows(windows, handle)
    if validation is not None:
        validation = _check_windows(validation, handle)
        if not (isinstance(check_every, int) and not isinstance(check_every, bool) and check_every >= 1):
            raise InputError(f"check_every must be a whole number >= 1 (steps between validation checks), got "
                             f"{check_every!r}")
    chosen = select_weights(handle, params)
    teacher, teacher_note = _teacher(objective, base, handle, hybrid, chosen)
    for model in (hybrid, teacher):
        if isinstance(model, HybridModel):
            model.register_sequences(windows + (validation or []))  # programs read the exact windows, not ids
    call = hybrid if hybrid is not None else handle
    checks = (_Validation(validation, check_every, objective, teacher, call, chosen, batch_size)
              if validation is not None else None)
    with _Frozen(handle.model, chosen):
        losses, seen = _train(call, teacher, objective, chosen, windows, steps, float(lr), batch_size, seed,
                              progress, checks)
    best_step = checks.restore() if checks is not None else None
    report = HealReport(
        params=[w.name for w in chosen], n_tensors=len(chosen), n_elements=element_count([w.param for w in chosen]),
        selection=[params] if isinstance(params, str) else list(params), objective=objective, teacher=teacher_note,
        model="hybrid" if hybrid is not None else "base",
        heads=list(hybrid.program_heads.keys()) if hybrid is not None else [], steps=steps, lr=float(lr),
        optimizer="Adam", batch_size=batch_size, seed=seed, windows=len(windows),
        tokens=sum(max(w.n - 1, 0) for w in windows), tokens_seen=seen, loss_first=losses[0], loss_last=losses[-1],
        losses=losses, seconds=time.perf_counter() - started,
        validation_windows=len(validation or []), validation=checks.losses if checks is not None else [],
        best_step=best_step)
    handle.healing = healing_records(handle) + [report.to_json()]  # with the weights it changed (module docstring)
    return report
