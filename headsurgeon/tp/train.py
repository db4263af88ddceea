"""Training a Transformer Program: Adam, Gumbel temperature annealed geometrically per step, then argmax.

Defaults are the paper's (Adam lr 5e-2, batch 512, 250 epochs, tau 3.0 -> 0.01 geometric, d_mlp 64) and
its Table 1 shapes per task (``TASK_CONFIGS``: layers, categorical/numerical heads and MLPs, each shape
read off the authors' published program for the task; its ``source`` field names the files). Every task
uses the same model: numerical heads sum a gated numerical variable, as the published programs do.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from .model import ModelConfig, TransformerProgram
from .resume import STATE_FILE, load_state, save_state
from .shapes import PAPER_ACCURACY, TASK_CONFIGS
from .tasks import TASKS, TaskSplit, TaskData, make_task
from ..core import HeadsurgeonError, InputError

TASK_EPOCHS = {"induction": 500}


@dataclass
class TrainConfig:
    """Everything that defines one run besides the model shape."""

    task: str = "hist"
    seed: int = 0
    data_seed: int | None = None
    dataset_size: int = 20_000
    epochs: int = 250
    batch_size: int = 512
    lr: float = 5e-2
    tau_init: float = 3.0
    tau_end: float = 0.01
    eval_every: int = 10

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InputError(f"unknown TrainConfig keys {sorted(unknown)}; expected a subset of {sorted(names)}")
        return cls(**d)


def default_configs(task: str, **overrides) -> tuple[dict, TrainConfig]:
    """Paper defaults for a task: (model shape from Table 1, training config), fields overridden by name.

    The shape dict holds ``n_layers``/``n_heads_cat``/...; ``model_config_for`` completes it once the
    data (vocabulary, length) is known. ``None`` overrides are ignored.
    """
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    train_names = {f.name for f in fields(TrainConfig)}
    model_names = {f.name for f in fields(ModelConfig)}
    unknown = set(overrides) - train_names - model_names
    if unknown:
        raise InputError(f"unknown config fields {sorted(unknown)}")
    tc = TrainConfig(task=task, epochs=TASK_EPOCHS.get(task, 250))
    for k, v in overrides.items():
        if k in train_names and v is not None:
            setattr(tc, k, v)
    shape = {k: v for k, v in TASK_CONFIGS[task].items() if k in model_names}
    shape.update({k: v for k, v in overrides.items() if k in model_names and v is not None})
    return shape, tc


def model_config_for(data: TaskData, **shape) -> ModelConfig:
    """Model config fitted to a dataset: ``d_var = max(vocabulary, max length)`` and PAD masked as a label."""
    d_var = max(len(data.vocab), data.max_len)
    return ModelConfig(
        n_tokens=len(data.vocab),
        n_labels=len(data.labels),
        n_ctx=data.max_len,
        d_var=shape.pop("d_var", d_var),
        causal=data.causal,
        masked_labels=[0],
        **shape,
    )


def set_seed(seed: int) -> None:
    """Seed torch and numpy (Gumbel noise, initialization, shuffling)."""
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per scored token, averaged per sequence, then over the batch (the paper's ``per_token``)."""
    logp = logits.log_softmax(-1)
    nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    scored = (y != 0).float()
    per_seq = (nll * scored).sum(-1) / scored.sum(-1).clamp_min(1.0)
    return per_seq.mean()


def accuracy(pred: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor) -> float:
    """Token accuracy over scored positions (label != PAD), as a fraction."""
    pred, y = np.asarray(pred), np.asarray(y)
    m = y != 0
    return float((pred[m] == y[m]).mean()) if m.any() else float("nan")


def tau_schedule(step: int, total: int, tau_init: float, tau_end: float) -> float:
    """Geometric interpolation from ``tau_init`` (step 0) to ``tau_end`` (last step)."""
    if total <= 1:
        return tau_end
    return float(tau_init * (tau_end / tau_init) ** (step / (total - 1)))


@dataclass
class TrainResult:
    """A trained model with its data, configs, metrics and the per-epoch history."""

    model: TransformerProgram
    data: TaskData
    model_config: ModelConfig
    train_config: TrainConfig
    metrics: dict
    history: list[dict]


def evaluate(model: TransformerProgram, split: TaskSplit) -> float:
    """Token accuracy of the discretized (argmax) model on a split."""
    pred = model.predict(torch.from_numpy(split.x))
    return accuracy(pred.numpy(), split.y)


class TrainStateError(HeadsurgeonError, ValueError):
    """A saved training state cannot be resumed (another task or settings) or would be overwritten."""


def train(
    task: str | TaskData,
    train_config: TrainConfig | None = None,
    progress: bool = True,
    callback: Callable[[dict], None] | None = None,
    state_dir: str | Path | None = None,
    resume: bool = False,
    **shape,
) -> TrainResult:
    """Train a Transformer Program on a task and evaluate its discretized form on every split.

    ``task`` is a task name (data generated from ``train_config``) or ready ``TaskData``; ``shape``
    overrides the Table 1 shape (``n_layers``, ``n_heads_cat``, ...). With ``state_dir`` the training
    state is saved after every epoch (headsurgeon/tp/resume.py) and ``resume=True`` continues from it, ending
    exactly where an uninterrupted run would.
    """
    data = task if isinstance(task, TaskData) else None
    name = data.name if data is not None else str(task)
    if train_config is None:
        base_shape, train_config = default_configs(name)
    else:
        base_shape, _ = default_configs(name)
    base_shape.update(shape)
    tc = train_config
    if data is None:
        data_seed = tc.seed if tc.data_seed is None else tc.data_seed
        data = make_task(name, size=tc.dataset_size, seed=data_seed)
    mc = model_config_for(data, **base_shape)

    set_seed(tc.seed)
    model = TransformerProgram(mc)
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    x_train = torch.from_numpy(data.train.x)
    y_train = torch.from_numpy(data.train.y)
    n = len(x_train)
    steps_per_epoch = max(1, math.ceil(n / tc.batch_size))
    total = steps_per_epoch * tc.epochs
    gen = torch.Generator().manual_seed(tc.seed)
    history: list[dict] = []
    step, start_epoch, seconds_before, cpu_before = 0, 0, 0.0, 0.0
    fingerprint = {"task": name, "train": tc.to_dict(), "model": mc.to_dict()}
    folder = Path(state_dir) if state_dir is not None else None
    if folder is not None:
        saved = load_state(folder, model, opt, gen) if resume else None
        if saved is None and (folder / STATE_FILE).exists() and not resume:
            raise TrainStateError(f"{folder} already holds a training state: pass resume=True (--resume) to "
                                  "continue it, or choose another output folder")
        if saved is not None:
            if saved["fingerprint"] != json.loads(json.dumps(fingerprint)):
                raise TrainStateError(f"the training state in {folder} is for other settings than this run; "
                                      "resume with the same task and settings, or choose another output folder")
            step, start_epoch, history = saved["step"], saved["epoch"] + 1, saved["history"]
            seconds_before, cpu_before = saved["seconds"], saved.get("cpu_seconds", 0.0)
    t0, c0 = time.perf_counter(), time.process_time()
    bar = tqdm(range(start_epoch, tc.epochs), desc=f"tp {name}", disable=not progress, leave=False,
               initial=start_epoch, total=tc.epochs)
    for epoch in bar:
        model.train()
        order = torch.randperm(n, generator=gen)
        losses = []
        for s in range(steps_per_epoch):
            idx = order[s * tc.batch_size : (s + 1) * tc.batch_size]
            x = x_train[idx]
            y = y_train[idx]
            width = int((x != 0).sum(1).max())
            x, y = x[:, :width], y[:, :width]
            tau = tau_schedule(step, total, tc.tau_init, tc.tau_end)
            loss = token_loss(model(x, tau=tau), y)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss became {loss.item()} at epoch {epoch}, step {step}; lower lr")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        rec = {"epoch": epoch, "loss": float(np.mean(losses)), "tau": tau}
        if tc.eval_every and ((epoch + 1) % tc.eval_every == 0 or epoch + 1 == tc.epochs):
            rec["val_acc"] = evaluate(model, data.val)
        history.append(rec)
        bar.set_postfix({k: round(v, 4) for k, v in rec.items() if k != "epoch"})
        if folder is not None:
            save_state(folder, model, opt, gen, {"epoch": epoch, "step": step, "history": history,
                                                 "seconds": seconds_before + time.perf_counter() - t0,
                                                 "cpu_seconds": cpu_before + time.process_time() - c0,
                                                 "fingerprint": fingerprint})
        if progress and epoch == start_epoch:
            per_epoch = time.perf_counter() - t0
            left = per_epoch * (tc.epochs - epoch - 1)
            tqdm.write(f"tp {name}: epoch {epoch + 1} took {per_epoch:.1f} s; about {left / 60:.1f} min to go "
                       f"for {tc.epochs - epoch - 1} more epochs" + (f" (state saved in {folder} each epoch)"
                                                                       if folder is not None else ""))
        if callback is not None:
            callback(rec)
    train_seconds = seconds_before + time.perf_counter() - t0
    train_cpu_seconds = cpu_before + time.process_time() - c0
    from .discrete import discretize

    program = discretize(model, data.vocab, data.labels, name)
    preds = {split: program.predict(getattr(data, split).x) for split in ("train", "val", "test")}
    torch_test = model.predict(torch.from_numpy(data.test.x)).numpy()
    real = data.test.x != 0
    metrics = {
        "task": name,
        # accuracies of the discretized program (what the decompiled Python computes)
        "train_acc": accuracy(preds["train"], data.train.y),
        "val_acc": accuracy(preds["val"], data.val.y),
        "test_acc": accuracy(preds["test"], data.test.y),
        # the hard torch model (float32) agrees with it except on float ties
        "torch_hard_test_acc": accuracy(torch_test, data.test.y),
        "torch_program_agreement": float((torch_test == preds["test"])[real].mean()),
        "train_seconds": train_seconds,
        # process CPU time of the training loop (all threads), summed over resumed sessions
        "train_cpu_seconds": train_cpu_seconds,
        "steps": total,
        "n_train": len(data.train),
        "n_val": len(data.val),
        "n_test": len(data.test),
        "torch_threads": torch.get_num_threads(),
    }
    if name in PAPER_ACCURACY:
        metrics["paper_test_acc"] = PAPER_ACCURACY[name] / 100
    return TrainResult(model, data, mc, tc, metrics, history)
