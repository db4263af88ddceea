"""``ExplainConfig``: every stage's settings for one ``explain`` run, composed from the stages' own configs in
their layers (surgery/configs.py, synth/search/config.py, headsurgeon/scaleout/config.py). ``explain``'s keyword
shortcuts (``max_len=``, ``searchers=``, ...) are these fields by name (hskernels/configs.py ``with_shortcuts``),
and ``headsurgeon explain`` builds its flags from them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .kernels.configs import nested, setting, with_shortcuts
from .scaleout.config import ScaleoutConfig
from .surgery.configs import CaptureConfig, CorpusConfig, MeasureConfig, ModelConfig
from .synth.search.config import SearchConfig

__all__ = ["ExplainConfig", "CaptureConfig", "CorpusConfig", "MeasureConfig", "ModelConfig", "ScaleoutConfig",
           "SearchConfig"]


@dataclass(frozen=True)
class ExplainConfig:
    """All of explain's settings, one config per stage; ``corpus.seed`` also seeds the searchers and the sweep."""

    model: ModelConfig = nested(ModelConfig)
    corpus: CorpusConfig = nested(CorpusConfig)
    capture: CaptureConfig = nested(CaptureConfig)
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
