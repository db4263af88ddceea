"""Learning Transformer Programs (Friedman, Wettig & Chen 2023).

Transformers constrained so that, after training, they map deterministically to readable Python:

* ``tasks``: the paper's RASP tasks (reverse, hist, double_hist, sort, most_freq, dyck1, dyck2) and the
  induction toy task, 20,000 unique samples split 16.2k / 1.8k / 2k (``make_task``);
* ``model``: the disentangled-residual-stream model (``TransformerProgram``, ``ModelConfig``);
* ``train``: the paper's recipe and Table 1 shapes (``train``, ``default_configs``, ``TASK_CONFIGS``);
* ``discrete``: the argmax'd model as a numpy program (``discretize`` -> ``DiscreteProgram``);
* ``decompile``: ``DiscreteProgram`` -> standalone Python source (``decompile``);
* ``rundir``: run directories (config.json, model.safetensors, metrics.json, program.json/.py);
* ``export``: categorical heads as DSL ``Program`` objects (``export_heads``);
* ``failures``: a program's wrong answers grouped by the input pattern a correct algorithm needs;
* ``cli``: ``register(subparsers)`` for ``headsurgeon tp train|decompile|eval|failures|tasks``.

Names are imported lazily so that ``headsurgeon tp --help`` does not pay for torch. The functions
``train`` and ``decompile`` share their modules' names: use ``from headsurgeon.tp.train import
train`` and ``from headsurgeon.tp.decompile import decompile``.
"""
from __future__ import annotations

import importlib

_LAZY = {
    "make_task": "tasks",
    "TaskData": "tasks",
    "TASKS": "tasks",
    "TransformerProgram": "model",
    "ModelConfig": "model",
    "TrainConfig": "train",
    "TrainResult": "train",
    "default_configs": "train",
    "TASK_CONFIGS": "train",
    "PAPER_ACCURACY": "train",
    "discretize": "discrete",
    "DiscreteProgram": "discrete",
    "load_module": "decompile",
    "save_run": "rundir",
    "load_run": "rundir",
    "load_program": "rundir",
    "export_heads": "export",
    "skipped_heads": "export",
    "failure_groups": "failures",
    "format_failures": "failures",
    "register": "cli",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f".{_LAZY[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
