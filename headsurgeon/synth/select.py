"""One selection over all sources: every searcher's candidates (plus a user library and baselines) compete
per head by soft IoU on ``select``; the winners are reported on ``test`` (never on the sequences they were chosen on).

Per head selection keeps a frontier, so a reader can trade faithfulness for length: the best candidate at each
character budget of ``BUDGETS`` (``program.chars(vocab)``), the **explanation** (best with at most ``READABLE_CHARS`` characters) and the
**replacement** (best at any size, as proposed). For the bounded budgets the leading candidates' float
literals are first rounded to 2 significant digits (``dsl.round_numbers``) when that moves select IoU by at
most ``ROUND_TOLERANCE``, else 3, then 4 digits, else they stay as proposed.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, TypeGuard, cast

import numpy as np
from tqdm.auto import tqdm

from ..kernels.cache import TensorCache
from ..core import METRICS, SELECT_BY, WEIGHTED_METRICS, Head, InputError, SelectBy, Split, check_choice
from . import dsl
from .errors import ProgramExecutionError
from ..core.scores import Scores
from .metrics import score_many
from .program import BUDGETS, READABLE_CHARS, Program
from .programset import Entry, ProgramSet
from .runcache import PatternCache
from .scored import ScoredProgram
from .tensors import program_rows
from .sink_terms import cores_of, side_term_programs
from .splits import StoreSplits, SplitsLike
from .weighted import score_weighted
from ..core.vocabulary import TokenVocabulary

if TYPE_CHECKING:  # the searchers import this module (headsurgeon/synth/search/library.py)
    from .search.base import PatternSource, ValueNormSource

BASELINES = ("first()", "self()", "prev(1)", "uniform()")
ROUND_DIGITS = (2, 3, 4)
ROUND_TOLERANCE = 0.005
SIDE_CORES = 8  # per head, the candidates (in the searchers' order) whose cores get the sink as a side term
CONTENDERS = 3  # per bounded budget, the best candidates (by select IoU as proposed) whose rounding is tried


def weighs(store: object) -> TypeGuard[ValueNormSource]:
    """Whether ``store`` holds value norms, so value-weighted scores can be measured (headsurgeon/surgery/patterns/value_norms.py)."""
    return bool(getattr(store, "has_value_norms", False))


def score_programs(store: PatternSource, heads: Sequence[tuple[int, int]], programs: list[Program], indices: list[int],
                   cache: PatternCache | None = None, chunk: int = 64) -> dict[str, np.ndarray]:
    """IoU / JSD / top-q IoU of every head × program over store sequences ``indices`` → arrays [H, P], and the
    value-weighted IoU / JSD (headsurgeon/synth/weighted.py) when the store holds value norms.

    Sparse programs are scored from their compressed rows (``program_rows``), never densified.
    """
    if not indices:
        raise InputError("cannot score on an empty split")
    metrics = METRICS + (WEIGHTED_METRICS if weighs(store) else ())
    totals = {m: np.zeros((len(heads), len(programs))) for m in metrics}
    seqs = [store.sequences[i] for i in indices]
    for start in range(0, len(indices), chunk):
        idx = indices[start: start + chunk]
        real, lengths = store.batch(idx, heads)
        cand = program_rows(programs, seqs[start: start + chunk], causal=store.causal, cache=cache)
        got = score_many(real, cand, lengths, store.causal)
        if weighs(store):
            got.update(score_weighted(real, cand, lengths, store.causal, store.norm_batch(idx, heads)))
        for m in totals:
            totals[m] += got[m] * len(idx)
    return {m: v / len(indices) for m, v in totals.items()}


def _pair_blocks(heads: list[tuple[int, int]], pool: dict[tuple[int, int], list[ScoredProgram]], column: dict[str, int],
                 step: int = 32) -> list[tuple[list[int], list[int]]]:
    """(head rows, program columns) blocks covering every pair a head considers, and few others.

    Programs that the same heads consider are scored together (the baselines: all heads; a searcher's proposal:
    usually its own head), so the metric work grows with the pairs needed, not with heads x programs.
    """
    users: dict[int, list[int]] = {}
    for r, h in enumerate(heads):
        for c in dict.fromkeys(column[c.program.hash] for c in pool[h]):
            users.setdefault(c, []).append(r)
    groups: dict[tuple[int, ...], list[int]] = {}
    for c in sorted(users):
        groups.setdefault(tuple(users[c]), []).append(c)
    return [(list(rows), cols[i: i + step]) for rows, cols in groups.items() for i in range(0, len(cols), step)]


def _key(scores: dict[str, float], by: SelectBy = "iou") -> tuple[float, float]:
    """The ``by`` metric best first (IoUs descending, distances ascending), then JSD ascending (NaN ranks last)."""
    first = scores.get(by, float("nan"))
    first = -first if by.endswith("jsd") else first
    jsd = scores.get("jsd", float("nan"))
    return (first if first == first else float("-inf"), -jsd if jsd == jsd else float("-inf"))


def selection_metric(store: PatternSource, select_by: str) -> SelectBy:
    """``select_by`` checked; a value-weighted one on a store without value norms falls back to IoU with a warning."""
    by = check_choice(select_by, SELECT_BY, "select_by")
    if by in WEIGHTED_METRICS and not weighs(store):
        warnings.warn(f"select_by={by!r} needs value norms, which this store lacks (captured before they were kept, "
                      "or with value_norms=False); selecting by soft IoU instead. Capture again to weigh by what "
                      "heads move", stacklevel=3)
        return "iou"
    return by  # type: ignore[return-value]  # checked against SELECT_BY above


def rounded(program: Program, digits: int) -> Program | None:
    """``program`` with float literals rounded to ``digits`` significant digits (None: unchanged or unavailable).

    Uses ``dsl.round_numbers(node, digits)`` when the DSL provides it (headsurgeon/synth/dsl/); other kinds are never rounded.
    """
    fn = getattr(dsl, "round_numbers", None)
    if fn is None or not program.has_tree:
        return None
    try:
        out = Program.from_node(fn(program.node, digits))
    except Exception:  # a rounding the DSL refuses (e.g. a weight rounded to 0) leaves the program as proposed
        return None
    return None if out == program else out


def _score1(store: PatternSource, head: Head, programs: list[Program], idx: list[int], cache: PatternCache) -> list[dict]:
    """Scores of ``programs`` for one head on ``idx``: one {"iou", "jsd", "topq"} (and the value-weighted ones when
    the store has norms) per program."""
    if not programs:
        return []
    try:
        got = score_programs(store, [head], programs, idx, cache)
    except ProgramExecutionError:
        if len(programs) == 1:  # a Python program that fails on these windows scores nothing here
            return [{m: float("nan") for m in METRICS + (WEIGHTED_METRICS if weighs(store) else ())}]
        return [s for p in programs for s in _score1(store, head, [p], idx, cache)]
    return [{m: float(got[m][0, j]) for m in got} for j in range(len(programs))]


def _round_contenders(store: PatternSource, head: Head, options: list[ScoredProgram], select_idx: list[int], cache: PatternCache,
                      chars_of: Any, budgets: list[int], memo: dict, by: SelectBy = "iou") -> None:
    """Round the leading options (select scores only) of each bounded budget in place, keeping the ``by`` metric
    within ROUND_TOLERANCE."""
    def rounded_memo(p: Program, digits: int) -> Program | None:
        if (p.hash, digits) not in memo:  # the same program is often proposed for many heads
            memo[p.hash, digits] = rounded(p, digits)
        return memo[p.hash, digits]

    top = max(budgets)  # rounding keeps a program's size, so one too big for every budget is not rounded
    shortest = {id(o): chars_of(o.program if o.program.size > top else rounded_memo(o.program, ROUND_DIGITS[0])
                                or o.program) for o in options}
    todo: dict[int, ScoredProgram] = {}
    for b in budgets:
        fits = sorted((o for o in options if shortest[id(o)] <= b), key=lambda o: _key(o.scores["select"], by),
                      reverse=True)
        todo.update({id(o): o for o in fits[:CONTENDERS]})
    pending = [o for o in todo.values() if o.program.has_tree]
    for digits in ROUND_DIGITS:
        tries = [(o, p) for o in pending if (p := rounded_memo(o.program, digits)) is not None]
        pending = []
        for (o, p), sel in zip(tries, _score1(store, head, [p for _, p in tries], select_idx, cache)):
            if abs(sel[by] - o.scores["select"][by]) <= ROUND_TOLERANCE:
                o.program, o.digits = p, digits
                o.scores["select"] = sel
            else:
                pending.append(o)


def _choose(options: list[ScoredProgram], budget: int | None, chars_of: Any,
            by: SelectBy = "iou") -> ScoredProgram | None:
    """The best option by ``by`` whose text fits ``budget`` characters (None: any)."""
    fits = [o for o in options if budget is None or chars_of(o.program) <= budget]
    return max(fits, key=lambda o: _key(o.scores["select"], by)) if fits else None


def _store_splits(splits: SplitsLike | list[int] | None, test_idx: Any, synth_idx: Any, select_idx: Any) -> StoreSplits:
    """``splits`` whole; or, in select_programs' former form, the separate index lists (with a DeprecationWarning)."""
    loose = {"test_idx": test_idx, "synth_idx": synth_idx, "select_idx": select_idx}
    whole = isinstance(splits, (StoreSplits, Mapping)) or hasattr(splits, "indices")
    if whole:
        given = [name for name, v in loose.items() if v is not None]
        if given:
            raise InputError(f"select_programs got splits and {', '.join(given)} beside them: pass the splits whole "
                             "(StoreSplits(synth, select, test), headsurgeon/synth/splits.py) and drop the index lists")
        return StoreSplits.of(cast(SplitsLike, splits))  # hasattr does not narrow for the checker
    select = cast("list[int] | None", select_idx if splits is None else splits)  # the former form's index list
    if select is None or test_idx is None:
        raise InputError("select_programs needs the splits: select_programs(store, candidates, "
                         "StoreSplits(synth, select, test)) (headsurgeon/synth/splits.py), or a corpus Splits")
    warnings.warn("select_programs(store, candidates, select_idx, test_idx, synth_idx=...) is deprecated: pass the "
                  "splits whole, select_programs(store, candidates, StoreSplits(synth, select, test))",
                  DeprecationWarning, stacklevel=3)
    return StoreSplits(synth_idx or (), select, test_idx)


def select_programs(store: PatternSource, candidates: dict[tuple[int, int], list[ScoredProgram]], splits: SplitsLike | list[int] | None = None,
                    test_idx: list[int] | None = None, synth_idx: list[int] | None = None,
                    library: Iterable[Program | str] = (), baselines: bool = True,
                    cache: PatternCache | None = None, progress: bool = True, model: str = "",
                    vocab: TokenVocabulary | None = None, budgets: tuple[int | None, ...] = BUDGETS,
                    select_by: SelectBy = "iou", side_terms: bool | None = None,
                    select_idx: list[int] | None = None) -> ProgramSet:
    """Pick per head the best candidate on ``splits.select`` (by ``select_by``, ties: lower JSD) at each budget; score
    them on ``splits.test`` (and ``splits.synth`` when it has windows).

    ``splits``: a :class:`StoreSplits` (headsurgeon/synth/splits.py), a corpus ``Splits`` or a mapping of split name →
    store indices. The former form, separate ``select_idx``, ``test_idx`` and ``synth_idx`` lists, still works with a
    DeprecationWarning.

    ``select_by``: ``"iou"`` (soft IoU), ``"vw_iou"`` / ``"vw_jsd"`` (value-weighted, headsurgeon/synth/weighted.py: needs a
    store with value norms, else IoU with a warning) or ``"jsd"``. Value-weighted scores are reported whenever the
    store has norms. ``side_terms`` (default: when selecting by a value-weighted metric) adds, per head, the cores of
    its first ``SIDE_CORES`` candidates with the sink as a side term (headsurgeon/synth/sink_terms.py).

    ``library`` programs (and, with ``baselines``, a few templates) compete for every head. ``vocab`` (a
    ``Vocabulary``) renders programs in token strings: budgets count those characters, and the set records
    its fingerprint. The replacement is the best candidate at any size; the explanation the best of at most
    ``READABLE_CHARS`` characters (after rounding, see the module docstring).
    """
    parts = _store_splits(splits, test_idx, synth_idx, select_idx)
    select_idx, test_idx, synth_idx = parts["select"], parts["test"], parts["synth"]
    if set(select_idx) & set(test_idx):
        raise InputError("select and test share sequences; selection and reporting must use disjoint splits")
    by = selection_metric(store, select_by)
    cache = cache if cache is not None else TensorCache(max_bytes=512 << 20)
    heads = sorted(set(candidates) | set(getattr(store, "heads", [])))
    extra = [p if isinstance(p, Program) else Program.parse(p) for p in library]
    extra_src = ["library"] * len(extra)
    if baselines:
        extra += [Program.parse(t) for t in BASELINES]
        extra_src += ["baseline"] * len(BASELINES)
    side = by in WEIGHTED_METRICS if side_terms is None else bool(side_terms)
    pool: dict[tuple[int, int], list[ScoredProgram]] = {}
    for h in heads:
        mine = list(candidates.get(h, []))
        seen = {c.program.hash for c in mine}
        sides = side_term_programs(cores_of([c.program for c in mine[:SIDE_CORES]])) if side else []
        for p, src in [*zip(extra, extra_src), *((p, "sink-side") for p in sides)]:
            if p.hash not in seen:
                mine.append(ScoredProgram(p, src))
                seen.add(p.hash)
        pool[h] = mine
    # score every distinct program once against the heads that consider it (select split)
    programs = list({c.program.hash: c.program for cs in pool.values() for c in cs}.values())
    column = {p.hash: i for i, p in enumerate(programs)}
    measured = METRICS + (WEIGHTED_METRICS if weighs(store) else ())
    sel = {m: np.full((len(heads), len(programs)), np.nan) for m in measured}
    for rows, cols in tqdm(_pair_blocks(heads, pool, column), desc="select", disable=not progress):
        got = score_programs(store, [heads[r] for r in rows], [programs[c] for c in cols], select_idx, cache)
        for m in sel:
            sel[m][np.ix_(rows, cols)] = got[m]
    entries: dict[Head, Entry] = {}
    chars_cache: dict[str, int] = {}
    round_memo: dict[tuple[str, int], Program | None] = {}

    bounded = sorted({b for b in budgets if b is not None} | {READABLE_CHARS})

    def chars_of(p: Program) -> int:
        if p.hash not in chars_cache:  # too big for every bounded budget: its size bounds its characters below
            chars_cache[p.hash] = p.size if p.size > bounded[-1] else p.chars(vocab)
        return chars_cache[p.hash]

    for r, h in enumerate(tqdm(heads, desc="frontier", disable=not progress)):
        for c in pool[h]:
            col = column[c.program.hash]
            c.scores.merge("select", {m: float(sel[m][r, col]) for m in measured})
        if not pool[h]:
            continue
        winner = max(pool[h], key=lambda c: _key(c.scores["select"], by))  # the replacement: as proposed, any size
        # each candidate as compared at the bounded budgets: its select scores, possibly rounded
        options = [ScoredProgram(c.program, c.source, {"select": c.scores["select"]}, c.hypothesis) for c in pool[h]]
        _round_contenders(store, h, options, select_idx, cache, chars_of, bounded, round_memo, by)
        picks = {b: _choose(options, b, chars_of, by) for b in bounded}
        # score every kept program on test (and synth when given)
        kept = list({p.hash: p for p in [winner.program] + [o.program for o in picks.values() if o]}.values())
        found = {p.hash: Scores(select={}) for p in kept}
        for o in [o for o in picks.values() if o]:
            found[o.program.hash]["select"] = dict(o.scores["select"])
        found[winner.program.hash]["select"] = dict(winner.scores["select"])
        reported: dict[Split, Sequence[int]] = {"test": test_idx, "synth": synth_idx}
        for split, idx in reported.items():
            if idx:
                for p, got in zip(kept, _score1(store, h, kept, list(idx), cache)):
                    found[p.hash][split] = got
        for split in reported:
            if split in found[winner.program.hash]:
                winner.scores.merge(split, found[winner.program.hash][split])

        def choice(o: ScoredProgram | None, budget: int | None, winner: ScoredProgram = winner,
                   found: dict = found) -> ScoredProgram | None:
            if o is None:
                return None
            # a program tied with the winner (e.g. a baseline beside a user's labelled library program) keeps its label
            tied = _key(o.scores["select"], by) == _key(winner.scores["select"], by)
            return ScoredProgram.of(o.program, o.source, found[o.program.hash], vocab,
                                    o.hypothesis or (winner.hypothesis if tied else ""), budget, o.digits)

        replacement = ScoredProgram.of(winner.program, winner.source, winner.scores, vocab, winner.hypothesis)
        frontier = [choice(picks[b], b) if b is not None else replacement for b in budgets]
        entries[h] = Entry(replacement, choice(picks[READABLE_CHARS], READABLE_CHARS),
                           [c for c in frontier if c is not None])
    return ProgramSet(entries, model=model, meta={"selected_on": "select", "selected_by": by, "sink_side_terms": side,
                                                  "reported_on": "test",
                                                  "n_select": len(select_idx), "n_test": len(test_idx),
                                                  "budgets": list(budgets), "readable_chars": READABLE_CHARS},
                      vocab_fingerprint=getattr(vocab, "fingerprint", None))
