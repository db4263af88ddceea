"""How many of EAPS's own programs run, unchanged, on a model's windows: the seed paper's
library files, read as they are (docs/library-format.md).

Reads each file with headsurgeon/synth/eaps.py (no program budget), runs every accepted program in the sandbox on the
first WINDOWS windows of a corpus and counts the programs that give a pattern on every window, grouped by the
first error of the others. Usage:
    python benchmarks/eaps_runnable.py MODEL CORPUS OUT.json [FILE.py ...] [--windows 8] [--max-len 128]
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path

from headsurgeon.surgery.corpus import make_sequences, read_documents
from headsurgeon.surgery.models.loading import load_model
from headsurgeon.synth.eaps import read_library
from headsurgeon.synth.sandbox import get_pool


def _kind(message: str) -> str:
    """An error without its sequence number, line and quoted text, so that equal causes group."""
    m = re.sub(r"^sequence \d+: ", "", message)
    m = re.sub(r" \(at line \d+.*$", "", m)
    m = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", m)
    return m[:160]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=10.0)
    a = ap.parse_args()
    handle = load_model(a.model)
    windows = make_sequences(handle, read_documents(a.corpus), max_len=a.max_len, max_sequences=a.windows)
    report = {"model": handle.name, "windows": len(windows), "files": {}}
    pool = get_pool()
    for f in a.files:
        t0 = time.perf_counter()
        load = read_library(f, max_programs=None)
        ran, errors = 0, Counter()
        for lp in load.programs:
            got = pool.run(lp.program.text, windows, a.timeout)
            bad = [g for g in got if isinstance(g, Exception)]
            if bad:
                errors[_kind(str(bad[0]))] += 1
            else:
                ran += 1
        report["files"][Path(f).name] = {
            "functions": load.functions, "accepted": len(load.programs), "refused": len(load.refused),
            "refused_reasons": Counter(why[:160] for _, why in load.refused).most_common(),
            "ran_on_every_window": ran, "failed": sum(errors.values()), "errors": errors.most_common(),
            "seconds": round(time.perf_counter() - t0, 1)}
        print(Path(f).name, {k: v for k, v in report["files"][Path(f).name].items() if "reasons" not in k
                             and k != "errors"}, flush=True)
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
