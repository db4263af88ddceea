"""refit_mixtures: re-weight a mixture program's components so that the head's output, not its pattern, matches.

A head adds o_i = Σ_j A_ij u_j to the residual stream, where u_j = v_j · W_O^h is key j's value vector through the
head's output matrix. Soft IoU (headsurgeon/synth/metrics.py) rewards mass on the attention sink, whose u_j is small, so a mixture
chosen by IoU can put 98% on ``first()`` and 2% on what the head is for. Here the weights of a root ``Mix``
(headsurgeon/synth/dsl/catalog.py ``_mix``: the weighted sum of the row-normalized components) are chosen again, over the same
components, to minimize Σ_windows Σ_i ‖Σ_k w_k (C_k U)_i − (A U)_i‖² on the non-negative weights that sum to 1.

One hooked forward per batch of windows reads every needed layer's ``hook_pattern`` (A) and ``hook_v`` (V; query head
h reads KV head h // (n_heads // n_kv_heads), as headsurgeon/surgery/swap/hooked_path.py ``_z_hook`` does). For each head the products
D_k = (C_k − A) U of its components (and of position 0, where a component with an empty row attends on its own) are
reduced at once to (K+1)×(K+1) float64 sums, kept apart by which components have a non-empty row, so that both the
fitted objective and the exact error of any weights come from the same sums with no second pass.

The objective above, with C_k each component's pattern on its own (position 0 on its empty rows), is a convex quadratic
on the simplex, minimized exactly (``solve_simplex``). A mixture itself renormalizes each row over its components with
a non-empty row, which the objective matches wherever every component has one; so the weights are then rounded to whole
units of 10**-digits and single units move between components while the mixture's exact error falls. The program is
replaced only when that exact error is lower than the old program's, which is the error reported.

A root ``gate`` splits the query rows by its predicates: each branch is fitted on its own rows (a mixture
reweighted as above, any other branch kept), since a row's output depends on that row's attention alone.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence as Seq

import numpy as np
import torch
from tqdm.auto import tqdm

from ...core import Head, HeadsurgeonError, InputError, WHICHES, HeadLike
from ...kernels.normalize import normalize_scores
from ...synth import dsl
from ...synth.program import Program
from ...synth.programset import ProgramMap, ProgramSet
from ...synth.sequence import Sequence
from ...synth.vocab import Vocabulary, VocabularyError
from ..batches import padded_batch
from ..models.loading import ModelHandle, load_model
from .hybrid import HybridModel
from .simplex import solve_simplex, whole_units

__all__ = ["refit_mixtures", "RefitResult"]

#: an improvement smaller than this share of the target's energy is noise, not a reason to change a program
_TOLERANCE = 1e-12
#: unit moves the rounding search makes at most (each one lowers the exact error)
_MAX_MOVES = 1000


@dataclass
class RefitResult:
    """One head's mixture before and after the refit, with the relative output-space errors on the windows.

    ``weights_before`` are the program's weights as shares (a mixture is scale-free), ``weights_after`` the new ones
    (0 for a dropped component), both aligned with ``components`` (duplicates merged). The errors are
    Σ‖(P − A)U‖² / Σ‖AU‖² of each program's own pattern P; None for a program that is not a mixture (not measured).
    For a gate, ``components`` and the weights list each branch's in turn (a branch that is no mixture: weight 1).
    """

    head: Head
    before: Program
    after: Program
    changed: bool
    weights_before: list[float] = field(default_factory=list)
    weights_after: list[float] = field(default_factory=list)
    components: list[str] = field(default_factory=list)
    error_before: float | None = None
    error_after: float | None = None
    windows: int = 0
    tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record: the head as "L3H5" and the programs as their texts."""
        return {"head": Head.label(self.head), "before": self.before.text, "after": self.after.text,
                "changed": self.changed, "components": list(self.components),
                "weights_before": list(self.weights_before), "weights_after": list(self.weights_after),
                "error_before": self.error_before, "error_after": self.error_after,
                "windows": self.windows, "tokens": self.tokens}


#: the query rows a gate branch holds: each (predicate, whether it holds) on the path from the root gate
BranchPath = tuple[tuple[dsl.Pred, bool], ...]


@dataclass
class _Job:
    """One mixture (a root mixture, or one branch of a root gate on the rows its ``path`` selects): its merged
    components, their shares, and the running sums of its output products."""

    head: Head
    before: Program
    components: list[Program]
    shares: np.ndarray
    path: BranchPath = ()
    sums: dict[int, np.ndarray] = field(default_factory=dict)  # non-empty-component bitmask → (K+1)×(K+1)
    energy: float = 0.0  # Σ‖AU‖² over the visible rows

    @property
    def k(self) -> int:
        return len(self.components)


# ------------------------------------------------------------------------------------------------ public entry


def refit_mixtures(model: Any, programs: ProgramSet | Mapping[Any, Any], windows: list[Sequence],
                   heads: HeadLike | Seq[HeadLike] | None = None, *, which: str = "explanation", batch_size: int = 8,
                   digits: int = 2, progress: bool = True) -> dict[Head, RefitResult]:
    """Refit each chosen head's root mixture (or the mixtures under its root gate, each on its branch's rows) so its
    output matches the head's on ``windows`` (the synth split).

    ``programs``: a ProgramSet (its ``which`` programs) or a mapping head → Program or DSL text; ``heads`` limits
    the heads (default: all of them). A model may be a HybridModel, whose heads then give the targets. New weights are
    rounded to ``digits`` decimals summing to 1; other program shapes come back unchanged. Returns head →
    :class:`RefitResult`; a refit never raises the exact error on ``windows`` (else the program is kept).
    """
    _check_options(which, batch_size, digits, windows)
    call = model if isinstance(model, HybridModel) else None
    handle = call.handle if call is not None else load_model(model)
    _check_windows(handle, windows)
    chosen = _chosen_programs(handle, programs, which, heads)
    jobs = {h: found for h, p in chosen.items() if (found := _jobs(h, p))}
    tokens = int(sum(s.n for s in windows))
    if jobs:
        _check_hooks(handle, sorted({h[0] for h in jobs}))
        _accumulate(handle, call, [job for parts in jobs.values() for job in parts], windows, batch_size, progress)
    out: dict[Head, RefitResult] = {}
    for h in sorted(chosen):
        if h in jobs:
            out[h] = _finish(h, chosen[h], jobs[h], digits, len(windows), tokens)
        else:
            out[h] = RefitResult(h, chosen[h], chosen[h], False, windows=len(windows), tokens=tokens)
    return out


# ------------------------------------------------------------------------------------------------ inputs


def _check_options(which: Any, batch_size: Any, digits: Any, windows: Any) -> None:
    """Refuse settings the refit cannot use, each with what to pass instead."""
    if which not in WHICHES:
        raise InputError(f"which must be 'replacement' or 'explanation', got {which!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be a whole number of windows >= 1 (e.g. 8), got {batch_size!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 9:
        raise InputError(f"digits must be a whole number of decimals from 1 to 9 (e.g. 2), got {digits!r}")
    if not windows:
        raise InputError("refit_mixtures needs training windows (the synth split of load_corpus); none were given")


def _check_windows(handle: ModelHandle, windows: list[Sequence]) -> None:
    """Windows must be non-empty Sequences the model can take whole."""
    if not all(isinstance(s, Sequence) and s.n >= 1 for s in windows):
        raise InputError("windows must be non-empty Sequences (e.g. hs.load_corpus(model, path)['synth'])")
    longest = max(s.n for s in windows)
    if longest > handle.n_ctx:
        raise InputError(f"a window of {longest} tokens exceeds {handle.name}'s context ({handle.n_ctx}); "
                         "make windows with max_len <= n_ctx")


def _head(key: HeadLike) -> Head:
    """A head key as (layer, head), or an InputError saying how to write one."""
    try:
        return Head.parse(key)
    except HeadsurgeonError as e:
        raise InputError(str(e)) from e


def _as_program(value: Any, head: Head) -> Program:
    """A Program from a Program, DSL text or DSL tree."""
    if isinstance(value, Program):
        return value
    if isinstance(value, str):
        return Program.parse(value)
    if dsl.is_node(value):
        return Program.from_node(value)
    raise InputError(f"{Head.label(head)}: expected a Program or DSL text, got {type(value).__name__}")


def _chosen_programs(handle: ModelHandle, programs: ProgramSet | ProgramMap, which: str,
                     heads: HeadLike | Seq[HeadLike] | None) -> dict[Head, Program]:
    """head → Program of kind ``which`` for the heads asked, each checked against the model."""
    kind = f"{which} program" if isinstance(programs, ProgramSet) else "program"
    if isinstance(programs, ProgramSet):
        _check_vocabulary(handle, programs)
        available = dict(programs.programs(which))
    elif isinstance(programs, Mapping):
        available = {}
        for key, value in programs.items():
            h = _head(key)
            if h in available:
                raise InputError(f"head {Head.label(h)} is given twice ({key!r}); keep one program per head")
            available[h] = _as_program(value, h)
    else:
        raise InputError(f"programs must be a ProgramSet or a mapping head → program, got {type(programs).__name__}")
    asked: Seq[Any] | None = heads  # type: ignore[assignment]  # one head or several, told apart here
    if isinstance(heads, str) or (isinstance(heads, tuple) and len(heads) == 2 and all(
            isinstance(x, int) for x in heads)):
        asked = [heads]  # one head, "L3H5" or (3, 5)
    wanted = sorted(available) if asked is None else sorted({_head(h) for h in asked})
    missing = [h for h in wanted if h not in available]
    if missing:
        raise InputError(f"no {kind} for {', '.join(Head.label(h) for h in missing[:20])}; refit heads that have "
                         f"one (heads=None refits all {len(available)})")
    for h in wanted:
        try:
            handle.check_head(*h)
        except IndexError as e:
            raise InputError(f"{Head.label(h)}: {e}") from e
    return {h: available[h] for h in wanted}


def _check_vocabulary(handle: ModelHandle, programs: ProgramSet) -> None:
    """Token ids in a program set mean the tokens of the tokenizer it was selected with (headsurgeon/surgery/swap/replace.py)."""
    if programs.vocab_fingerprint and handle.tokenizer is not None:
        try:
            Vocabulary.from_tokenizer(handle.tokenizer).check(programs.vocab_fingerprint)
        except VocabularyError as e:
            raise InputError(f"{handle.name}'s tokenizer is not the one this program set was selected with: {e}") from e


def _check_hooks(handle: ModelHandle, layers: list[int]) -> None:
    """The refit reads each layer's pattern, values and output matrix; refuse a model without them."""
    points = getattr(handle.model, "hook_dict", None) or {}
    absent = [name for layer in layers for name in (f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_v")
              if name not in points]
    if absent:
        raise InputError(f"{handle.name} has no hook point {absent[0]}: the refit reads each layer's attention "
                         "pattern and values; load the model with hs.load_model (eager attention)")


def _jobs(head: Head, program: Program) -> list[_Job]:
    """The refit jobs of a root mixture (one) or of a root gate (one per branch, on its rows) that holds a mixture
    somewhere; none for any other program."""
    if not program.has_tree:
        return []
    if isinstance(program.node, dsl.Mix):
        return [_job(head, program, program.node, ())]
    if not isinstance(program.node, dsl.Gate):
        return []
    leaves = list(_branches(program.node, ()))
    if not any(isinstance(node, dsl.Mix) for node, _ in leaves):
        return []
    return [_job(head, program, node, path) for node, path in leaves]


def _branches(node: Any, path: BranchPath) -> Any:
    """(branch, path) for every branch under nested gates, then-branches first."""
    if isinstance(node, dsl.Gate):
        yield from _branches(node.then, (*path, (node.pred, True)))
        yield from _branches(node.other, (*path, (node.pred, False)))
    else:
        yield node, path


def _job(head: Head, program: Program, node: Any, path: BranchPath) -> _Job:
    """One branch's job: a mixture's components (duplicates merged) and shares, or any other node as one component."""
    if not isinstance(node, dsl.Mix):
        return _Job(head, program, [Program.from_node(node)], np.ones(1), path)
    components: list[Program] = []
    shares: list[float] = []
    total = sum(float(w) for w, _ in node.terms)
    for w, term in node.terms:
        part = Program.from_node(term)
        if part in components:
            shares[components.index(part)] += float(w) / total
        else:
            components.append(part)
            shares.append(float(w) / total)
    return _Job(head, program, components, np.array(shares, dtype=np.float64), path)


# ------------------------------------------------------------------------------------------------ one pass


def _output_matrix(handle: ModelHandle, layer: int) -> torch.Tensor:
    """W_O of ``layer`` as float64 [n_heads, d_head, d_model] on the model's device."""
    try:
        w_o = handle.model.blocks[layer].attn.W_O
    except (AttributeError, IndexError, TypeError) as e:
        raise InputError(f"{handle.name}: no output matrix blocks[{layer}].attn.W_O; the refit needs a "
                         "TransformerLens model (load it with hs.load_model)") from e
    want = (handle.n_heads, handle.d_head, handle.d_model)
    if tuple(w_o.shape) != want:
        raise InputError(f"{handle.name}: blocks[{layer}].attn.W_O has shape {tuple(w_o.shape)}, expected {want} "
                         "(n_heads, d_head, d_model)")
    return w_o.detach().to(torch.float64)


class _Components:
    """Each component's own pattern C (float64, on the device) and its non-empty rows, once per batch."""

    def __init__(self, sequences: list[Sequence], causal: bool, device: torch.device) -> None:
        self.sequences, self.causal, self.device = sequences, causal, device
        self.lengths = np.array([s.n for s in sequences], dtype=np.int64)
        self.seen: dict[Program, tuple[torch.Tensor, torch.Tensor]] = {}
        self.rows: dict[dsl.Pred, torch.Tensor] = {}

    def get(self, program: Program) -> tuple[torch.Tensor, torch.Tensor]:
        """(C [B, N, N], non-empty [B, N]): C as the component alone gives it (headsurgeon/kernels/normalize.py), non-empty
        as a mixture sees the row (headsurgeon/kernels/primitives/combinators.py ``mix_scale``: positive raw mass)."""
        if program not in self.seen:
            raw = np.ascontiguousarray(program.evaluate_scores(self.sequences, self.causal), dtype=np.float32)
            nonempty = raw.sum(axis=-1, dtype=np.float64) > 0.0
            pattern = normalize_scores(raw, self.lengths, self.causal)
            self.seen[program] = (torch.from_numpy(pattern).to(self.device, torch.float64),
                                  torch.from_numpy(nonempty).to(self.device))
        return self.seen[program]

    def path_rows(self, path: BranchPath) -> torch.Tensor | None:
        """[B, N] the query rows a gate branch holds (None: every row): each predicate read as the gate reads it,
        through ``gate(pred, self(), none())``, whose raw diagonal is 1 exactly where the predicate holds."""
        out = None
        for pred, holds in path:
            if pred not in self.rows:
                probe = Program.from_node(dsl.Gate(pred, dsl.parse("self()"), dsl.parse("none()")))
                raw = probe.evaluate_scores(self.sequences, self.causal)
                diagonal = np.diagonal(raw, axis1=1, axis2=2) > 0
                self.rows[pred] = torch.from_numpy(np.ascontiguousarray(diagonal)).to(self.device)
            rows = self.rows[pred] if holds else ~self.rows[pred]
            out = rows if out is None else out & rows
        return out


def _accumulate(handle: ModelHandle, call: HybridModel | None, jobs: list[_Job], windows: list[Sequence],
                batch_size: int, progress: bool) -> None:
    """One hooked forward per batch of length-sorted windows; each head's sums grow as its layer runs."""
    by_layer: dict[int, list[_Job]] = {}
    for job in jobs:
        by_layer.setdefault(job.head[0], []).append(job)
    w_o = {layer: _output_matrix(handle, layer).to(handle.device) for layer in by_layer}
    order = sorted(range(len(windows)), key=lambda i: windows[i].n)  # similar lengths → little padding
    batches = [[windows[i] for i in order[s: s + batch_size]] for s in range(0, len(order), batch_size)]
    for seqs in tqdm(batches, desc="refit mixtures", unit="batch", disable=not progress):
        comps = _Components(seqs, handle.causal, handle.device)
        visible = torch.arange(max(s.n for s in seqs))[None, :] < torch.tensor([s.n for s in seqs])[:, None]
        _hooked_forward(handle, call, seqs, sorted(by_layer),
                        _layer_sums(handle, by_layer, w_o, comps, visible.to(handle.device)))


def _layer_sums(handle: ModelHandle, by_layer: dict[int, list[_Job]], w_o: dict[int, torch.Tensor],
                comps: _Components, visible: torch.Tensor) -> Callable[[int, torch.Tensor, torch.Tensor], None]:
    """What a layer's hooks do with its pattern and values: add the batch to each of the layer's heads."""
    def take(layer: int, pattern: torch.Tensor, v: torch.Tensor) -> None:
        for job in by_layer[layer]:
            _add_batch(handle, job, pattern[:, job.head[1]], v, w_o[layer][job.head[1]], comps,
                       visible.to(pattern.device))
    return take


def _hooked_forward(handle: ModelHandle, call: HybridModel | None, sequences: list[Sequence], layers: list[int],
                    take: Callable[[int, torch.Tensor, torch.Tensor], None]) -> None:
    """One forward under no_grad handing each layer's (pattern [B, H, N, N], v) to ``take`` as soon as both fired."""
    ids, mask = padded_batch(sequences)
    pending: dict[int, dict[str, torch.Tensor]] = {layer: {} for layer in layers}
    done: set[int] = set()

    def make_hook(layer: int, kind: str) -> Callable[..., torch.Tensor]:
        def hook(tensor: torch.Tensor, hook: Any = None) -> torch.Tensor:
            got = pending[layer]
            got[kind] = tensor.detach()
            if "pattern" in got and "v" in got:
                take(layer, got.pop("pattern"), got.pop("v"))
                done.add(layer)
            return tensor
        return hook

    hooks = [(f"blocks.{layer}.attn.hook_{kind}", make_hook(layer, kind))
             for layer in layers for kind in ("v", "pattern")]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if call is None:
            kwargs = {} if handle.causal else {"attention_mask": mask.to(handle.device)}  # right padding: causal-safe
            handle.model.run_with_hooks(ids.to(handle.device), fwd_hooks=hooks, **kwargs)
        else:  # a hybrid: its own hooks run first, so these see the patterns its heads use (headsurgeon/surgery/patterns/capture.py)
            points = handle.model.hook_dict
            call.register_sequences(sequences)
            removers = [points[name].register_forward_hook(lambda m, i, o, f=fn: f(o)) for name, fn in hooks]
            try:
                call(ids, attention_mask=mask)
            finally:
                for remover in removers:
                    remover.remove()
    if done != set(layers):
        raise InputError(f"{handle.name}: the pattern and value hooks fired for layers {sorted(done)} only, expected "
                         f"{layers}; load the model with eager attention (hs.load_model)")


def _values(handle: ModelHandle, v: torch.Tensor, head: int) -> torch.Tensor:
    """Query head ``head``'s value vectors [B, N, d_head]: its KV group's (GQA) from hook_v."""
    v4 = v if v.ndim == 4 else v.reshape(v.shape[0], v.shape[1], -1, handle.d_head)  # raw hooks see [b, pos, kv*d]
    return v4[:, :, head // (handle.n_heads // v4.shape[2])]


def _add_batch(handle: ModelHandle, job: _Job, pattern: torch.Tensor, v: torch.Tensor, w_o: torch.Tensor,
               comps: _Components, visible: torch.Tensor) -> None:
    """Add one batch's (C_k − A)U products of one head to its sums, grouped by which components have a row."""
    branch = comps.path_rows(job.path)
    if branch is not None:
        visible = visible & branch
    u = _values(handle, v, job.head[1]).to(torch.float64) @ w_o  # [B, N, d_model]
    target = pattern.to(torch.float64) @ u
    k = job.k
    diffs = torch.empty((k + 1, *u.shape), dtype=torch.float64, device=u.device)  # one product per component
    code = torch.zeros(visible.shape, dtype=torch.int64, device=u.device)
    for index, component in enumerate(job.components):
        c, nonempty = comps.get(component)
        torch.matmul(c, u, out=diffs[index])
        diffs[index] -= target
        code |= nonempty.to(torch.int64) << index
    diffs[k] = u[:, :1] - target  # position 0: what a row with no non-empty component attends to
    flat = diffs.reshape(k + 1, -1, u.shape[-1])
    rows, codes = visible.reshape(-1), code.reshape(-1)
    for value in torch.unique(codes[rows]).tolist():
        chosen = flat[:, rows & (codes == value)].reshape(k + 1, -1)
        gram = (chosen @ chosen.T).cpu().numpy()
        job.sums[value] = job.sums.get(value, 0.0) + gram
    job.energy += float((target[visible] ** 2).sum())


# ------------------------------------------------------------------------------------------------ the fit


def _exact_error(job: _Job, weights: np.ndarray) -> float:
    """Σ‖(P − A)U‖² of the mixture with ``weights``: each row renormalizes over its non-empty components of positive
    weight (headsurgeon/synth/dsl/catalog.py ``_mix``), and a row with none attends to position 0."""
    k = job.k
    total = 0.0
    for value, gram in job.sums.items():
        members = [i for i in range(k) if value >> i & 1 and weights[i] > 0]
        mass = float(sum(weights[i] for i in members))
        if mass <= 0.0:
            total += float(gram[k, k])
            continue
        share = np.array([weights[i] / mass for i in members])
        total += float(share @ gram[np.ix_(members, members)] @ share)
    return max(total, 0.0)


def _fit_matrix(job: _Job) -> np.ndarray:
    """Q with wᵀQw = Σ_rows ‖Σ_k w_k (C_k − A)U‖² for Σw = 1 (C_k each component's own pattern: position 0 on its
    empty rows)."""
    k = job.k
    q = np.zeros((k, k), dtype=np.float64)
    for value, gram in job.sums.items():
        to_slot = np.zeros((k + 1, k), dtype=np.float64)  # component → the row's product it contributes
        for i in range(k):
            to_slot[i if value >> i & 1 else k, i] = 1.0
        q += to_slot.T @ gram @ to_slot
    return (q + q.T) / 2.0


def _descend(job: _Job, units: np.ndarray, digits: int) -> np.ndarray:
    """Move single units between components while that lowers the exact error (rounding, and rows where a mixture
    renormalizes over fewer components, make it differ from the fitted objective)."""
    whole = 10 ** digits
    best = _exact_error(job, units / whole)
    floor = _TOLERANCE * max(job.energy, 1e-300)
    for _ in range(_MAX_MOVES):
        move = None
        for i in np.flatnonzero(units > 0):
            for j in range(job.k):
                if j == i:
                    continue
                trial = units.copy()
                trial[i] -= 1
                trial[j] += 1
                error = _exact_error(job, trial / whole)
                if error < best - floor:
                    best, move = error, trial
        if move is None:
            break
        units = move
    return units


def _build(components: list[Program], units: np.ndarray, digits: int) -> Program:
    """The mixture of the components with a positive number of units, or the one component alone."""
    terms = [(int(n) / 10 ** digits, c.node) for n, c in zip(units, components) if n > 0]
    if len(terms) == 1:
        return Program.from_node(terms[0][1])
    return Program.from_node(dsl.validate(dsl.make_mix(terms)))


def _relative(error: float, energy: float) -> float:
    """Σ‖e‖² / Σ‖AU‖²; with no target energy, 0 for no error and inf otherwise."""
    if energy > 0.0:
        return error / energy
    return 0.0 if error <= 0.0 else math.inf


def _finish(head: Head, before: Program, jobs: list[_Job], digits: int, windows: int, tokens: int) -> RefitResult:
    """Solve each branch, round, and keep the program unless the new weights lower its exact error."""
    fitted = [_descend(job, whole_units(solve_simplex(_fit_matrix(job)), digits), digits) for job in jobs]
    olds = [_exact_error(job, job.shares) for job in jobs]
    news = [_exact_error(job, units / 10 ** digits) for job, units in zip(jobs, fitted)]
    leaves = [_build(job.components, units, digits) if new < old else Program.from_node(_leaf(job))
              for job, units, old, new in zip(jobs, fitted, olds, news)]
    error_before, error_after = sum(olds), sum(min(o, n) for o, n in zip(olds, news))
    energy = sum(job.energy for job in jobs)
    candidate = _assemble(before, leaves)
    changed = error_after < error_before - _TOLERANCE * max(energy, 1e-300) and candidate != before
    shares = [float(w) for job in jobs for w in job.shares]
    new = [float(w) for job, units, o, n in zip(jobs, fitted, olds, news)
           for w in (units / 10 ** digits if n < o else job.shares)]
    if not changed:
        candidate, new, error_after = before, shares, error_before
    return RefitResult(head, before, candidate, changed, shares, new,
                       [c.text for job in jobs for c in job.components], _relative(error_before, energy),
                       _relative(error_after, energy), windows, tokens)


def _leaf(job: _Job) -> Any:
    """The branch node a job was made from, unchanged."""
    node = job.before.node
    for pred, holds in job.path:
        assert isinstance(node, dsl.Gate) and node.pred == pred
        node = node.then if holds else node.other
    return node


def _assemble(before: Program, leaves: list[Program]) -> Program:
    """``before`` with its branches (or its root mixture) replaced by ``leaves``, in ``_branches`` order."""
    if not isinstance(before.node, dsl.Gate):
        return leaves[0]
    remaining = iter(leaves)

    def rebuild(node: Any) -> Any:
        if isinstance(node, dsl.Gate):
            return dsl.Gate(node.pred, rebuild(node.then), rebuild(node.other))
        return next(remaining).node

    return Program.from_node(dsl.validate(rebuild(before.node)))
