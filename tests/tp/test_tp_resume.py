"""A Transformer Program run saves its state every epoch; a killed run resumes and ends exactly where an
uninterrupted one ends (weights, history and the discretized program's accuracy)."""
from __future__ import annotations

import pytest
import torch

from headsurgeon.tp.train import TrainConfig, TrainStateError, train

CONFIG = dict(task="hist", seed=0, dataset_size=600, epochs=4, batch_size=128, eval_every=0)


class Killed(Exception):
    pass


def kill_after(epoch: int):
    def callback(rec: dict) -> None:
        if rec["epoch"] == epoch:
            raise Killed()
    return callback


def test_killed_run_resumes_bit_for_bit(tmp_path):
    straight = train("hist", TrainConfig(**CONFIG), progress=False, state_dir=tmp_path / "a", n_layers=1)
    with pytest.raises(Killed):
        train("hist", TrainConfig(**CONFIG), progress=False, state_dir=tmp_path / "b", n_layers=1,
              callback=kill_after(1))
    resumed = train("hist", TrainConfig(**CONFIG), progress=False, state_dir=tmp_path / "b", n_layers=1,
                    resume=True)
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in resumed.history] == [r["loss"] for r in straight.history]
    assert resumed.metrics["test_acc"] == straight.metrics["test_acc"]


def test_existing_state_is_never_overwritten_silently(tmp_path):
    with pytest.raises(Killed):
        train("hist", TrainConfig(**CONFIG), progress=False, state_dir=tmp_path, n_layers=1, callback=kill_after(0))
    with pytest.raises(TrainStateError, match="resume"):
        train("hist", TrainConfig(**CONFIG), progress=False, state_dir=tmp_path, n_layers=1)
    with pytest.raises(TrainStateError, match="other settings"):
        train("hist", TrainConfig(**{**CONFIG, "seed": 1}), progress=False, state_dir=tmp_path, n_layers=1,
              resume=True)


def test_cli_resume_after_a_kill(tmp_path, capsys):
    """`headsurgeon tp train` refuses to overwrite a killed run's state and finishes it with --resume (the command
    in this process; tests/facade/test_cli.py starts it as a program)."""
    from headsurgeon.cli import main
    from headsurgeon.tp.train import default_configs

    out = tmp_path / "run"
    args = ["tp", "train", "hist", "--out", str(out), "--epochs", "3", "--dataset-size", "600", "--batch-size", "128",
            "--layers", "1", "--no-progress"]
    _, tc = default_configs("hist", epochs=3, dataset_size=600, batch_size=128)  # what the CLI builds
    with pytest.raises(Killed):
        train("hist", tc, progress=False, state_dir=out, n_layers=1, callback=kill_after(0))
    assert main(args) != 0 and "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0, capsys.readouterr().err[-2000:]
    assert (out / "model.safetensors").is_file() and not (out / "train_state.safetensors").exists()


def test_cli_refuses_to_train_over_a_finished_run_unless_overwrite(tmp_path, capsys):
    """`tp train` into a finished run's folder is refused before training; --overwrite replaces it."""
    from headsurgeon.cli import main

    out = tmp_path / "run"
    args = ["tp", "train", "hist", "--out", str(out), "--epochs", "1", "--dataset-size", "300", "--batch-size", "128",
            "--layers", "1", "--no-progress", "--threads", "1"]
    assert main(args) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main([*args, "--seed", "1"]) == 1
    err = capsys.readouterr().err
    assert "already holds a finished run" in err and "--overwrite" in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # config, weights, metrics, program kept
    assert main([*args, "--seed", "1", "--resume"]) == 1  # --resume cannot resume a finished run either
    assert main([*args, "--seed", "1", "--overwrite"]) == 0
    assert '"seed": 1' in (out / "config.json").read_text()
