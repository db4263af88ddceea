"""The ``headsurgeon`` model registered with EleutherAI's lm-evaluation-harness, and lm-eval's command line with it.

lm-eval (the optional extra ``eval``) has no plugin entry point for models, so importing this module registers the
model; ``python -m headsurgeon.harness ARGS`` is lm-eval's own command line with it registered, and with
headsurgeon's task folder (the ``eaps6`` group) on the include path unless ``--include_path`` is given::

    python -m headsurgeon.harness --model headsurgeon \\
        --model_args checkpoint=my-hybrid --tasks eaps6 --limit 200

It lives above headsurgeon/hub/ (docs/architecture.md, Layers) because ``checkpoint=DIR`` loads a hybrid checkpoint.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lm_eval.api.registry import register_model

from .core import InputError
from .hub.checkpoint import load_hybrid
from .surgery.measure.downstream import TASKS_DIR
from .surgery.measure.lm_eval_model import HeadsurgeonLM, model_flag
from .synth.programset import ProgramMap, ProgramSet
from .synth.trust import TrustPrograms

__all__ = ["HarnessLM", "main"]


@register_model("headsurgeon")
class HarnessLM(HeadsurgeonLM):
    """``--model_args model=SPEC[,tokenizer=...][,programs=programs.json|checkpoint=DIR][,which=...]``.

    ``checkpoint`` is a hybrid checkpoint folder or ``hf://org/name``; its Python programs run only with
    ``trust_programs=true`` or ``trust_programs=HASH1+HASH2`` (its DSL programs need no trust), as with
    ``hs.load_hybrid``; ``programs=programs.json`` goes through the same trust gate (headsurgeon/synth/trust.py), every slot.
    """

    def __init__(self, model: Any = None, checkpoint: str | None = None,
                 programs: ProgramSet | ProgramMap | str | Path | None = None,
                 trust_programs: TrustPrograms = False, device: str | None = None, **options: Any) -> None:
        if checkpoint is not None:
            if model is not None or programs is not None:
                raise InputError("checkpoint=DIR already names the model and its programs: drop model= and "
                                 "programs= from --model_args")
            if device and str(device).startswith("cuda"):
                import torch

                device = device if torch.cuda.is_available() else "cpu"  # lm-eval's command line defaults to cuda
            model = load_hybrid(checkpoint, trust_programs=model_flag(trust_programs), device=device or "cpu")
        super().__init__(model=model if model is not None else "tiny-stories", programs=programs,
                         trust_programs=trust_programs, device=device, **options)


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line (``lm_eval ...``) with the ``headsurgeon`` model and headsurgeon's tasks available."""
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0], *args]
    cli_evaluate()


if __name__ == "__main__":
    main()
