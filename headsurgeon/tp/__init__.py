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

Names are imported lazily so that ``headsurgeon tp --help`` does not pay for torch. The functions
``train`` and ``decompile`` share their modules' names: use ``from headsurgeon.tp.train import
train`` and ``from headsurgeon.tp.decompile import decompile``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.lazy import lazy_package

if TYPE_CHECKING:  # the package's names, loaded on first use (headsurgeon/core/lazy.py)
    from .decompile import load_module
    from .discrete import DiscreteProgram, discretize
    from .export import export_heads, skipped_heads
    from .failures import failure_groups, format_failures
    from .model import ModelConfig, TransformerProgram
    from .rundir import load_program, load_run, save_run
    from .shapes import PAPER_ACCURACY, TASK_CONFIGS
    from .tasks import TASKS, TaskData, make_task
    from .train import TrainConfig, TrainResult, default_configs

__all__, __getattr__, __dir__ = lazy_package(__file__, __name__)
