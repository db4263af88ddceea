"""Healing inside a build: every hybrid healed the same way and judged against the base tuned the same way, the budget
bounding the healed hybrid (``grow_healed``), and the control healed like the build (``heal_and_judge``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..configs import BuildConfig
from ..core import Head
from .growth import within

if TYPE_CHECKING:  # the model and measurement types load torch: named for the checker only
    from ..surgery.measure.divergence import BaseDistributions
    from ..surgery.models.handle import ModelHandle
    from ..surgery.swap.heal import HealReport
    from ..surgery.swap.hybrid import HybridModel
    from ..synth.programset import ProgramSet
    from ..synth.sequence import Sequence

    Healed = tuple[HybridModel, HealReport]

__all__ = ["Healer", "grow_healed", "heal_and_judge"]


class Healer:
    """Heals hybrids of this build's candidates the same way (headsurgeon/surgery/swap/heal.py: the synth windows,
    early-stopped on the select windows) and holds the reference they are judged against: the base itself when
    healing distils from it ("kl"), else a copy of the base tuned the same way ("lm")."""

    def __init__(self, handle: ModelHandle, swap_set: ProgramSet, cfg: BuildConfig, synth: list[Sequence],
                 select: list[Sequence]) -> None:
        from ..surgery.swap.handle_copy import independent_handle
        from ..surgery.swap.heal import heal

        self.handle, self.swap_set, self.cfg, self.synth, self.select = handle, swap_set, cfg, synth, select
        self.tuned, self.base_heal = handle, None
        if cfg.heal_objective == "lm":
            self.tuned = independent_handle(handle)
            self.base_heal = heal(self.tuned, synth, steps=cfg.heal_steps, validation=select,
                                  progress=cfg.progress).to_json()

    def heal(self, heads: list[Head], swap_set: ProgramSet | None = None) -> Healed:
        """A healed copy of the hybrid swapping ``heads`` (from ``swap_set``, default this build's chosen programs)."""
        from ..surgery.swap.heal import heal
        from ..surgery.swap.replace import replace_heads

        hybrid = replace_heads(self.handle, (swap_set or self.swap_set).subset(heads), which=self.cfg.which, copy=True)
        return hybrid, heal(hybrid, self.synth, steps=self.cfg.heal_steps, objective=self.cfg.heal_objective,
                            validation=self.select, progress=self.cfg.progress)

    def reference(self, windows: list[Sequence]) -> BaseDistributions:
        from ..surgery.measure.divergence import BaseDistributions

        return BaseDistributions(self.tuned, windows)


def grow_healed(healer: Healer, chain: list[Head], start: int, budget: float,
                chunk: int) -> tuple[list[Head], list[dict[str, Any]], Healed | None]:
    """With ``heal`` and a budget, the budget bounds the healed hybrid: from the ``start`` heads the untuned growth
    kept, longer prefixes of ``chain`` are healed and measured on the select windows (against the equally tuned base),
    the step doubling while they fit, then halved between the longest fit and the shortest miss down to ``chunk``
    heads. Returns the heads, every try, and the healed (hybrid, report) of the longest fit beyond ``start``."""
    from ..surgery.measure.divergence import summarize, window_costs

    reference = healer.reference(healer.select)
    tries: list[dict[str, Any]] = []
    good, bad, best = start, None, None
    step = max(chunk, start // 4)

    def attempt(k: int) -> tuple[bool, Healed]:
        hybrid, report = healer.heal(chain[:k])
        summary = summarize(window_costs(reference, hybrid))
        fits = within(summary, budget)
        tries.append({"heads": k, "fits": fits, **summary.to_json(), "best_step": report.best_step})
        return fits, (hybrid, report)

    while bad is None and good < len(chain):
        k = min(len(chain), good + step)
        fits, made = attempt(k)
        if fits:
            good, best, step = k, made, 2 * step
        else:
            bad = k
    while bad is not None and bad - good > chunk:
        k = (good + bad) // 2
        fits, made = attempt(k)
        good, best, bad = (k, made, bad) if fits else (good, best, k)
    return chain[:good], tries, best


def heal_and_judge(healer: Healer, heads: list[Head], measured: list[Sequence], base: BaseDistributions,
                   control: dict[str, Any] | None, programs: ProgramSet,
                   ready: Healed | None = None) -> tuple[HybridModel, dict[str, Any]]:
    """Heal the hybrid of ``heads`` (unless ``ready`` holds it healed) and the control the same way, and judge them
    on the ``measured`` windows against the base tuned the same way: with "kl" (distilling from the base) that is the
    base itself, whose KL to itself is 0, so no step moves it; with "lm" a copy of the base tuned on the same windows,
    and every healed figure is against that copy."""
    from ..surgery.measure.divergence import summarize, window_costs

    healed: dict[str, Any] = {"objective": healer.cfg.heal_objective}
    reference = base
    if healer.base_heal is not None:
        healed["base_heal"] = healer.base_heal
        reference = healer.reference(measured)
        tuned = healer.tuned
        healed["tuned_base_vs_base"] = summarize(window_costs(base, lambda ids, attention_mask=None:
                                                              tuned.forward(ids, attention_mask))).to_json()
    final, report = ready or healer.heal(heads)
    healed["heal"] = report.to_json()
    healed["test"] = summarize(window_costs(reference, final)).to_json()
    if control is not None:
        other, _ = healer.heal([Head.parse(h) for h in control["heads"]], programs)
        control["healed"] = summarize(window_costs(reference, other)).to_json()
    return final, healed
