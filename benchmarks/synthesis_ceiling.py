"""Benchmark: how much of stories260K's heads can token-level programs explain at best?

Not a searcher: free-form softmax models fitted by gradient descent (Adam, full batch) to each head's
real patterns on ``synth`` windows, scored by soft IoU on ``test`` windows, as an upper bound for the
DSL programs of ``benchmarks/synthesis.py`` built on the same features:

* ``base``: offset logit (0..47, tail, first key) + key-token logit, times a per-query-token
  temperature (what ``mul(profile, key_weight)`` under ``sharpen(.., by=..)`` can express);
* ``pairs``: + a rank-4 query-token x key-token bilinear term (what ``class_weight`` tables approximate);
* ``context``: + rank-4 terms between each side's token and the other side's *previous* token, and a
  key previous-token logit (the information layer-0 previous-token heads pass on).

Run: ``python benchmarks/synthesis_ceiling.py [--synth 120 --test 60 --every 5 --steps 150]``
(``--every k``: every k-th head of the 40).

Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CORPUS = SHARED / "corpora" / "tinystories-valid.txt"
MODEL = SHARED / "models" / "stories260K" / "stories260K.bin"
TOKENIZER = SHARED / "models" / "stories260K" / "tok512.model"
OFFSETS = 48
KINDS = ("base", "pairs", "context")


def padded(store, idx, head):
    """Real patterns [B, N, N], lengths [B] and token ids [B, N] (torch) of store sequences."""
    import torch

    real, lengths = store.batch(idx, [head])
    ids = np.zeros(real.shape[1:3], dtype=np.int64)
    for b, i in enumerate(idx):
        seq = store.sequences[i]
        ids[b, :seq.n] = np.asarray(seq.ids)
    return torch.tensor(real[0], dtype=torch.float32), torch.tensor(lengths), torch.tensor(ids)


def fit_and_score(kind: str, train, test, vocab: int, steps: int, rank: int = 4) -> float:
    """Fit one model kind on ``train`` by cross-entropy to the real rows; mean soft IoU on ``test``."""
    import torch

    torch.manual_seed(0)
    small = lambda: (0.1 * torch.randn(vocab, rank)).requires_grad_()  # noqa: E731
    off = torch.zeros(OFFSETS + 2, requires_grad=True)
    key = torch.zeros(vocab, requires_grad=True)
    temp = torch.zeros(vocab, requires_grad=True)
    params = [off, key, temp]
    if kind in ("pairs", "context"):
        U, W = small(), small()
        params += [U, W]
    if kind == "context":
        Uq, Wkp, Uqp, Wk = small(), small(), small(), small()
        key_prev = torch.zeros(vocab, requires_grad=True)
        params += [Uq, Wkp, Uqp, Wk, key_prev]

    def predict(lengths, ids):
        n = ids.shape[1]
        ar = torch.arange(n)
        d = ar[:, None] - ar[None, :]
        vis = (ar[None, :, None] < lengths[:, None, None]) & (d[None] >= 0)
        bucket = d.clamp(0, OFFSETS).expand(ids.shape[0], n, n).clone()
        bucket[:, :, 0] = OFFSETS + 1
        logits = off[bucket] + key[ids][:, None, :]
        if kind in ("pairs", "context"):
            logits = logits + torch.einsum("bir,bjr->bij", U[ids], W[ids])
        if kind == "context":
            prev = torch.cat([torch.zeros_like(ids[:, :1]), ids[:, :-1]], 1)
            logits = logits + torch.einsum("bir,bjr->bij", Uq[ids], Wkp[prev]) \
                + torch.einsum("bir,bjr->bij", Uqp[prev], Wk[ids]) + key_prev[prev][:, None, :]
        logits = (logits * torch.exp(temp[ids])[:, :, None]).masked_fill(~vis, -1e9)
        return torch.softmax(logits, -1) * vis.any(-1, keepdim=True), vis

    real, lengths, ids = train
    opt = torch.optim.Adam(params, lr=0.05)
    for _ in range(steps):
        pred, vis = predict(lengths, ids)
        loss = -(real * torch.log(pred + 1e-9)).masked_fill(~vis, 0).sum() / lengths.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    real, lengths, ids = test
    with torch.no_grad():
        pred, vis = predict(lengths, ids)
        inter = torch.minimum(pred, real).masked_fill(~vis, 0).sum((1, 2))
        union = torch.maximum(pred, real).masked_fill(~vis, 0).sum((1, 2))
        return float((inter / union).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", type=int, default=120)
    ap.add_argument("--test", type=int, default=60)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not CORPUS.exists() or not MODEL.exists():
        print(f"skipped: {SHARED} is absent (the ../shared data beside the checkout)")
        return 0

    import torch

    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import make_sequences, read_documents, split_sequences
    from headsurgeon.surgery.models.loading import load_model

    torch.set_num_threads(2)
    model = load_model(f"llama2c:{MODEL}", tokenizer=TOKENIZER)
    splits = split_sequences(make_sequences(model, read_documents(CORPUS), max_len=128), (0.6, 0.2, 0.2), args.seed)
    rng = np.random.default_rng(args.seed)
    synth = [splits.synth[i] for i in np.sort(rng.permutation(len(splits.synth))[:args.synth])]
    test = [splits.test[i] for i in np.sort(rng.permutation(len(splits.test))[:args.test])]
    store = capture(model, synth + test, progress=False)
    train_idx, test_idx = list(range(len(synth))), list(range(len(synth), len(synth) + len(test)))
    vocab = int(model.tokenizer.vocab_size) if getattr(model, "tokenizer", None) is not None else 512
    vocab = max(vocab, 1 + max(int(np.max(s.ids)) for s in synth + test))
    heads = store.heads[::args.every]
    scores = np.zeros((len(heads), len(KINDS)))
    t0 = time.perf_counter()
    print(f"{len(heads)} heads; fit on {len(synth)} windows, test IoU on {len(test)}")
    print("head    " + "  ".join(f"{k:>7s}" for k in KINDS))
    for h, head in enumerate(heads):
        train, held = padded(store, train_idx, head), padded(store, test_idx, head)
        scores[h] = [fit_and_score(kind, train, held, vocab, args.steps) for kind in KINDS]
        print(f"L{head[0]}H{head[1]}    " + "  ".join(f"{v:7.3f}" for v in scores[h]), flush=True)
    print("mean    " + "  ".join(f"{v:7.3f}" for v in scores.mean(axis=0)))
    print(f"wall {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
