"""Run directories: everything one training run leaves behind, without pickle.

Layout::

    RUN_DIR/config.json        model shape, training settings, vocabularies, format version
    RUN_DIR/model.safetensors  the trained parameters (safetensors)
    RUN_DIR/metrics.json       accuracies of the discretized model, wall time, per-epoch history
    RUN_DIR/program.json       the discretized program (``DiscreteProgram.to_json``)
    RUN_DIR/program.py         the decompiled standalone Python module
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load as load_tensors, save_file

from .decompile import decompile
from .discrete import DiscreteProgram, discretize
from .model import ModelConfig, TransformerProgram
from .resume import MAX_WEIGHTS_BYTES, STATE_FILE
from .train import TrainConfig, TrainResult
from ..core.fileio import atomic_path, atomic_write_bytes, read_bounded
from ..core import HeadsurgeonError, InputError
from ..core.formats import FileFormat, read_versioned, write_versioned

#: config.json's format (headsurgeon/core/formats.py): its only header is the version, in the field "format"
RUN_CONFIG = FileFormat(None, 1, (1,), "a tp run's config.json", "train the run again with `headsurgeon tp train`",
                        version_key="format", error=InputError)
FORMAT_VERSION = RUN_CONFIG.version
RUN_FILES = ("config.json", "model.safetensors", "metrics.json", "program.json", "program.py")


class RunExistsError(HeadsurgeonError, ValueError):
    """A folder already holds a finished run, which training into it would overwrite."""


def check_run_folder(out: str | Path, overwrite: bool = False) -> None:
    """Refuse to train into a folder holding a finished run unless ``overwrite``; an unfinished (resumable) run passes.

    A run is unfinished while its per-epoch state (headsurgeon/tp/resume.py) is there: save_run removes it last.
    """
    out = Path(out)
    found = [name for name in RUN_FILES if os.path.lexists(out / name)]
    if found and not overwrite and not os.path.lexists(out / STATE_FILE):
        raise RunExistsError(f"{out} already holds a finished run ({', '.join(found)}); training would overwrite it. "
                             "Pass --overwrite to replace it, or choose another --out")


@dataclass
class Run:
    """A loaded run: the model (discretizable), its configs and vocabularies."""

    path: Path
    model: TransformerProgram
    model_config: ModelConfig
    train_config: TrainConfig
    vocab: list[str]
    labels: list[str]
    task: str

    def discretize(self) -> DiscreteProgram:
        return discretize(self.model, self.vocab, self.labels, self.task)


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def _write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, _json(obj))


def save_run(result: TrainResult, out: str | Path) -> Path:
    """Write config, safetensors weights, metrics, the discretized program and its decompiled source."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = result.data
    write_versioned(
        out / "config.json", RUN_CONFIG,
        {
            "task": data.name,
            "model": result.model_config.to_dict(),
            "train": result.train_config.to_dict(),
            "vocab": data.vocab,
            "labels": data.labels,
        },
        encode=_json,
    )
    state = {k: v.detach().contiguous() for k, v in result.model.state_dict().items()}
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": str(RUN_CONFIG.version), "task": data.name})
    _write_json(out / "metrics.json", {**result.metrics, "history": result.history})
    write_program(load_run(out), out)
    return out


def write_program(run: Run, out: str | Path | None = None) -> tuple[Path, Path]:
    """Discretize a run and write ``program.json`` and the decompiled ``program.py`` into ``out`` (default: the run)."""
    out = Path(out) if out is not None else run.path
    prog = run.discretize()
    _write_json(out / "program.json", prog.to_json())
    (out / "program.py").write_text(decompile(prog))
    return out / "program.json", out / "program.py"


def load_run(path: str | Path) -> Run:
    """Rebuild the model of a run directory from ``config.json`` and ``model.safetensors``."""
    path = Path(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    for f in (cfg_file, weights):
        if not f.exists():
            raise FileNotFoundError(f"{f} is missing; is {path} a run directory written by `headsurgeon tp train`?")
    cfg = read_versioned(cfg_file, RUN_CONFIG, 64 << 20)  # no links or devices, size first; its version checked
    model_cfg = dict(cfg["model"])
    model_cfg.setdefault("num_value_gate", False)  # runs written before the value gate existed counted only
    mc = ModelConfig.from_dict(model_cfg)
    model = TransformerProgram(mc)
    state = load_tensors(read_bounded(weights, MAX_WEIGHTS_BYTES, "a run's model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{weights} does not fit config.json: missing {missing}, unexpected {unexpected}")
    model.eval()
    return Run(path, model, mc, TrainConfig.from_dict(cfg["train"]), cfg["vocab"], cfg["labels"], cfg["task"])


def load_program(path: str | Path) -> DiscreteProgram:
    """The discretized program of a run directory (``program.json``, or rebuilt from the weights)."""
    path = Path(path)
    if (path / "program.json").exists():
        obj = json.loads(read_bounded(path / "program.json", 256 << 20, "a run's program.json"))
        if "num_bounds" in obj:  # older program.json files are rebuilt from the weights
            return DiscreteProgram.from_json(obj)
    return load_run(path).discretize()


__all__ = ["Run", "save_run", "load_run", "load_program", "write_program", "check_run_folder", "RunExistsError",
           "RUN_FILES", "FORMAT_VERSION"]
