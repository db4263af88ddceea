"""Benchmark: batched metrics (score_many) vs a per-triple numpy loop, and tensor-cache hit vs miss.

Workload: 40 heads x 200 programs x 500 sequences. Sequence lengths are real: the first 500 TinyStories
paragraphs of ../shared/data tokenized with stories260K's tok512 (+BOS), cut at 128 tokens (mean 94);
without ../shared, random lengths 16..128. Real patterns are float16 softmaxes of random logits with a
head-specific structure (previous-token, BOS sink, local decay, content noise), dense like captured
heads. Program patterns come from 10 families x 20 parameter settings: prev(k), self, first,
prev+first mixes, windows, same-token, induction-like, a prev+decay mix, decay(rate) and
uniform-causal; the last three are dense (30% of programs, a pessimistic mix). Candidates are
generated and scored in blocks of programs (the full float32 [200,500,128,128] would be 6.5 GB). The
sparse families reach ``score`` as compressed rows (``SparseRows``, the form ``program_rows`` gives DSL
programs of small support; converted outside the timings), the dense ones as arrays.
The numpy baseline scores random (head, program, sequence) triples one at a time (IoU, JSD, top-q like the reference
implementation) on a subsample and is extrapolated to all triples; the output says so.

Run: ``python benchmarks/metrics.py [--heads 40 --programs 200 --sequences 500 --sample 400]``.

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from headsurgeon.kernels.cache import TensorCache
from headsurgeon.kernels.sparse import from_dense
from headsurgeon.synth.metrics import RealPatterns, score_many, topq_count, visible_cells
from headsurgeon.synth.sequence import Sequence
from headsurgeon.synth.tensors import program_tensors

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
N_MAX = 128


# --------------------------------------------------------------------------- data
def load_sequences(count: int, rng: np.random.Generator) -> tuple[list[np.ndarray], str]:
    """Token id arrays of real TinyStories paragraphs (<= 128 tokens with BOS), or random ones."""
    corpus = SHARED / "corpora" / "tinystories-valid.txt"
    model = SHARED / "models" / "stories260K" / "tok512.model"
    try:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(model))
        text = corpus.read_text(encoding="utf-8", errors="replace")
        paras = [p.strip() for p in text.split("\n\n") if p.strip()]
        seqs = [np.array([sp.bos_id()] + sp.encode(p)[: N_MAX - 1], dtype=np.int64) for p in paras[:count]]
        if len(seqs) == count:
            return seqs, "TinyStories paragraphs, tok512"
    except Exception as e:  # noqa: BLE001 - benchmark falls back to synthetic data
        print(f"(real sequences unavailable: {e}; using random ones)")
    return [rng.integers(1, 512, size=int(rng.integers(16, N_MAX + 1))) for _ in range(count)], "random"


def causal_softmax(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row softmax over the causal, length-masked grid; padded rows are zero. [B,N,N] float32."""
    B, N, _ = logits.shape
    pos = np.arange(N)
    vis = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] < lengths[:, None, None]) \
        & (pos[None, :, None] < lengths[:, None, None])
    x = np.where(vis, logits, -np.inf)
    x -= np.max(x, axis=-1, keepdims=True, where=vis, initial=-1e30)
    e = np.where(vis, np.exp(x), 0.0)
    s = e.sum(-1, keepdims=True)
    return (e / np.where(s == 0, 1, s)).astype(np.float32)


def real_patterns(H: int, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Dense head-like patterns [H,B,N,N] float16."""
    B = len(lengths)
    out = np.empty((H, B, N_MAX, N_MAX), np.float16)
    i = np.arange(N_MAX)[:, None]
    j = np.arange(N_MAX)[None, :]
    for h in range(H):
        w_prev, w_bos, w_dec, temp = rng.random(4) * np.array([8, 6, 0.3, 2.0]) + np.array([0, 0, 0, 0.5])
        k = 1 + h % 3
        base = w_prev * (j == i - k) + w_bos * (j == 0) - w_dec * np.abs(i - j)
        logits = base[None] + temp * rng.standard_normal((B, N_MAX, N_MAX))
        out[h] = causal_softmax(logits, lengths)
    return out


def program_block(families: list[tuple[str, float]], ids: list[np.ndarray], lengths: np.ndarray) -> np.ndarray:
    """Normalized program patterns [len(families),B,N,N] float32 for (family, parameter) pairs."""
    B = len(lengths)
    out = np.zeros((len(families), B, N_MAX, N_MAX), np.float32)
    for p, (fam, a) in enumerate(families):
        for b in range(B):
            L = int(lengths[b])
            s = np.zeros((L, L), np.float64)
            r = np.arange(L)
            k = int(a)
            if fam == "prev":
                s[r[k:], r[k:] - k] = 1
            elif fam == "self":
                s[r, r] = 1
            elif fam == "first":
                s[:, 0] = 1
            elif fam == "prev+first":
                s[r[1:], r[1:] - 1] = a
                s[:, 0] += 1 - a
            elif fam == "window":
                for d in range(k + 1):
                    s[r[d:], r[d:] - d] = 1
            elif fam in ("same", "induction"):
                t = ids[b][:L]
                same = (t[:, None] == t[None, :]) & (r[None, :] < r[:, None])
                if fam == "induction":  # key right after an earlier occurrence of the query token
                    same = np.zeros_like(same)
                    same[:, 1:] = (t[:, None] == t[None, :-1]) & (r[None, 1:] <= r[:, None])
                s[same] = 1
            elif fam == "prev+decay":
                s = 0.5 * np.exp(-a * np.abs(r[:, None] - r[None, :]))
                s[r[1:], r[1:] - 1] += 1
            elif fam == "decay":
                s = np.exp(-a * np.abs(r[:, None] - r[None, :]))
            elif fam == "uniform":
                s = np.ones((L, L))
            s = np.tril(s)
            rows = s.sum(-1)
            s[rows == 0, 0] = 1  # empty rows attend to position 0 (the framework's rule)
            out[p, b, :L, :L] = s / s.sum(-1, keepdims=True)
    return out


def as_consumed(cand: np.ndarray, fams: list[tuple[str, float]], lengths: np.ndarray) -> list:
    """Per program, what ``score`` receives: compressed rows for the sparse families, the array for dense ones."""
    return [cand[p] if fam in DENSE else from_dense(cand[p], lengths) for p, (fam, _) in enumerate(fams)]


_PARAMS: dict[str, list[float]] = {
    "prev": [1, 2, 3, 4, 5, 6, 7, 8], "window": [1, 2, 3, 4, 6, 8, 12, 16],
    "prev+first": [0.1, 0.3, 0.5, 0.7, 0.9], "prev+decay": [0.1, 0.2, 0.5, 0.8, 1.5, 3.0],
    "decay": [0.1, 0.2, 0.5, 0.8, 1.5, 3.0],
}
_FAMILIES = ["prev", "self", "first", "prev+first", "window", "same", "induction", "prev+decay", "decay", "uniform"]
DENSE = ("prev+decay", "decay", "uniform")


def families(P: int) -> list[tuple[str, float]]:
    """P (family, parameter) pairs cycling over the 10 families (parameter-free ones repeat)."""
    out = []
    for p in range(P):
        name = _FAMILIES[p % 10]
        params = _PARAMS.get(name, [0.0])
        out.append((name, params[(p // 10) % len(params)]))
    return out


# --------------------------------------------------------------------------- baseline
_TRIL: dict[int, np.ndarray] = {}


def numpy_triple(p: np.ndarray, q: np.ndarray, L: int, frac: float = 0.025) -> tuple[float, float, float]:
    """One (head, program, sequence) triple the per-triple numpy way (reference-implementation style)."""
    mask = _TRIL.get(L)
    if mask is None:
        mask = _TRIL[L] = np.tril(np.ones((L, L), bool))
    p = np.where(mask, p[:L, :L].astype(np.float64), 0.0)   # causal grid only, in float64
    q = np.where(mask, q[:L, :L].astype(np.float64), 0.0)
    iou = np.minimum(p, q).sum() / np.maximum(p, q).sum()
    m = 0.5 * (p + q)
    with np.errstate(divide="ignore", invalid="ignore"):
        kp = np.where(p > 0, p * np.log(p / m), 0.0).sum(-1)
        kq = np.where(q > 0, q * np.log(q / m), 0.0).sum(-1)
    jsd = float(np.sqrt(np.maximum(0.5 * kp + 0.5 * kq, 0.0)).mean())
    k = topq_count(visible_cells(L, True), frac)
    vp, vq = p[mask], q[mask]
    ip = np.argpartition(-vp, k - 1)[:k]
    iq = np.argpartition(-vq, k - 1)[:k]
    sp, sq = set(ip[vp[ip] > 0].tolist()), set(iq[vq[iq] > 0].tolist())
    union = sp | sq
    return float(iou), jsd, (len(sp & sq) / len(union) if union else 1.0)


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--sequences", type=int, default=500)
    ap.add_argument("--block", type=int, default=25, help="programs generated and scored per block")
    ap.add_argument("--sample", type=int, default=400, help="triples timed in the numpy loop")
    ap.add_argument("--cache-programs", type=int, default=20)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    H, P, B = args.heads, args.programs, args.sequences

    ids, source = load_sequences(B, rng)
    lengths = np.array([len(t) for t in ids], dtype=np.int64)
    print(f"workload: {H} heads x {P} programs x {B} sequences ({source}; lengths mean {lengths.mean():.1f}, "
          f"max {lengths.max()}); serial numba kernels")
    t = time.perf_counter()
    real = real_patterns(H, lengths, rng)
    fams = families(P)
    print(f"real patterns float16 {real.nbytes / 2**20:.0f} MiB built in {time.perf_counter() - t:.1f} s")

    # compile (or load from the numba cache) outside the timings
    t = time.perf_counter()
    small = program_block(fams[:2], ids[:3], lengths[:3])
    score_many(np.ascontiguousarray(real[:2, :3]), small, lengths[:3], True)  # same array types as below
    score_many(np.ascontiguousarray(real[:2, :3]), as_consumed(small, fams[:2], lengths[:3]), lengths[:3], True)
    print(f"kernel compile/load: {time.perf_counter() - t:.1f} s (one-off; cached on disk by numba)")

    # ---- batched metrics
    iou = np.zeros((H, P))
    jsd = np.zeros((H, P))
    tq = np.zeros((H, P))
    # heads are fixed while candidate blocks stream past them: validate them / build top-q sets once
    t, c = time.perf_counter(), time.process_time()
    prepared = RealPatterns(real, lengths, True)
    t_score, c_score = time.perf_counter() - t, time.process_time() - c
    t_sparse = 0.0
    nnz = 0
    blocks = []
    for p0 in range(0, P, args.block):
        cand = program_block(fams[p0:p0 + args.block], ids, lengths)
        nnz += int(np.count_nonzero(cand))
        forms = as_consumed(cand, fams[p0:p0 + args.block], lengths)
        t, c = time.perf_counter(), time.process_time()
        res = prepared.score(forms)
        t_score += time.perf_counter() - t
        c_score += time.process_time() - c
        t = time.perf_counter()
        prepared.score(forms, metrics=("iou", "jsd"))
        t_sparse += time.perf_counter() - t
        iou[:, p0:p0 + args.block], jsd[:, p0:p0 + args.block] = res["iou"], res["jsd"]
        tq[:, p0:p0 + args.block] = res["topq"]
        blocks.append((p0, cand if p0 == 0 else None))
    total = H * P * B
    dense_cells = sum(visible_cells(n, True) for n in lengths) * P
    print(f"candidate density: {nnz / dense_cells:.1%} of visible cells non-zero "
          f"({sum(f[0] in DENSE for f in fams)} of {P} programs dense)")
    print(f"score_many (RealPatterns once + .score per block) iou+jsd+topq: {t_score:.2f} s wall, "
          f"{c_score:.2f} s CPU (all threads) for {total:,} triples ({t_score / total * 1e6:.2f} us/triple wall)")
    print(f"  the same with iou+jsd only: {t_sparse:.2f} s wall")

    # ---- per-triple numpy loop on a subsample, extrapolated
    cand0 = blocks[0][1]
    S = args.sample
    hs = rng.integers(0, H, S)
    bs = rng.integers(0, B, S)
    ps = rng.integers(0, cand0.shape[0], S)
    # the first block holds every family (families cycle with period 10), so its mix is the full one
    t, c = time.perf_counter(), time.process_time()
    vals = np.array([numpy_triple(real[h, b], cand0[p, b], int(lengths[b])) for h, p, b in zip(hs, ps, bs)])
    t_loop = (time.perf_counter() - t) / S
    c_loop = (time.process_time() - c) / S
    est, est_c = t_loop * total, c_loop * total
    print(f"numpy per-triple loop: {t_loop * 1e6:.0f} us/triple wall ({c_loop * 1e6:.0f} us CPU) measured on {S} "
          f"random triples -> EXTRAPOLATED to {total:,} triples: {est:.0f} s wall ({est_c:.0f} s CPU)")
    print(f"speedup score_many (all three metrics) vs numpy loop: {est / t_score:.0f}x wall-clock "
          f"(goal >= 100x); {est_c / c_score:.0f}x in CPU time (i.e. single-thread efficiency)")
    # sanity: the loop and score_many agree on the sampled triples (top-q may differ by tie order)
    per = score_many(real[:, :], cand0, lengths, True, per_sequence=True)
    d_iou = np.abs(per["iou"][hs, ps, bs] - vals[:, 0]).max()
    d_jsd = np.abs(per["jsd"][hs, ps, bs] - vals[:, 1]).max()
    print(f"agreement on the sample: max |dIoU| {d_iou:.1e}, max |dJSD| {d_jsd:.1e}")
    # where the time goes: the first block's sparse and dense programs scored separately
    for label, members in (("sparse", [p for p in range(len(cand0)) if fams[p][0] not in DENSE]),
                           ("dense", [p for p in range(len(cand0)) if fams[p][0] in DENSE])):
        sub = as_consumed(np.ascontiguousarray(cand0[members]), [fams[p] for p in members], lengths)
        t = time.perf_counter()
        prepared.score(sub)
        dt = (time.perf_counter() - t) / (H * len(members) * B)
        print(f"  {label} programs only ({len(members)}): {dt * 1e6:.2f} us/triple wall -> {t_loop / dt:.0f}x "
              f"the numpy loop")
    del per, blocks, cand0, real, prepared

    # ---- cache hit vs miss for program_tensors
    seqs = [Sequence(ids=t, tokens=[str(x) for x in t], text=" ".join(str(x) for x in t),
                     offsets=np.zeros((len(t), 2), np.int64)) for t in ids]
    progs = _programs(args.cache_programs, fams)
    timings = {}
    # one result buffer, touched once up front, so that no variant pays the page faults of a fresh 625 MiB
    N = int(lengths.max())
    buf = np.ones((len(progs), B, N, N), np.float32)

    def timed(label, cache):
        t, c = time.perf_counter(), time.process_time()
        out = program_tensors(progs, seqs, causal=True, cache=cache, out=buf)
        timings[label] = (time.perf_counter() - t, time.process_time() - c)
        return out

    with tempfile.TemporaryDirectory() as d:
        cache = TensorCache(max_bytes=4 << 30, directory=d)
        reference = timed("miss", cache).copy()
        timed("hit", cache)
        assert np.array_equal(buf, reference)
        timed("disk", TensorCache(max_bytes=4 << 30, directory=d))
        assert np.array_equal(buf, reference)
        timed("none", None)
        assert np.array_equal(buf, reference)
        del reference
    kind = type(progs[0]).__name__
    fmt = {k: f"{w:.2f} s wall / {c:.2f} s CPU" for k, (w, c) in timings.items()}
    mib = buf.nbytes / 2**20
    print(f"program_tensors {len(progs)} {kind} programs x {B} sequences (result {mib:.0f} MiB):")
    print(f"  no cache {fmt['none']}; miss (compute + store in memory and on disk) {fmt['miss']}")
    print(f"  memory hit {fmt['hit']} ({timings['miss'][0] / timings['hit'][0]:.1f}x faster than a miss, wall); "
          f"disk hit in a fresh cache {fmt['disk']}")


def _programs(count: int, fams):
    """Real DSL programs where headsurgeon/synth/program.py is available (else numpy stand-ins)."""
    try:
        from headsurgeon.synth.program import Program

        texts = ["prev(1)", "prev(2)", "first()", "self()", "0.7*prev(1) + 0.3*first()", "window(0, 3)",
                 "decay(0.5)", "prev(3)", "0.5*self() + 0.5*prev(1)", "0.2*first() + 0.8*prev(2)"]
        out = []
        for i in range(count):
            try:
                out.append(Program.parse(texts[i % len(texts)] if i < len(texts) else
                                         f"{0.1 + 0.8 * i / count:.3f}*prev(1) + {0.9 - 0.8 * i / count:.3f}*first()"))
            except Exception:  # noqa: BLE001 - a primitive the DSL lacks: fall back to a mix
                w = (i + 1) / (count + 2)
                out.append(Program.parse(f"{w:.3f}*prev(1) + {1 - w:.3f}*first()"))
        return out
    except ImportError:
        return [_NumpyProgram(f) for f in fams[:count]]


class _NumpyProgram:
    """Stand-in program evaluating one benchmark family with numpy."""

    def __init__(self, fam) -> None:
        self.fam = fam
        self.hash = f"bench-{fam[0]}-{fam[1]}"

    def evaluate(self, sequences, causal=True):
        lengths = np.array([s.n for s in sequences])
        n = int(lengths.max())
        return program_block([self.fam], [s.ids for s in sequences], lengths)[0, :, :n, :n]


if __name__ == "__main__":
    sys.exit(main())
