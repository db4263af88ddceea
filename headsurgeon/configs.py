"""``ExplainConfig``: every stage's settings for one ``explain`` run, composed from the stages' own configs in
their layers (headsurgeon/surgery/configs.py, headsurgeon/synth/search/config.py, headsurgeon/scaleout/config.py). ``explain``'s keyword
shortcuts (``max_len=``, ``searchers=``, ...) are these fields by name (headsurgeon/core/configs.py ``with_shortcuts``),
and ``headsurgeon explain`` builds its flags from them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .core.argtypes import fraction, int_at_least, positive_float, positive_int
from .core.configs import nested, setting, with_shortcuts
from .core import HEAL_OBJECTIVES, WHICHES, HealObjective, Which
from .scaleout.config import ScaleoutConfig
from .surgery.configs import CaptureConfig, CorpusConfig, HeadsConfig, MeasureConfig, ModelConfig
from .synth.search.config import SearchConfig

__all__ = ["ExplainConfig", "BuildConfig", "CaptureConfig", "CorpusConfig", "HeadsConfig", "MeasureConfig", "ModelConfig",
           "ScaleoutConfig", "SearchConfig"]


@dataclass(frozen=True)
class ExplainConfig:
    """All of explain's settings, one config per stage; ``corpus.seed`` also seeds the searchers and the sweep."""

    model: ModelConfig = nested(ModelConfig)
    corpus: CorpusConfig = nested(CorpusConfig)
    capture: CaptureConfig = nested(CaptureConfig)
    subset: HeadsConfig = nested(HeadsConfig)
    search: SearchConfig = nested(SearchConfig)
    scaleout: ScaleoutConfig = nested(ScaleoutConfig)
    measure: MeasureConfig = nested(MeasureConfig)
    progress: bool = setting(True, flag=None, help="progress bars")
    capture_only: bool = setting(False, action="store_true",
                                 help="stop once OUT/store is complete; the same command without it later goes on "
                                      "from there")

    @classmethod
    def resolve(cls, config: "ExplainConfig | None", shortcuts: Mapping[str, Any]) -> "ExplainConfig":
        """``config``, or one built from explain's keyword ``shortcuts``; both together or an unknown name is an
        InputError."""
        return with_shortcuts(cls, config, shortcuts, "explain()")


@dataclass(frozen=True)
class BuildConfig:
    """``build``'s settings: which programs, how many heads (a share, or a perplexity budget on the select windows),
    healing, and where the result is judged (headsurgeon/build/)."""

    model: ModelConfig = nested(ModelConfig)
    corpus: CorpusConfig = nested(CorpusConfig)
    which: Which = setting("explanation", choices=WHICHES, help="swap each head's readable explanation or its "
                                                             "replacement (its most faithful program)")
    fraction: float | None = setting(None, type=fraction, metavar="F",
                                     help="swap this share of all the model's heads, cheapest first")
    budget_ppl: float | None = setting(None, type=positive_float, metavar="PCT",
                                       help="swap as many heads as fit under this ΔPPL (percent): the upper end "
                                            "of its 95%% interval on the select windows, cheapest first (with "
                                            "--heal: after healing)")
    heal: bool = setting(False, action="store_true",
                         help="tune the norm gains on the synth (and --heal-more) windows after the swap; every healed "
                              "cost is against the base tuned the same way")
    heal_steps: int = setting(40, type=positive_int, help="optimizer steps of --heal")
    heal_objective: HealObjective = setting("kl", choices=HEAL_OBJECTIVES,
                                  help="what --heal trains for: kl distils the hybrid from the base (the base is "
                                       "its own control); lm is next-token loss on the synth windows (a copy of the "
                                       "base is tuned the same way as the control)")
    heldout: Any = setting(None, metavar="FILE",
                           help="text whose windows are measured beside the test split (never seen by selection or "
                                "healing)")
    control: bool = setting(False, action="store_true",
                            help="also build the same number of heads in select-IoU order, healed the same way, and "
                                 "measure it on the same windows")
    costs: Any = setting(None, metavar="FILE",
                         help="keep the per-head causal costs here: progress is written after each batch, and a rerun "
                              "with the same model, windows and programs goes on from it")
    select_more: int = setting(0, type=int_at_least(0), metavar="N",
                               help="also choose and grow on N windows of the corpus from documents after explain's "
                                    "windows (never searched, selected or tested on): less noisy than the select "
                                    "windows alone")
    heal_more: int = setting(0, type=int_at_least(0), metavar="N",
                             help="--heal also trains on N windows of the corpus from documents after explain's (and "
                                  "after --select-more's) windows: never searched, selected or tested on")
    chunk: int | None = setting(None, type=positive_int,
                                help="heads added between joint re-measurements (default: 2%% of the model's heads)")
    progress: bool = setting(True, flag=None, help="progress bars")

    @classmethod
    def resolve(cls, config: "BuildConfig | None", shortcuts: Mapping[str, Any]) -> "BuildConfig":
        """``config``, or one built from build_hybrid's keyword ``shortcuts`` (InputError on both or unknown)."""
        return with_shortcuts(cls, config, shortcuts, "build_hybrid()")
