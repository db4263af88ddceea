"""Benchmark: 20 DSL programs on numba kernels vs the same programs as per-sequence Python/numpy functions.

Workload: 1,000 TinyStories sequences (paragraphs of ../shared/data/corpora/tinystories-valid.txt,
tokenized with stories260K's sentencepiece tok512 model, BOS + at most 127 tokens), causal mask.
Feature arrays (word/sentence index, flags; spaCy POS and dependency heads) are computed once before
timing and shared by both sides. Each program is timed side by side in one process:

* numba: ``Program.evaluate(sequences, features=...)`` -> normalized float32 [B, N, N] (padding,
  kernels, combinators, ``normalize_scores``);
* reference: one Python function per program called per sequence (loops over tokens, numpy where the
  reference implementation used it), then a per-sequence numpy normalization (mask, clip, row sums,
  empty rows to BOS), as in the reference implementation.

Both outputs are checked equal (max |diff| printed). Timings: medians over ``--repeats`` interleaved
runs (numba gets a warm-up call first, so compile / cache load is excluded).

EAPS-style section (``bench_eaps``, first 400 sequences): prev(1), first(), window(1, 3), same_token()
(sparse: compressed rows) and decay(0.8), uniform() (dense) through ``synth.tensors.program_rows`` (what
consumers read), on a batch it prepared before, on a new batch and with a warm tensor cache, vs the same programs
written as the seed's (EAPS)
programs are: a Python loop per sequence filling a dense np.zeros matrix, then row-normalized. Then
(``bench_kernels``) the four sparse kernels alone, their specialised builds (one per flag combination,
headsurgeon/kernels/specialise.py) against copies of their earlier flag-branching builds kept in this file, timed side
by side; and the tensor cache's bytes per program (sparse programs are cached packed). CPU time on one
thread (NUMBA_NUM_THREADS=1, torch.set_num_threads(1)).

Second section (``bench_metrics_scoring``): the 20 programs' patterns scored against the 40 real
heads of stories260K (5 layers x 8 query heads) on the first 200 sequences with
``headsurgeon.synth.metrics.score_many`` (IoU + JSD) vs a per-triple numpy loop, with the best
program per head. (Benchmark only: it selects and reports on the same sequences.)

Run: ``python benchmarks/programs.py [--sequences 1000 --repeats 3 --metric-sequences 200]``.

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # CPU time on one thread: set before numba is imported

import numpy as np
from numba import njit

from headsurgeon.synth.program import Program
from headsurgeon.synth.sequence import Sequence

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
TOKENIZER = SHARED / "models" / "stories260K" / "tok512.model"
CHECKPOINT = SHARED / "models" / "stories260K" / "stories260K.bin"
MAX_LEN = 128

BASIC_FEATURES = ["word", "sent", "punct", "cap", "newline", "sent_end", "word_start"]
SPACY_FEATURES = ["pos", "dep_head"]


# ============================================================================ data

def load_sequences(count: int, max_len: int = MAX_LEN) -> tuple[list[Sequence], object]:
    """The first ``count`` TinyStories paragraphs as Sequences: BOS + up to max_len-1 tok512 pieces."""
    import sentencepiece as spm

    if not CORPUS.exists() or not TOKENIZER.exists():
        sys.exit(f"this benchmark needs {CORPUS} and {TOKENIZER} (the ../shared folder beside the checkout)")
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    text = CORPUS.read_text(encoding="utf-8", errors="replace")
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    sequences: list[Sequence] = []
    bos = sp.bos_id()
    for doc, para in enumerate(paragraphs):
        proto = sp.encode(para, return_type="proto")
        pieces = list(proto.pieces)[: max_len - 1]
        if len(pieces) < 3:
            continue
        raw = para.encode("utf-8")
        char_of = np.zeros(len(raw) + 1, dtype=np.int64)  # byte offset -> char offset
        pos = 0
        for ci, ch in enumerate(para):
            width = len(ch.encode("utf-8"))
            char_of[pos: pos + width] = ci
            pos += width
        char_of[len(raw)] = len(para)
        offsets = [(0, 0)] + [(int(char_of[p.begin]), int(char_of[p.end - 1]) + 1 if p.end > p.begin
                               else int(char_of[p.begin])) for p in pieces]
        sequences.append(Sequence(
            ids=np.array([bos] + [p.id for p in pieces]), tokens=[sp.id_to_piece(bos)] + [p.piece for p in pieces],
            text=para, offsets=np.array(offsets), doc=doc, has_bos=True,
        ))
        if len(sequences) == count:
            break
    return sequences, sp


def load_features(sequences: list[Sequence]) -> tuple[dict[str, np.ndarray], bool]:
    """Padded feature arrays for every name the programs use; spaCy ones when the model is installed."""
    from headsurgeon.synth.features import batch_feature_arrays

    feats = batch_feature_arrays(sequences, BASIC_FEATURES)
    try:
        feats.update(batch_feature_arrays(sequences, SPACY_FEATURES))
        return feats, True
    except Exception as e:  # noqa: BLE001 - spaCy model missing: run the programs that do not need it
        print(f"(spaCy features unavailable, dropping POS/dependency programs: {e})")
        return feats, False


# ============================================================================ the reference style
# One function per program, called per sequence with plain lists; loops over tokens like the
# reference implementation's programs. ``s`` holds "ids" and the feature lists of one sequence.

Ref = Callable[[dict], np.ndarray]


def r_prev(k: int) -> Ref:
    def f(s: dict) -> np.ndarray:
        n = len(s["ids"])
        out = np.zeros((n, n))
        for i in range(k, n):
            out[i, i - k] = 1.0
        return out
    return f


def r_self(s: dict) -> np.ndarray:
    return np.eye(len(s["ids"]))


def r_first(s: dict) -> np.ndarray:
    n = len(s["ids"])
    out = np.zeros((n, n))
    out[:, 0] = 1.0
    return out


def r_window(a: int, b: int) -> Ref:
    def f(s: dict) -> np.ndarray:
        n = len(s["ids"])
        out = np.zeros((n, n))
        for i in range(n):
            for d in range(a, b + 1):
                if 0 <= i - d <= i:
                    out[i, i - d] = 1.0
        return out
    return f


def r_decay(rate: float) -> Ref:
    def f(s: dict) -> np.ndarray:
        n = len(s["ids"])
        out = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1):
                out[i, j] = rate ** (i - j)
        return out
    return f


def r_uniform(s: dict) -> np.ndarray:
    n = len(s["ids"])
    return np.tril(np.ones((n, n)))


def r_same_token(s: dict) -> np.ndarray:
    ids = s["ids"]
    n = len(ids)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i):
            if ids[j] == ids[i]:
                out[i, j] = 1.0
    return out


def r_same_token_recent(s: dict) -> np.ndarray:
    ids = s["ids"]
    n = len(ids)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i - 1, -1, -1):
            if ids[j] == ids[i]:
                out[i, j] = 1.0
                break
    return out


def r_induction(s: dict) -> np.ndarray:
    ids = s["ids"]
    n = len(ids)
    out = np.zeros((n, n))
    for i in range(n):
        for p in range(i):
            if ids[p] == ids[i]:
                out[i, p + 1] = 1.0
    return out


def r_key_in_set(keys: set[int]) -> Ref:
    def f(s: dict) -> np.ndarray:
        ids = s["ids"]
        n = len(ids)
        out = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1):
                if ids[j] in keys:
                    out[i, j] = 1.0
        return out
    return f


def r_recent(flag: str) -> Ref:
    def f(s: dict) -> np.ndarray:
        n = len(s["ids"])
        out = np.zeros((n, n))
        for i in range(n):
            for j in range(i, -1, -1):
                if s[flag][j]:
                    out[i, j] = 1.0
                    break
        return out
    return f


def r_group_start(feature: str) -> Ref:
    def f(s: dict) -> np.ndarray:
        g = s[feature]
        n = len(g)
        out = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1):
                if g[j] == g[i]:
                    out[i, j] = 1.0
                    break
        return out
    return f


def r_same_word(s: dict) -> np.ndarray:
    w = s["word"]
    n = len(w)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            if w[j] == w[i]:
                out[i, j] = 1.0
    return out


def r_dep_head(s: dict) -> np.ndarray:
    heads = s["dep_head"]
    n = len(heads)
    out = np.zeros((n, n))
    for i in range(n):
        if 0 <= heads[i] <= i:
            out[i, heads[i]] = 1.0
    return out


def r_match_closest(pairs: set[tuple[int, int]]) -> Ref:
    def f(s: dict) -> np.ndarray:
        ids = s["ids"]
        n = len(ids)
        out = np.zeros((n, n))
        for i in range(n):
            for j in range(i, -1, -1):
                if (ids[i], ids[j]) in pairs:
                    out[i, j] = 1.0
                    break
        return out
    return f


def _rownorm(m: np.ndarray) -> np.ndarray:
    s = m.sum(axis=1, keepdims=True)
    return np.divide(m, s, out=np.zeros_like(m), where=s > 0)


def r_mix(*terms: tuple[float, Ref]) -> Ref:
    def f(s: dict) -> np.ndarray:
        return sum(w * _rownorm(g(s)) for w, g in terms)
    return f


def r_fallback(a: Ref, b: Ref) -> Ref:
    def f(s: dict) -> np.ndarray:
        x, y = a(s), b(s)
        empty = x.sum(axis=1) <= 0
        x[empty] = y[empty]
        return x
    return f


def r_gate(test: Callable[[dict, int], bool], a: Ref, b: Ref) -> Ref:
    def f(s: dict) -> np.ndarray:
        x, y = a(s), b(s)
        for i in range(len(s["ids"])):
            if not test(s, i):
                x[i] = y[i]
        return x
    return f


def r_sharpen(a: Ref, t: float) -> Ref:
    def f(s: dict) -> np.ndarray:
        return _rownorm(a(s) ** t)
    return f


def reference_normalize(scores: np.ndarray) -> np.ndarray:
    """Per-sequence numpy normalization (causal): mask, clip, row-normalize, empty rows to BOS."""
    n = scores.shape[0]
    if not np.isfinite(scores).all():
        raise ValueError("non-finite scores")
    m = np.tril(np.clip(scores, 0, None))
    s = m.sum(axis=1, keepdims=True)
    out = np.divide(m, s, out=np.zeros_like(m), where=s > 0)
    out[s[:, 0] <= 0, 0] = 1.0
    return out.astype(np.float32)


def build_programs(sp, spacy: bool) -> list[tuple[str, Ref]]:
    """The 20 benchmark programs: (DSL text, equivalent per-sequence reference function)."""
    punct_ids = sorted({sp.piece_to_id(p) for p in (".", ",", "!", "?", '"')} - {sp.unk_id()})
    the, dot, he, she = (sp.piece_to_id(p) for p in ("▁the", ".", "▁he", "▁she"))
    pairs = [(the, the), (dot, dot), (he, she), (she, he)]
    pairs_text = ", ".join(f"[{a}, {b}]" for a, b in sorted(pairs))
    progs: list[tuple[str, Ref]] = [
        ("prev(1)", r_prev(1)),
        ("self()", r_self),
        ("first()", r_first),
        ("0.7*prev(1) + 0.3*first()", r_mix((0.7, r_prev(1)), (0.3, r_first))),
        ("window(1, 3)", r_window(1, 3)),
        ("decay(0.8)", r_decay(0.8)),
        ("uniform()", r_uniform),
        ("same_token()", r_same_token),
        ("fallback(same_token_recent(), first())", r_fallback(r_same_token_recent, r_first)),
        ("fallback(induction(), first())", r_fallback(r_induction, r_first)),
        (f"key_in_set(ids=[{', '.join(map(str, punct_ids))}])", r_key_in_set(set(punct_ids))),
        ("recent(punct)", r_recent("punct")),
        ("fallback(recent(sent_end), first())", r_fallback(r_recent("sent_end"), r_first)),
        ("sentence_start()", r_group_start("sent")),
        ("word_start()", r_group_start("word")),
        ("same_word()", r_same_word),
        ("gate(cap, prev(1), first())", r_gate(lambda s, i: s["cap"][i] != 0, r_prev(1), r_first)),
        (f"match(q=token, k=token, pairs=[{pairs_text}], select=closest)", r_match_closest(set(pairs))),
        ("0.5*prev(2) + 0.5*sharpen(decay(0.5), 2)", r_mix((0.5, r_prev(2)), (0.5, r_sharpen(r_decay(0.5), 2.0)))),
    ]
    if spacy:
        noun = _pos_id("NOUN")
        progs.append(("gate(pos=NOUN, fallback(dep_head(), first()), 0.5*prev(1) + 0.5*first())",
                      r_gate(lambda s, i: s["pos"][i] == noun, r_fallback(r_dep_head, r_first),
                             r_mix((0.5, r_prev(1)), (0.5, r_first)))))
    else:
        progs.append(("0.5*same_word() + 0.5*recent(cap)", r_mix((0.5, r_same_word), (0.5, r_recent("cap")))))
    return progs


def _pos_id(tag: str) -> int:
    from headsurgeon.synth.features import POS_TAGS

    return list(POS_TAGS).index(tag)


def per_sequence_inputs(sequences: list[Sequence], feats: dict[str, np.ndarray]) -> list[dict]:
    """Per-sequence Python lists (ids and features) for the reference functions."""
    out = []
    for b, seq in enumerate(sequences):
        d = {"ids": seq.ids.tolist()}
        for name, arr in feats.items():
            d[name] = arr[b, : seq.n].tolist()
        out.append(d)
    return out


# ============================================================================ section 1: programs

def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call; the result is dropped."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def bench_programs(sequences: list[Sequence], feats: dict[str, np.ndarray], progs: list[tuple[str, Ref]],
                   repeats: int) -> dict[str, np.ndarray]:
    """Time every program on both paths (interleaved, medians) and check that they agree.

    Columns (ms, medians): ``fresh`` = ``Program.evaluate`` returning a new array (the kernels are serial),
    as process CPU time (the per-core comparison with the single-threaded reference; robust to other
    jobs on a shared machine); ``out`` = the same writing into a reused ``out=`` buffer (block-wise
    evaluation: no first-touch page faults); ``python`` = the reference, CPU time; then the same
    ``fresh`` evaluation and the reference as wall-clock times.
    """
    inputs = per_sequence_inputs(sequences, feats)
    lengths = [s.n for s in sequences]
    width = max(lengths)
    block = np.empty((len(sequences), width, width), dtype=np.float32)
    print(f"\n== programs: {len(progs)} DSL programs x {len(sequences)} sequences (N={width}, "
          f"mean length {np.mean(lengths):.1f}), causal, {repeats} repeats, medians, ms ==")
    print(f"{'':<46} {'---------- CPU time, 1 thread ----------':>41}  {'------- wall clock -------':>27}")
    print(f"{'program':<46} {'fresh':>7} {'out':>6} {'python':>7} {'x fresh':>8} {'x out':>6}  "
          f"{'fresh':>7} {'python':>8} {'x':>6}   {'max|diff|':>8}")
    cols = ("fresh", "out", "ref", "wall_fresh", "wall_ref")
    totals = dict.fromkeys(cols, 0.0)
    ratios = []
    patterns: dict[str, np.ndarray] = {}
    for text, ref in progs:
        program = Program.parse(text)
        program.evaluate(sequences[:4], features={k: v[:4] for k, v in feats.items()})  # compile/load
        times: dict[str, list[float]] = {c: [] for c in cols}
        for _ in range(repeats):
            times["fresh"].append(_timed(lambda: program.evaluate(sequences, features=feats))[1])
            times["out"].append(_timed(lambda: program.evaluate(sequences, features=feats, out=block))[1])
            times["wall_fresh"].append(_timed(lambda: program.evaluate(sequences, features=feats))[0])
            wall, cpu = _timed(lambda: [reference_normalize(ref(s)) for s in inputs])
            times["ref"].append(cpu)
            times["wall_ref"].append(wall)
        want = [reference_normalize(ref(s)) for s in inputs]
        got = program.evaluate(sequences, features=feats)
        diff = max(float(np.abs(got[b, :n, :n] - w).max()) for b, (n, w) in enumerate(zip(lengths, want)))
        diff = max(diff, float(np.abs(got.sum(-1) - (np.arange(width)[None] < np.array(lengths)[:, None])).max()))
        m = {c: statistics.median(times[c]) for c in cols}
        for c in cols:
            totals[c] += m[c]
        ratios.append(m["ref"] / m["fresh"])
        patterns[text] = got
        print(f"{text[:46]:<46} {m['fresh'] * 1e3:7.1f} {m['out'] * 1e3:6.1f} {m['ref'] * 1e3:7.1f} "
              f"{m['ref'] / m['fresh']:7.0f}x {m['ref'] / m['out']:5.0f}x  {m['wall_fresh'] * 1e3:7.1f} "
              f"{m['wall_ref'] * 1e3:8.1f} {m['wall_ref'] / m['wall_fresh']:5.0f}x   {diff:8.1e}")
        if diff > 1e-5:
            print(f"   !! numba and reference disagree on {text} (max |diff| {diff:.2e})")
    geo = math.exp(statistics.fmean(math.log(r) for r in ratios))
    t = {c: totals[c] * 1e3 for c in cols}
    print(f"{'TOTAL (sum of medians)':<46} {t['fresh']:7.1f} {t['out']:6.1f} {t['ref']:7.1f} "
          f"{t['ref'] / t['fresh']:7.0f}x {t['ref'] / t['out']:5.0f}x  {t['wall_fresh']:7.1f} {t['wall_ref']:8.1f} "
          f"{t['wall_ref'] / t['wall_fresh']:5.0f}x")
    print(f"speedup vs the per-sequence reference (goal >= 50x): CPU, 1 thread, fresh output: total "
          f"{t['ref'] / t['fresh']:.0f}x (per program: geometric mean {geo:.0f}x, min {min(ratios):.0f}x, "
          f"max {max(ratios):.0f}x); into a reused buffer: {t['ref'] / t['out']:.0f}x; "
          f"wall clock: {t['wall_ref'] / t['wall_fresh']:.0f}x")
    return patterns


# ============================================================================ section 1b: EAPS-style programs
# The seed's programs (EAPS, tests/synth/test_eaps_library.py): one Python function per sequence that loops over
# its tokens (a dict for repeats), fills a dense float64 n x n matrix with np.zeros + item assignment, and
# the framework then row-normalizes that matrix per sequence (``reference_normalize``). The numba side is
# what consumers get: sparse programs as compressed rows (``dsl.evaluate_sparse``), dense ones as a
# float32 [B, N, N] (``dsl.evaluate``); each fresh ("numba") and into reused buffers ("reused": a RowsBuffer,
# or an ``out=`` array). Both sides get their inputs
# prepared before timing (token lists here, padded arrays there).

def e_first(s: dict) -> np.ndarray:
    n = len(s["ids"])
    out = np.zeros((n, n))
    for i in range(n):
        out[i, 0] = 1.0
    return out


def e_same_token(s: dict) -> np.ndarray:
    ids = s["ids"]
    n = len(ids)
    out = np.zeros((n, n))
    seen: dict[int, list[int]] = {}
    for i, t in enumerate(ids):
        for j in seen.get(t, ()):
            out[i, j] = 1.0
        seen.setdefault(t, []).append(i)
    return out


def e_uniform(s: dict) -> np.ndarray:
    n = len(s["ids"])
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            out[i, j] = 1.0
    return out


# prev, window and decay are already written this way in the reference style above (r_prev, r_window, r_decay)
EAPS_SPARSE = [("prev(1)", r_prev(1)), ("first()", e_first), ("window(1, 3)", r_window(1, 3)),
               ("same_token()", e_same_token)]
EAPS_DENSE = [("decay(0.8)", r_decay(0.8)), ("uniform()", e_uniform)]


def bench_eaps(sequences: list[Sequence], repeats: int) -> dict[str, float]:
    """Sparse and dense DSL programs through ``program_rows`` vs the same programs written EAPS-style, CPU time.

    ``rows``: ``program_rows([program], windows, causal)`` with no cache, a fresh result per call (what a
    consumer gets; the windows' padded ids are prepared by the first call and kept, as for a search scoring
    many programs on the same windows); ``new batch``: the same with that preparation dropped before every
    call (the first program on a batch); ``cached``: the same call through a warm ``TensorCache`` (every window a
    hit: packed rows read back); ``EAPS``: one Python function per window, then the per-window normalization.
    Returns the EAPS side's median seconds per program.
    """
    from headsurgeon.kernels.cache import TensorCache
    from headsurgeon.synth import tensors
    from headsurgeon.synth.tensors import program_rows

    inputs = per_sequence_inputs(sequences, {})
    lengths = np.array([s.n for s in sequences])
    print(f"\n== EAPS-style through program_rows: {len(sequences)} windows (mean length {lengths.mean():.1f}), causal, "
          f"CPU time on 1 thread, medians of {repeats} interleaved runs, ms ==")
    print(f"{'program':<16} {'form':<7} {'rows':>8} {'new batch':>9} {'cached':>8} {'EAPS':>8} {'x':>6} "
          f"{'x new batch':>11} {'x cached':>9}  {'nnz/row':>7} {'max|diff|':>9}")
    ratios: dict[str, float] = {}
    cold: dict[str, float] = {}

    def new_batch() -> object:
        tensors._PREPARED.clear()
        return program_rows([program], sequences, True)[0]
    eaps: dict[str, float] = {}
    for group, progs in (("sparse", EAPS_SPARSE), ("dense", EAPS_DENSE)):
        for text, fn in progs:
            program = Program.parse(text)
            cache = TensorCache(max_bytes=1 << 32)
            run = lambda: program_rows([program], sequences, True)[0]  # noqa: E731
            cached = lambda: program_rows([program], sequences, True, cache)[0]  # noqa: E731
            run(), cached(), cached()
            times: dict[str, list[float]] = {"rows": [], "new": [], "cached": [], "eaps": []}
            for _ in range(repeats):
                times["rows"].append(_timed(run)[1])
                times["new"].append(_timed(new_batch)[1])
                times["cached"].append(_timed(cached)[1])
                times["eaps"].append(_timed(lambda: [reference_normalize(fn(x)) for x in inputs])[1])
            got = run()
            dense = got.to_dense() if hasattr(got, "to_dense") else got
            want = [reference_normalize(fn(x)) for x in inputs]
            diff = max(float(np.abs(dense[b, :n, :n] - w).max()) for b, (n, w) in enumerate(zip(lengths, want)))
            again = cached()
            diff = max(diff, float(np.abs((again.to_dense() if hasattr(again, "to_dense") else again) - dense).max()))
            m = {k: statistics.median(v) for k, v in times.items()}
            ratios[text] = m["eaps"] / m["rows"]
            cold[text] = m["eaps"] / m["new"]
            eaps[text] = m["eaps"]
            nnz = got.nnz / lengths.sum() if hasattr(got, "nnz") else float(np.mean(lengths + 1) / 2)
            print(f"{text:<16} {group:<7} {m['rows'] * 1e3:8.2f} {m['new'] * 1e3:9.2f} {m['cached'] * 1e3:8.2f} "
                  f"{m['eaps'] * 1e3:8.1f} {m['eaps'] / m['rows']:5.0f}x {m['eaps'] / m['new']:10.0f}x "
                  f"{m['eaps'] / m['cached']:8.0f}x  {nnz:7.2f} {diff:9.1e}")
    geo = lambda names, r=ratios: math.exp(statistics.fmean(math.log(r[t]) for t, _ in names))  # noqa: E731
    print(f"sparse programs through program_rows vs EAPS-style (geometric mean over "
          f"{', '.join(t for t, _ in EAPS_SPARSE)}): {geo(EAPS_SPARSE):.1f}x (goal >= 50x), on a new batch "
          f"{geo(EAPS_SPARSE, cold):.1f}x; dense programs: {geo(EAPS_DENSE):.1f}x (goal >= 10x), on a new batch "
          f"{geo(EAPS_DENSE, cold):.1f}x")
    return eaps


# ============================================================================ section 1c: the kernels, specialised
# The sparse kernels of the EAPS section as they were built before each became one build per flag combination
# (headsurgeon/kernels/specialise.py): the count/fill pass, normalized rows and the causal mask were runtime arguments,
# branched on inside inlined helpers. Copied here (not kept in the library) to time both builds in one process.

@njit(inline="always")
def _old_put(fill, norm, rowptr, cols, vals, r, c, j):  # pragma: no cover - compiled
    if fill:
        k = rowptr[r] + c
        cols[k] = j
        vals[k] = np.float32(1.0 / np.float64(rowptr[r + 1] - rowptr[r])) if norm else np.float32(1.0)
    return c + 1


@njit(inline="always")
def _old_end(fill, norm, rowptr, cols, vals, r, c):  # pragma: no cover - compiled
    if not fill:
        rowptr[r + 1] = max(c, 1) if norm else c
    elif norm and c == 0:
        cols[rowptr[r]] = 0
        vals[rowptr[r]] = 1.0


@njit
def _old_sp_offset(k, causal, lengths, n, fill, norm, rowptr, cols, vals):  # pragma: no cover - compiled
    for b in range(lengths.shape[0]):
        L = lengths[b]
        for i in range(L):
            j = i - k
            c = 0
            if 0 <= j < L and (not causal or j <= i):
                c = _old_put(fill, norm, rowptr, cols, vals, b * n + i, c, j)
            _old_end(fill, norm, rowptr, cols, vals, b * n + i, c)


@njit
def _old_sp_first(lengths, n, fill, norm, rowptr, cols, vals):  # pragma: no cover - compiled
    for b in range(lengths.shape[0]):
        for i in range(lengths[b]):
            _old_end(fill, norm, rowptr, cols, vals, b * n + i, _old_put(fill, norm, rowptr, cols, vals, b * n + i, 0, 0))


@njit
def _old_sp_window(lo, hi, causal, lengths, n, fill, norm, rowptr, cols, vals):  # pragma: no cover - compiled
    for b in range(lengths.shape[0]):
        L = lengths[b]
        for i in range(L):
            dlo = max(lo, i - L + 1)
            if causal:
                dlo = max(dlo, 0)
            dhi = min(hi, i)
            c = 0
            for d in range(dhi, dlo - 1, -1):
                c = _old_put(fill, norm, rowptr, cols, vals, b * n + i, c, i - d)
            _old_end(fill, norm, rowptr, cols, vals, b * n + i, c)


@njit
def _old_sp_same_token_linked(ids, vocab, causal, lengths, n, fill, norm, rowptr, cols, vals):  # pragma: no cover
    nb = lengths.shape[0]
    last = np.full(vocab, -1, dtype=np.int64)
    prev = np.empty(max(n, 1), dtype=np.int64)
    for b in range(nb):
        L = lengths[b]
        for i in range(L):
            t = ids[b, i]
            prev[i] = last[t]
            last[t] = i
        for i in range(L):
            r = b * n + i
            j = prev[i] if causal else last[ids[b, i]]
            cnt = 0
            if fill:
                k = rowptr[r + 1] - 1
                w = np.float32(1.0 / np.float64(rowptr[r + 1] - rowptr[r])) if norm else np.float32(1.0)
            while j >= 0:
                if j != i:
                    if fill:
                        cols[k] = j
                        vals[k] = w
                        k -= 1
                    cnt += 1
                j = prev[j]
            _old_end(fill, norm, rowptr, cols, vals, r, cnt)
        for i in range(L):
            last[ids[b, i]] = -1


def _two_passes(count: Callable, fill: Callable, lengths: np.ndarray, n: int, earlier: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count, size, fill (headsurgeon/kernels/primitives/sparse_prims.py ``_run``): ``count``/``fill`` take (rowptr, cols, vals).

    The specialised count pass writes the row pointer itself; the ``earlier`` builds counted into a zeroed array,
    summed by numpy afterwards (as their driver did)."""
    B = lengths.shape[0]
    if earlier:
        rowptr = np.zeros(B * n + 1, dtype=np.int64)
        count(rowptr, np.zeros(0, np.int32), np.zeros(0, np.float32))
        np.cumsum(rowptr, out=rowptr)
    else:
        rowptr = np.empty(B * n + 1, dtype=np.int64)
        rowptr[0] = 0
        count(rowptr, np.zeros(0, np.int32), np.zeros(0, np.float32))
    cols = np.empty(int(rowptr[-1]), dtype=np.int32)
    vals = np.empty(int(rowptr[-1]), dtype=np.float32)
    fill(rowptr, cols, vals)
    return rowptr, cols, vals


def bench_kernels(sequences: list[Sequence], repeats: int, eaps: dict[str, float] | None = None) -> dict[str, float]:
    """The four sparse kernels of the EAPS section, specialised builds vs the earlier flag-branching ones (above):
    both passes, normalized rows, causal, on the same padded arrays; outputs checked equal. ``eaps``: the EAPS
    side's seconds per program (``bench_eaps``), for the kernels-alone ratio."""
    from headsurgeon.kernels.primitives.sparse_prims import _sp_first, _sp_offset, _sp_window
    from headsurgeon.kernels.primitives.sparse_tokens import _sp_same_token_linked
    from headsurgeon.synth.sequence import pad_ids

    ids, lengths = pad_ids(sequences)
    B, n = ids.shape
    vocab = int(ids.max()) + 1
    cases = {
        "prev(1)": (lambda r, c, v: _sp_offset(False, True, True)(1, lengths, n, r, c, v),
                    lambda r, c, v: _sp_offset(True, True, True)(1, lengths, n, r, c, v),
                    lambda r, c, v: _old_sp_offset(1, True, lengths, n, False, True, r, c, v),
                    lambda r, c, v: _old_sp_offset(1, True, lengths, n, True, True, r, c, v)),
        "first()": (lambda r, c, v: _sp_first(False, True)(lengths, n, r, c, v),
                    lambda r, c, v: _sp_first(True, True)(lengths, n, r, c, v),
                    lambda r, c, v: _old_sp_first(lengths, n, False, True, r, c, v),
                    lambda r, c, v: _old_sp_first(lengths, n, True, True, r, c, v)),
        "window(1, 3)": (lambda r, c, v: _sp_window(False, True, True)(1, 3, lengths, n, r, c, v),
                         lambda r, c, v: _sp_window(True, True, True)(1, 3, lengths, n, r, c, v),
                         lambda r, c, v: _old_sp_window(1, 3, True, lengths, n, False, True, r, c, v),
                         lambda r, c, v: _old_sp_window(1, 3, True, lengths, n, True, True, r, c, v)),
        "same_token()": (lambda r, c, v: _sp_same_token_linked(False, True, True)(ids, vocab, lengths, n, r, c, v),
                         lambda r, c, v: _sp_same_token_linked(True, True, True)(ids, vocab, lengths, n, r, c, v),
                         lambda r, c, v: _old_sp_same_token_linked(ids, vocab, True, lengths, n, False, True, r, c, v),
                         lambda r, c, v: _old_sp_same_token_linked(ids, vocab, True, lengths, n, True, True, r, c,
                                                                   v)),
    }
    print(f"\n== sparse kernels alone (count + fill, normalized, causal) on {B} windows: specialised builds vs the "
          f"earlier flag-branching builds, CPU time on 1 thread, medians of {max(repeats, 5)} interleaved runs, ms ==")
    print(f"{'kernel':<16} {'specialised':>11} {'earlier':>8} {'x':>6} {'EAPS/specialised':>17}  {'equal':>5}")
    ratios: dict[str, float] = {}
    vs_eaps: list[float] = []
    for text, (count, fill, old_count, old_fill) in cases.items():
        new = _two_passes(count, fill, lengths, n)
        old = _two_passes(old_count, old_fill, lengths, n, True)
        same = all(np.array_equal(a, b) for a, b in zip(new, old))
        times: dict[str, list[float]] = {"new": [], "old": []}
        for _ in range(max(repeats, 5)):
            times["new"].append(_timed(lambda: _two_passes(count, fill, lengths, n))[1])
            times["old"].append(_timed(lambda: _two_passes(old_count, old_fill, lengths, n, True))[1])
        m = {k: statistics.median(v) for k, v in times.items()}
        ratios[text] = m["old"] / m["new"]
        versus = ""
        if eaps and text in eaps:
            vs_eaps.append(eaps[text] / m["new"])
            versus = f"{vs_eaps[-1]:16.0f}x"
        print(f"{text:<16} {m['new'] * 1e3:11.3f} {m['old'] * 1e3:8.3f} {ratios[text]:5.1f}x {versus:>17}  "
              f"{'yes' if same else 'NO':>5}")
    geo = math.exp(statistics.fmean(math.log(r) for r in ratios.values()))
    print(f"specialised vs earlier builds (geometric mean over the four kernels): {geo:.1f}x"
          + (f"; kernels alone vs EAPS-style: {math.exp(statistics.fmean(math.log(r) for r in vs_eaps)):.0f}x"
             if vs_eaps else ""))
    return ratios


def bench_cache_bytes(sequences: list[Sequence], programs: list[str]) -> None:
    """Bytes the tensor cache holds per program (sparse: packed rows) vs the dense n x n float32 it replaces."""
    from headsurgeon.kernels.cache import TensorCache
    from headsurgeon.synth.tensors import is_sparse_program, program_rows

    progs = [Program.parse(t) for t in programs]
    dense_bytes = sum(4 * s.n * s.n for s in sequences)
    print(f"\n== tensor cache: bytes per program over {len(sequences)} windows, vs dense float32 "
          f"({dense_bytes / 2**20:.1f} MiB per program) ==")
    total_sparse, n_sparse = 0, 0
    for prog in progs:
        cache = TensorCache(max_bytes=1 << 32)
        program_rows([prog], sequences, True, cache)
        held = cache.stats.bytes
        kind = "sparse" if is_sparse_program(prog) else "dense"
        if kind == "sparse":
            total_sparse, n_sparse = total_sparse + held, n_sparse + 1
        print(f"  {prog.text[:46]:<46} {kind:<6} {held / 2**10:9.1f} KiB  {held / dense_bytes:6.1%} of dense")
    if n_sparse:
        print(f"sparse programs together: {total_sparse / (n_sparse * dense_bytes):.1%} of their dense bytes "
              "(goal <= 10%)")


# ============================================================================ section 2: metrics scoring
# Scores the programs' patterns against real heads with headsurgeon.synth.metrics.score_many (written
# by the metrics engineer) vs a per-triple numpy loop in the reference implementation's style.

def numpy_triple(p: np.ndarray, q: np.ndarray, n: int) -> tuple[float, float]:
    """Soft IoU and mean row JSD distance of one (head, program, sequence) triple (causal)."""
    p, q = p[:n, :n].astype(np.float64), q[:n, :n].astype(np.float64)
    mask = np.tril(np.ones((n, n), dtype=bool))
    p, q = np.where(mask, p, 0), np.where(mask, q, 0)
    iou = np.minimum(p, q).sum() / np.maximum(p, q).sum()
    m = (p + q) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p > 0, p * np.log(p / m), 0).sum(axis=1)
        kq = np.where(q > 0, q * np.log(q / m), 0).sum(axis=1)
    jsd = np.sqrt(np.maximum(0.5 * kp + 0.5 * kq, 0)).mean()
    return float(iou), float(jsd)


def real_head_patterns(sequences: list[Sequence]) -> np.ndarray | None:
    """Captured stories260K patterns [H, B, N, N] float16 (40 query heads), or None if unavailable."""
    try:
        import torch

        from headsurgeon.surgery.patterns.capture import forward_patterns
        from headsurgeon.surgery.models.loading import load_model

        torch.set_num_threads(1)
        handle = load_model(f"llama2c:{CHECKPOINT}", tokenizer=TOKENIZER)
    except Exception as e:  # noqa: BLE001 - the section is optional
        print(f"(real heads unavailable: {e})")
        return None
    width = max(s.n for s in sequences)
    heads = handle.n_layers * handle.n_heads
    real = np.zeros((heads, len(sequences), width, width), dtype=np.float16)
    for start in range(0, len(sequences), 50):
        chunk = sequences[start: start + 50]
        for k, pat in enumerate(forward_patterns(handle, chunk)):  # [L, H, n, n]
            n = pat.shape[-1]
            real[:, start + k, :n, :n] = pat.reshape(heads, n, n)
    return real


def bench_metrics_scoring(sequences: list[Sequence], patterns: dict[str, np.ndarray], repeats: int,
                          feats: dict[str, np.ndarray] | None = None, sample: int = 400) -> None:
    """score_many over 40 real heads x the programs x sequences vs a per-triple numpy loop.

    Sparse programs go to ``score_many`` as compressed rows (what ``program_rows`` gives consumers), the
    others dense; the numpy loop reads dense patterns. Timed for all programs, then per group.
    """
    try:
        from headsurgeon.synth import dsl
        from headsurgeon.synth.metrics import score_many
        from headsurgeon.synth.sequence import pad_ids
    except ImportError as e:
        print(f"\n== metrics scoring: skipped (headsurgeon.synth.metrics unavailable: {e}) ==")
        return
    real = real_head_patterns(sequences)
    if real is None:
        print("\n== metrics scoring: skipped (no real heads) ==")
        return
    names = list(patterns)
    B = len(sequences)
    width = real.shape[-1]
    cand = np.stack([patterns[k][:B, :width, :width] for k in names])  # [P, B, N, N] float32, for the loop
    lengths = np.array([s.n for s in sequences], dtype=np.int64)
    ids, _ = pad_ids(sequences)
    feats = {k: v[:B, :width] for k, v in (feats or {}).items()}
    forms = [dsl.evaluate_sparse(dsl.parse(k), ids, lengths, feats) if dsl.is_sparse(dsl.parse(k)) else cand[p]
             for p, k in enumerate(names)]
    sparse = [p for p, f in enumerate(forms) if not isinstance(f, np.ndarray)]
    H, P = real.shape[0], cand.shape[0]
    print(f"\n== metrics scoring: {H} real heads (stories260K) x {P} programs ({len(sparse)} sparse) x {B} sequences "
          f"= {H * P * B:,} triples, IoU + JSD ==")
    score_many(real[:, :2], [f if isinstance(f, np.ndarray) else f.take([0, 1]) for f in forms][:2],
               lengths[:2], True, metrics=("iou", "jsd"))  # compile/load
    score_many(real[:, :2], cand[:, :2], lengths[:2], True, metrics=("iou", "jsd"))
    groups = {"all": list(range(P)), "sparse": sparse, "dense": [p for p in range(P) if p not in sparse]}
    rng = random.Random(0)
    for label, members in groups.items():
        if not members:
            continue
        chosen = [forms[p] for p in members]
        t_wall, t_cpu1 = [], []
        for _ in range(repeats):
            t_cpu1.append(_timed(lambda: score_many(real, chosen, lengths, True, metrics=("iou", "jsd")))[1])
            t_wall.append(_timed(lambda: score_many(real, chosen, lengths, True, metrics=("iou", "jsd")))[0])
        res = score_many(real, chosen, lengths, True, metrics=("iou", "jsd"), per_sequence=True)
        triples = [(rng.randrange(H), rng.randrange(len(members)), rng.randrange(B)) for _ in range(sample)]
        loop_wall, loop_cpu = _timed(lambda: [numpy_triple(real[h, b], cand[members[p], b], int(lengths[b]))
                                              for h, p, b in triples])
        loop = [numpy_triple(real[h, b], cand[members[p], b], int(lengths[b])) for h, p, b in triples]
        err = max(max(abs(res["iou"][h, p, b] - i), abs(res["jsd"][h, p, b] - j))
                  for (h, p, b), (i, j) in zip(triples, loop))
        scale = H * len(members) * B / sample
        mc, mw = statistics.median(t_cpu1), statistics.median(t_wall)
        print(f"{label:>6} ({len(members):2d} programs): score_many CPU {mc:6.2f} s, wall {mw:6.2f} s; "
              f"numpy loop CPU {loop_cpu * scale:7.2f} s (extrapolated from {sample} "
              f"triples) -> {loop_cpu * scale / mc:4.0f}x per core, {loop_wall * scale / mw:4.0f}x wall "
              f"(max |diff| {err:.1e})")
        if label == "all":
            iou = res["iou"].mean(axis=2)
    print("goal: score_many >= 100x the per-triple loop overall")
    print("best program per head by soft IoU on these sequences (benchmark only: selected and reported "
          "on the same data):")
    for h in range(H):
        best = int(iou[h].argmax())
        print(f"  L{h // 8}H{h % 8}: {iou[h, best]:.3f}  {names[best]}")


# ============================================================================ section 3: sandbox overhead
# Python programs run only in the sandbox (headsurgeon/synth/sandbox/). Its containment (attribute allowlist, seccomp +
# Landlock file-system and metadata denial in every job process, an empty root, request-tagged frames) is
# measured against the sandbox as it was at an earlier revision, both pools running side by side in one process.

SANDBOX_PROGRAMS = {
    "trivial (zeros)": "def f(seq):\n    return np.zeros((seq.n, seq.n))\n",
    "same token (numpy)": ("def f(seq):\n    ids = seq.ids\n"
                           "    return np.tril((ids[:, None] == ids[None, :]).astype(np.float64))\n"),
}


def sandbox_module_at(rev: str) -> Any:
    """The headsurgeon/synth/sandbox package as of git revision ``rev`` (with the rest of headsurgeon/synth/ it imports), beside today's.

    The whole headsurgeon/synth/ folder of ``rev`` is unpacked into a temporary folder and imported as the package
    ``hs_sandbox_before``; its zygotes boot from that folder too (SYNTH_DIR in headsurgeon/synth/sandbox/pool.py).
    """
    import importlib
    import io
    import subprocess
    import tarfile
    import tempfile
    import types

    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="hs-sandbox-before-"))
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", rev, "synth"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    if not (folder / "synth" / "sandbox" / "__init__.py").exists():
        sys.exit(f"revision {rev} has no headsurgeon/synth/sandbox/ package; compare with a revision from after the split")
    package = types.ModuleType("hs_sandbox_before")
    package.__path__ = [str(folder / "synth")]
    sys.modules["hs_sandbox_before"] = package
    return importlib.import_module("hs_sandbox_before.sandbox")


def _sandbox_cpu(pool: Any) -> float:
    """CPU seconds used so far by a one-worker pool's zygote and the job processes it has reaped (/proc)."""
    import os

    fields = Path(f"/proc/{pool.hardening['pid']}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def _timed_sandbox(pool: Any, fn: Callable[[], object]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process plus the pool's sandbox processes) of one call."""
    s0 = _sandbox_cpu(pool)
    wall, cpu = _timed(fn)
    return wall, cpu + _sandbox_cpu(pool) - s0


def bench_sandbox(sequences: list[Sequence], repeats: int, before_rev: str) -> None:
    """Per-sequence cost of a Python program in today's sandbox vs the sandbox at ``before_rev``: wall clock, and
    CPU time (the parent's plus the sandbox processes'), the steadier figure on a loaded machine."""
    from headsurgeon.synth import sandbox as after_module

    before_module = sandbox_module_at(before_rev)
    pools = {"before": before_module.SandboxPool(workers=1, chunk_size=32),
             "after": after_module.SandboxPool(workers=1, chunk_size=32)}
    singles = sequences[:50]
    print(f"\n== sandbox: Python programs, 1 worker, {len(sequences)} sequences per call and {len(singles)} "
          f"one-sequence calls; before = {before_rev}, after = working tree; {repeats} repeats, medians ==")
    print(f"{'program':<22} {'case':<22} {'before ms/seq':>14} {'after ms/seq':>13} {'after/before':>13} "
          f"{'CPU before':>11} {'CPU after':>10} {'after/before':>13}")
    try:
        for pool in pools.values():
            pool.start()
            pool.run(SANDBOX_PROGRAMS["trivial (zeros)"], sequences[:4], timeout=10.0)
        for name, source in SANDBOX_PROGRAMS.items():
            cases = {"batch call": lambda pool: pool.run(source, sequences, timeout=10.0),
                     "one sequence per call": lambda pool: [pool.run(source, [s], timeout=10.0) for s in singles]}
            for case, call in cases.items():
                count = len(sequences) if case == "batch call" else len(singles)
                times: dict[str, list[float]] = {k: [] for k in pools}
                cpus: dict[str, list[float]] = {k: [] for k in pools}
                for _ in range(repeats):
                    for key, pool in pools.items():  # interleaved: both see the same machine load
                        wall, cpu = _timed_sandbox(pool, lambda: call(pool))
                        times[key].append(wall / count)
                        cpus[key].append(cpu / count)
                ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
                cpu_ms = {k: statistics.median(v) * 1e3 for k, v in cpus.items()}
                print(f"{name:<22} {case:<22} {ms['before']:14.3f} {ms['after']:13.3f} "
                      f"{ms['after'] / ms['before']:12.2f}x {cpu_ms['before']:11.3f} {cpu_ms['after']:10.3f} "
                      f"{cpu_ms['after'] / max(cpu_ms['before'], 1e-9):12.2f}x")
        for key, pool in pools.items():
            print(f"{key}: job limits {pool.hardening.get('job_limits')}")
    finally:
        for pool in pools.values():
            pool.close()
    print(f"goal: the containment added since {before_rev} costs at most 1.1x per sequence (after/before <= 1.1)")


# ============================================================================ main

def main(argv: list[str] | None = None) -> None:
    """Run both sections and print the measured ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--metric-sequences", type=int, default=200, help="0 skips the metrics section")
    ap.add_argument("--sandbox-before", default="c79797d", help="git revision the sandbox is compared with")
    ap.add_argument("--sandbox-only", action="store_true", help="run only the sandbox section")
    ap.add_argument("--eaps-only", action="store_true", help="run only the EAPS-style and cache-bytes sections")
    args = ap.parse_args(argv)
    import numba
    import torch

    numba.set_num_threads(1)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    sequences, sp = load_sequences(args.sequences)
    if args.sandbox_only:
        bench_sandbox(sequences[:400], args.repeats, args.sandbox_before)
        return
    feats, spacy = load_features(sequences)
    print(f"{len(sequences)} sequences, features {sorted(feats)} in {time.perf_counter() - t0:.1f} s; "
          f"numba {numba.__version__} (serial kernels)")
    k = min(400, len(sequences))
    bench_kernels(sequences[:k], args.repeats, bench_eaps(sequences[:k], args.repeats))
    progs = build_programs(sp, spacy)
    bench_cache_bytes(sequences[:k], [t for t, _ in progs])
    if args.eaps_only:
        return
    patterns = bench_programs(sequences, feats, progs, args.repeats)
    if args.metric_sequences:
        k = min(args.metric_sequences, len(sequences))
        bench_metrics_scoring(sequences[:k], {t: p[:k] for t, p in patterns.items()}, args.repeats,
                              {name: v[:k] for name, v in feats.items()})
    bench_sandbox(sequences[:400], args.repeats, args.sandbox_before)


if __name__ == "__main__":
    main()
