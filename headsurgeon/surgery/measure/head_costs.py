"""Per-head causal cost: what swapping one head at a time does to the model's predictions, for each kind of program
and for mean-ablating the head, as KL(base ‖ swapped) and ΔNLL per predicted token with paired intervals.

Cheap enough for every head: one base forward per batch keeps the residual stream entering each layer, and each swap
resumes the forward at its head's layer from that residual (the blocks below are not run again); swaps of one layer
share forwards, one row per (swap, window). A backend that ignores pattern edits (headsurgeon/surgery/swap/hooked_path.py z mode) or
cannot resume measures each swap as a whole hybrid forward instead: the same numbers, slower.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping, Sequence as Seq

import numpy as np
import torch
from tqdm.auto import tqdm

from ...synth.trust import TrustPrograms
from ...kernels.cache import TensorCache
from ...core import Head, InputError, HeadLike
from ...core.fileio import sha256_bytes
from ...core.formats import FileFormat, read_versioned, write_versioned
from ...synth.programset import ProgramMap, ProgramSet
from ...synth.sequence import Sequence
from ..batches import padded_batch
from ..patterns.capture import forward_patterns
from .divergence import BaseDistributions, CostSummary, WindowCosts, summarize, token_costs, window_costs
from ..models.loading import ModelHandle, load_model
from ..swap.pattern_edits import pattern_edits_take_effect
from ..swap.program_head import ProgramHead
from ..swap.providers import MeanPatterns
from ..swap.replace import replace_heads
from .scorable import require_lm_head

__all__ = ["HeadCosts", "head_costs", "mean_patterns", "VARIANTS", "COSTS_FILE"]

#: the progress and result file of ``head_costs(..., path=)``: per (head, variant) the per-window sums, and the
#: batches done, bound to the model, windows and programs by a fingerprint
COSTS_FILE = FileFormat("headsurgeon.head_costs", 1, (1,), "a per-head causal cost file",
                        "delete it to measure the costs again")
_COSTS_LIMIT = 256 << 20

Variant = Literal["replacement", "explanation", "mean"]
VARIANTS: tuple[str, ...] = ("replacement", "explanation", "mean")


@dataclass
class HeadCosts:
    """Per head and variant ("replacement", "explanation", "mean" ablation): per-window KL and NLL sums."""

    windows: int
    tokens: int
    costs: dict[Head, dict[str, WindowCosts]] = field(default_factory=dict)
    programs: dict[Head, dict[str, str]] = field(default_factory=dict)  # head → kind → program text
    resumed: bool = True  # whether swaps resumed at their layer (False: whole forwards)
    seed: int = 0

    def summary(self, head: HeadLike, variant: str) -> CostSummary:
        """KL, ΔNLL and ΔPPL of one swap, each with its paired bootstrap interval over windows."""
        return summarize(self.costs[Head.parse(head)][variant], seed=self.seed)

    def kl(self, head: HeadLike, variant: str) -> float | None:
        """Mean per-token KL(base ‖ swapped) of one swap; None when that head has no such variant."""
        c = self.costs.get(Head.parse(head), {}).get(variant)
        return None if c is None else float(c.kl.sum() / max(c.tokens.sum(), 1))

    def ratio(self, head: HeadLike, kind: str) -> float | None:
        """KL of the head's ``kind`` program over the KL of mean-ablating it: below 1 the program explains more than
        deleting the head does; None without both measurements (or a zero ablation cost)."""
        program, mean = self.kl(head, kind), self.kl(head, "mean")
        if program is None or mean is None or mean <= 0:
            return None
        return program / mean

    def order(self, kind: str) -> list[Head]:
        """The heads with a ``kind`` cost, cheapest single swap first (ties by head)."""
        heads = [h for h, v in self.costs.items() if kind in v]
        return sorted(heads, key=lambda h: (self.kl(h, kind), h))

    def to_json(self) -> dict[str, Any]:
        """Per head: each variant's summary (KL, ΔNLL, ΔPPL with intervals) and program/mean-ablation ratios."""
        heads: dict[str, Any] = {}
        for h in sorted(self.costs):
            row: dict[str, Any] = {v: self.summary(h, v).to_json() for v in self.costs[h]}
            for kind in ("replacement", "explanation"):
                r = self.ratio(h, kind)
                if r is not None:
                    row[f"{kind}_over_mean"] = r
            if h in self.programs:
                row["programs"] = self.programs[h]
            heads[Head.label(h)] = row
        return {"windows": self.windows, "tokens": self.tokens, "resumed": self.resumed, "heads": heads}

    def format(self, kind: str = "explanation", limit: int | None = None) -> str:
        """A text table: per head, the program's KL and ΔNLL, the mean ablation's KL, and their ratio."""
        lines = [f"{'head':>7}  {'KL ' + kind[:4] + '.':>10}  {'95% interval':>19}  {'KL mean-abl.':>12}  "
                 f"{'ratio':>6}  program"]
        for h in self.order(kind)[:limit]:
            s = self.summary(h, kind)
            mean = self.kl(h, "mean")
            ratio = self.ratio(h, kind)
            text = self.programs.get(h, {}).get(kind, "")
            lines.append(f"{Head.label(h):>7}  {s.kl:10.5f}  [{s.kl_ci95[0]:8.5f}, {s.kl_ci95[1]:8.5f}]  "
                         f"{'-' if mean is None else format(mean, '12.5f'):>12}  "
                         f"{'-' if ratio is None else format(ratio, '6.2f'):>6}  {text[:60]}")
        return "\n".join(lines)


def mean_patterns(handle: ModelHandle, reference: list[Sequence], heads: Seq[Head],
                  batch_size: int = 16) -> dict[Head, MeanPatterns]:
    """Each head's mean pattern per (query, key) position over ``reference``, accumulated batch by batch."""
    if not reference:
        raise InputError("mean ablation needs reference windows (e.g. the synth split); none were given")
    width = max(s.n for s in reference)
    total = {h: np.zeros((width, width), np.float64) for h in heads}
    count = np.zeros((width, 1), np.float64)
    for start in range(0, len(reference), batch_size):
        batch = reference[start: start + batch_size]
        for s, pats in zip(batch, forward_patterns(handle, batch)):
            count[: s.n] += 1
            for h in heads:
                total[h][: s.n, : s.n] += pats[h[0], h[1]]
    return {h: MeanPatterns.from_mean((t / np.maximum(count, 1)).astype(np.float32)) for h, t in total.items()}


def _sources(programs: ProgramSet | ProgramMap, kinds: tuple[str, ...], heads: Seq[HeadLike] | None, trust_programs: TrustPrograms,
             extra: Mapping[Any, Mapping[str, Any]] | None) -> tuple[dict[Head, dict[str, Any]],
                                                                     dict[Head, dict[str, str]]]:
    """head → variant → program for the heads asked (default: every head of the set), ``extra`` candidates
    included, and their texts."""
    if isinstance(programs, ProgramSet):
        programs = programs.trusted(trust_programs)
        by_kind = {k: programs.programs(k) for k in kinds}
    elif isinstance(programs, Mapping):
        if kinds != ("replacement",):
            raise InputError("a plain mapping holds one program per head: measure it with which=('replacement',), "
                             "or pass a ProgramSet for explanations")
        by_kind = {"replacement": {Head.parse(h): p for h, p in programs.items()}}
    else:
        raise InputError(f"programs must be a ProgramSet or a mapping head → program, got {type(programs).__name__}")
    wanted = None if heads is None else {Head.parse(h) for h in heads}
    out: dict[Head, dict[str, Any]] = {}
    texts: dict[Head, dict[str, str]] = {}
    for kind, chosen in by_kind.items():
        for h, p in chosen.items():
            if wanted is None or h in wanted:
                out.setdefault(h, {})[kind] = p
                texts.setdefault(h, {})[kind] = str(getattr(p, "text", p))
    for head, labelled in (extra or {}).items():
        h = Head.parse(head)
        for label, p in labelled.items():
            if label in VARIANTS:
                raise InputError(f"extra candidate label {label!r} for {Head.label(h)} is taken by a variant "
                                 f"({', '.join(VARIANTS)}); name it e.g. 'refit' or 'frontier:60'")
            if wanted is None or h in wanted:
                out.setdefault(h, {})[label] = p
                texts.setdefault(h, {})[label] = str(getattr(p, "text", p))
    if wanted is not None:
        missing = sorted(wanted - set(out))
        if missing:
            raise InputError(f"no {'/'.join(kinds)} program for {', '.join(Head.label(h) for h in missing[:20])}; "
                             "measure heads that have one (see programs.json)")
    return out, texts


def _same_programs(chosen: Mapping[Head, Mapping[str, Any]]) -> dict[tuple[Head, str], str]:
    """(head, label) → the label of the same program (by hash) on that head measured in its place, so a head whose
    explanation is its replacement is swapped once."""
    aliases: dict[tuple[Head, str], str] = {}
    for h, labelled in chosen.items():
        first: dict[str, str] = {}
        for label, program in labelled.items():
            key = getattr(program, "hash", None)
            if key is None:
                continue
            if key in first:
                aliases[(h, label)] = first[key]
            else:
                first[key] = label
    return aliases


@contextmanager
def _resume_at(model: Any, layer: int) -> Iterator[None]:
    """Blocks below ``layer`` pass their input through (their output is replaced at ``layer`` anyway)."""
    blocks = list(getattr(model, "blocks", []))[:layer]
    patched = []
    try:
        for block in blocks:
            inner = getattr(block, "original_component", None)
            if inner is None:  # a legacy HookedTransformer skips the blocks below start_at_layer itself
                continue
            inner.forward = lambda hidden_states, *args, **kwargs: hidden_states
            patched.append(inner)
        yield
    finally:
        for inner in patched:
            del inner.forward


class _Runner:
    """Runs one layer's swaps from the residual stream entering it, one row per (swap, window)."""

    def __init__(self, handle: ModelHandle) -> None:
        self.handle = handle
        model = handle.model
        self.resume = all(f"blocks.{l}.hook_in" in model.hook_dict for l in range(handle.n_layers))
        self.checked = False

    def residuals(self, ids: torch.Tensor, layers: Seq[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
        """The residual entering each layer of ``layers`` and the base logits, from one forward."""
        kept: dict[int, torch.Tensor] = {}
        hooks = self.handle.model.hook_dict
        handles = [hooks[f"blocks.{l}.hook_in"].register_forward_hook(
            lambda m, i, out, l=l: kept.__setitem__(l, out.detach())) for l in layers] if self.resume else []
        try:
            logits = self.handle.forward(ids)
        finally:
            for h in handles:
                h.remove()
        return kept, logits

    def run(self, layer: int, ids: torch.Tensor, resid: torch.Tensor | None,
            edits: list[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
        """Logits of rows (window b, head h, pattern [N, N]) with each row's head given its pattern."""
        rows = torch.tensor([b for b, _, _ in edits])
        heads = torch.tensor([h for _, h, _ in edits])
        stacked = torch.stack([p for _, _, p in edits])

        def edit(module: Any, inputs: Any, pattern: torch.Tensor) -> torch.Tensor:
            out = pattern.clone()
            out[torch.arange(len(edits)), heads] = stacked.to(out.device, out.dtype)
            return out

        hook = self.handle.model.hook_dict[f"blocks.{layer}.attn.hook_pattern"].register_forward_hook(edit)
        try:
            if resid is not None:
                with _resume_at(self.handle.model, layer):
                    return self.handle.model(resid[rows], start_at_layer=layer)
            return self.handle.forward(ids[rows])
        finally:
            hook.remove()

    def check(self, layer: int, ids: torch.Tensor, resid: torch.Tensor, logits: torch.Tensor) -> None:
        """Resuming must give the base's logits when nothing is edited; otherwise fall back to whole forwards."""
        self.checked = True
        with _resume_at(self.handle.model, layer):
            again = self.handle.model(resid[:1], start_at_layer=layer)
        scale = float(logits[:1].abs().max()) + 1.0
        if not torch.allclose(again.float(), logits[:1].float(), atol=1e-4 * scale, rtol=1e-4):
            warnings.warn(f"{self.handle.name}: resuming the forward at layer {layer} does not reproduce the base "
                          "model's logits; measuring each swap with a whole forward instead (slower)")
            self.resume = False


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for s in range(0, len(items), size):
        yield items[s: s + size]


_ARRAYS = ("kl", "nll_base", "nll_other", "tokens")


def _job_key(head: Head, variant: str, source: Any) -> str:
    """A swap's identity in the progress file: head, label, and the program's hash (the label alone for ablations)."""
    program = getattr(source, "program", None)
    return f"{Head.label(head)}:{variant}:{getattr(program, 'hash', variant)}"


class _Progress:
    """Each swap's per-window sums and the batches it has done, written atomically after each batch when given a
    path. Swaps of other runs on the same model and windows are kept, so a run that adds candidates measures only
    those."""

    def __init__(self, path: Any, fingerprint: str, jobs: dict[Head, dict[str, Any]], n: int) -> None:
        self.path, self.fingerprint = path, fingerprint
        self.keys = {(h, v): _job_key(h, v, src) for h, vs in jobs.items() for v, src in vs.items()}
        self.costs = {h: {v: WindowCosts.zeros(n) for v in vs} for h, vs in jobs.items()}
        self.done: dict[tuple[Head, str], set[int]] = {k: set() for k in self.keys}
        self.kept: dict[str, Any] = {}
        if path is not None and Path(path).exists():
            self._resume(read_versioned(path, COSTS_FILE, _COSTS_LIMIT))

    def _resume(self, doc: dict[str, Any]) -> None:
        if doc.get("fingerprint") != self.fingerprint:
            warnings.warn(f"{self.path} holds costs for other windows or another model; measuring again and "
                          "replacing it")
            return
        self.kept = dict(doc.get("swaps", {}))
        for (h, v), key in self.keys.items():
            record = self.kept.get(key)
            if not isinstance(record, dict):
                continue
            c = self.costs[h][v]
            try:
                arrays = {name: np.asarray(record[name], dtype=getattr(c, name).dtype) for name in _ARRAYS}
                done = {int(b) for b in record.get("done", [])}
                if any(a.shape != getattr(c, n).shape or not np.isfinite(a).all() for n, a in arrays.items()):
                    raise ValueError("arrays of the wrong length or not finite")
            except (KeyError, TypeError, ValueError) as e:
                warnings.warn(f"{self.path}: the record of {key} is damaged ({e}); measuring that swap again")
                continue
            for name, a in arrays.items():
                getattr(c, name)[:] = a
            self.done[(h, v)] = done

    def todo(self, number: int) -> set[tuple[Head, str]]:
        """The swaps that have not yet measured batch ``number``."""
        return {job for job, done in self.done.items() if number not in done}

    def save(self) -> None:
        if self.path is None:
            return
        for (h, v), key in self.keys.items():
            c = self.costs[h][v]
            self.kept[key] = {"done": sorted(self.done[(h, v)]), **{k: getattr(c, k).tolist() for k in _ARRAYS}}
        write_versioned(self.path, COSTS_FILE, {"fingerprint": self.fingerprint, "swaps": self.kept})


def _fingerprint(handle: ModelHandle, windows: list[Sequence], reference: list[Sequence] | None,
                 batch_size: int) -> str:
    """What every swap's numbers depend on beside its program: the model, the windows, their batching, and the mean
    ablation's reference windows."""
    parts = [handle.name, str(handle.n_layers), str(handle.n_heads), str(batch_size)]
    parts += [sha256_bytes(np.asarray(s.ids, dtype="<i8").tobytes()) for s in windows]
    parts += ["ref:" + sha256_bytes(np.asarray(s.ids, dtype="<i8").tobytes()) for s in reference or []]
    return sha256_bytes("\n".join(parts).encode())


@torch.no_grad()
def _resumed(handle: ModelHandle, jobs: dict[Head, dict[str, Any]], windows: list[Sequence], batch_size: int,
             max_bytes: int, progress: bool, state: _Progress) -> tuple[dict[Head, dict[str, WindowCosts]], bool]:
    """Every (head, variant) swap on every window, resuming at the head's layer (equal-length batches, no padding)."""
    runner = _Runner(handle)
    out = state.costs
    by_length: dict[int, list[int]] = {}
    for i, s in enumerate(windows):
        by_length.setdefault(s.n, []).append(i)
    layers = sorted({h[0] for h in jobs})
    rows_cap = max(1, max_bytes // max(1, max(s.n for s in windows) * handle.vocab_size * 4))
    per_window = sum(len(v) for v in jobs.values())
    bar = tqdm(total=per_window * len(windows), desc="per-head causal cost", unit="swap", disable=not progress)
    batches = [b for _, members in sorted(by_length.items()) for b in _chunks(members, batch_size)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, batch_idx in enumerate(batches):
            todo = state.todo(number)
            bar.update((per_window - len(todo)) * len(batch_idx))
            if not todo:
                continue
            seqs = [windows[i] for i in batch_idx]
            ids, _ = padded_batch(seqs)
            ids = ids.to(handle.device)
            resid, logits = runner.residuals(ids, layers)
            base_logp = torch.log_softmax(logits[:, :-1].float().cpu(), dim=-1)
            targets = ids[:, 1:].cpu()
            valid = torch.ones_like(targets, dtype=torch.bool)
            for layer in sorted({h[0] for h, _ in todo}):
                if runner.resume and not runner.checked:
                    runner.check(layer, ids, resid[layer], logits)
                edits = []
                for h in (h for h in jobs if h[0] == layer):
                    for variant, source in jobs[h].items():
                        if (h, variant) not in todo:
                            continue
                        pats = torch.from_numpy(source.patterns(seqs, handle.causal))
                        edits += [(b, h, variant, pats[b]) for b in range(len(seqs))]
                for chunk in _chunks(edits, rows_cap):
                    got = runner.run(layer, ids, resid.get(layer) if runner.resume else None,
                                     [(b, h[1], p) for b, h, _, p in chunk])[:, :-1].float().cpu()
                    rows = [b for b, _, _, _ in chunk]
                    kl, nb, no, cnt = token_costs(base_logp[rows], got, targets[rows], valid[rows])
                    for r, (b, h, variant, _) in enumerate(chunk):
                        c, w = out[h][variant], batch_idx[b]
                        c.kl[w], c.nll_base[w], c.nll_other[w], c.tokens[w] = (float(kl[r]), float(nb[r]),
                                                                             float(no[r]), int(cnt[r]))
                    bar.update(len(chunk))
            for job in todo:
                state.done[job].add(number)
            state.save()
    bar.close()
    return out, runner.resume


def _whole(handle: ModelHandle, jobs: dict[Head, dict[str, Any]], windows: list[Sequence], batch_size: int,
           progress: bool) -> dict[Head, dict[str, WindowCosts]]:
    """Every swap as its own hybrid forward (backends that ignore pattern edits)."""
    base = BaseDistributions(handle, windows, batch_size)
    out: dict[Head, dict[str, WindowCosts]] = {}
    items = [(h, v, s) for h, vs in jobs.items() for v, s in vs.items()]
    for h, variant, source in tqdm(items, desc="per-head causal cost", unit="swap", disable=not progress):
        with replace_heads(handle, {h: source}) as hybrid:
            out.setdefault(h, {})[variant] = window_costs(base, hybrid)
    return out


def head_costs(model: Any, programs: ProgramSet | ProgramMap, windows: list[Sequence], *,
               which: Seq[str] = ("explanation",), ablation: bool = True, heads: Seq[HeadLike] | None = None,
               reference: list[Sequence] | None = None, batch_size: int = 8, max_bytes: int = 256 << 20,
               seed: int = 0, progress: bool = True, trust_programs: TrustPrograms = False,
               path: str | Path | None = None,
               extra: Mapping[Any, Mapping[str, Any]] | None = None) -> HeadCosts:
    """Swap one head at a time for each kind of program in ``which`` (and, with ``ablation``, its mean pattern over
    ``reference``, default ``windows``) and measure KL(base ‖ swapped) and ΔNLL on ``windows`` (the select split:
    never the windows that judge the result). ``heads`` limits the heads measured; ``extra`` (head → label →
    program) adds candidates measured the same way under their labels (a head's frontier points, refitted programs).
    ``max_bytes`` bounds one forward's logits. With ``path``, each swap's progress is written there after each batch
    of windows and a rerun measures only what is missing (the file is bound to the model, windows and batching, each
    swap to its program's hash). Returns a :class:`HeadCosts` (``.summary(head, variant)``,
    ``.ratio(head, kind)``, ``.order(kind)``)."""
    kinds = tuple(which)
    bad = [k for k in kinds if k not in ("replacement", "explanation")]
    if bad or not kinds:
        raise InputError(f"which must name 'replacement' and/or 'explanation', got {which!r}")
    if not windows:
        raise InputError("head_costs needs windows to measure on (the select split); none were given")
    if not (isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
    handle = load_model(model)
    require_lm_head(handle)
    chosen, texts = _sources(programs, kinds, heads, trust_programs, extra)
    for h in chosen:
        try:
            handle.check_head(*h)
        except IndexError as e:
            raise InputError(f"{Head.label(h)}: {e}") from e
    aliases = _same_programs(chosen)
    cache = TensorCache(max_bytes=256 << 20)
    jobs: dict[Head, dict[str, ProgramHead | MeanPatterns]] = {h: {k: ProgramHead(h[0], h[1], p, cache=cache) for k, p in vs.items() if (h, k) not in aliases}
            for h, vs in chosen.items()}
    if ablation:
        for h, mean in mean_patterns(handle, reference or windows, sorted(jobs)).items():
            jobs[h]["mean"] = mean
    if pattern_edits_take_effect(handle) and handle.causal:
        state = _Progress(path, _fingerprint(handle, windows, reference or windows if ablation else None,
                                             batch_size), jobs, len(windows))
        costs, resumed = _resumed(handle, jobs, windows, batch_size, max_bytes, progress, state)
    else:
        costs, resumed = _whole(handle, jobs, windows, batch_size, progress), False
    for (h, label), measured in aliases.items():  # the same program swapped in: the same numbers
        costs[h][label] = costs[h][measured]
    tokens = int(sum(max(s.n - 1, 0) for s in windows))
    return HeadCosts(len(windows), tokens, costs, texts, resumed, seed)

