"""The search stage's settings: which registered searchers run, each built-in searcher's own options (the learned
searcher's ``LearnedConfig``, the LLM agent's ``AgentConfig``, the enumerative search's ``EnumerativeConfig``) and the
user's program library. ``options()`` is what the searcher factories receive (headsurgeon/synth/search/builtin.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ...core.argtypes import int_at_least, non_negative_float
from ...core.configs import nested, setting
from ...core import SELECT_BY, SelectBy
from ..eaps import LIBRARY_BUDGET_S, MAX_LIBRARY_PROGRAMS, load_library
from .enumerative.config import EnumerativeConfig
from .learned.config import LearnedConfig
from .llm.config import AgentConfig

__all__ = ["SEARCHERS", "SearchConfig"]

#: the searchers explain runs by default (any registered name may be asked for; see docs/architecture.md). The
#: learned searcher is not among them: on SmolLM2 it more than doubled the search time for no better program
#: (benchmarks/RESULTS.md); ``--searchers enumerative learned`` asks for it
SEARCHERS = ("enumerative", "llm")


@dataclass(frozen=True)
class SearchConfig:
    """Which searchers run, with what options, and the user's programs that compete for every head."""

    searchers: tuple[str, ...] = setting(SEARCHERS, nargs="+",
                                         help="which searchers run, in order (llm only when an endpoint is "
                                              "configured); any registered name")
    library: tuple[Any, ...] = setting(
        (), action="append", type=Path, metavar="FILE.py",
        help="program file in EAPS's style (prog(sentence, tokenizer) -> (label, matrix)); repeatable. Its "
             "functions compete for every head; they run only in the sandbox, each once per run. The first "
             "--library-max-programs accepted programs per file are used; the library search stops after "
             "--library-budget seconds. In Python also programs or DSL text")
    library_max_programs: int = setting(MAX_LIBRARY_PROGRAMS, type=int_at_least(1), metavar="N",
                                        help="per-file budget of --library programs: the first N accepted ones are "
                                             "used and the rest reported")
    library_budget: float = setting(LIBRARY_BUDGET_S, type=non_negative_float, metavar="SECONDS",
                                    help="time for the --library programs, in total across heads; past it the "
                                         "programs scored so far compete and the report notes the rest")
    select_by: SelectBy = setting("iou", choices=SELECT_BY,
                             help="what chooses among candidates on the select split: soft IoU, or value-weighted "
                                  "IoU / JSD (attention weighed by each key's value norm through the head, so the "
                                  "first-token sink counts by what it moves; needs a store with value norms)")
    enumerative: EnumerativeConfig | Mapping[str, Any] | None = setting(
        None, flag=None, help="the enumerative search's EnumerativeConfig, or a mapping of its fields (beam, top_k, "
                              "...); its seed is the run's")
    learned: LearnedConfig | None = setting(None, flag=None, help="the learned searcher's LearnedConfig")
    agent_config: AgentConfig | None = nested(AgentConfig, optional=True, prefix="llm_",
                                              help="the LLM agent's AgentConfig (default: from the environment)")

    def programs(self, notes: list[str] | None = None) -> list[Any]:
        """The library as programs: each ``Path`` is a file read by ``load_library`` (validated, never run here);
        ``notes`` receives each file's counts of programs accepted, refused (and why) and past the budget."""
        out: list[Any] = []
        for item in self.library:
            out.extend(load_library([item], budget=self.library_budget, max_programs=self.library_max_programs,
                                    notes=notes) if isinstance(item, Path) else [item])
        return out

    def options(self, library: list[Any] | None = None) -> dict[str, Any]:
        """Per searcher name, what its factory is given (``SearchSettings.options``); ``library``: the loaded
        programs (default :meth:`programs`)."""
        out: dict[str, Any] = {"llm": self.agent_config, "library": self.programs() if library is None else library}
        if self.enumerative:  # a mapping of fields is copied; headsurgeon/synth/search/builtin.py makes the config
            out["enumerative"] = (self.enumerative if isinstance(self.enumerative, EnumerativeConfig)
                                  else dict(self.enumerative))
        if self.learned is not None:
            out["learned"] = {"config": self.learned}
        return out
