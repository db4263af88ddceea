"""Benchmark: how big report.html grows and how fast headless Chromium loads it, for a run of many heads.

Workload: a synthetic attention store whose heads are known DSL programs (``--layers`` x ``--heads``, default
30 x 9 = 270 heads, SmolLM2-135M's shape), ``--windows`` word-level windows of 20-64 tokens (BOS first) split
into synth / select / test; per head a replacement (the true program), an explanation (a simpler program) and a
frontier point, scored on select and test like ``select_programs`` scores them. ``write_report`` then writes the
page: per head the shared example window's PNG heatmaps, three test windows (best, median, worst) in the compact
encoding of headsurgeon/report/windows.py, the candidates table and the frontier.

Prints: the report's bytes, bytes per head (the difference to a one-head report, spread over the other heads),
the bytes the windows view and the candidates table take per head, the time to write it, and the page's load
time in headless Chromium (``performance`` timing of the load event, after the windows' script ran; median of
``--loads``), and the same page's load without the windows' script (what drawing them adds). Record ``uptime``'s
load average beside the figures (the machine is shared).

Run: ``python benchmarks/report_size.py [--layers 30 --heads 9 --windows 60 --loads 3]``.
Measured figures: benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from headsurgeon.report import write_report
from headsurgeon.synth.program import READABLE_CHARS, Program
from headsurgeon.synth.programset import ProgramSet
from headsurgeon.synth.scored import ScoredProgram
from headsurgeon.synth.select import score_programs
from headsurgeon.synth.sequence import Sequence
from headsurgeon.synth.program_store import ProgramStore
from headsurgeon.synth.vocab import Vocabulary

WORDS = ("the cat sat on a mat . Lily saw big dog and ran to park she said hello with her friend "
         "they played ball in sun ; then went home happy").split()
VOCAB = Vocabulary(["<s>"] + [f"\u2581{w}" for w in dict.fromkeys(WORDS)])
IDS = {w: i + 1 for i, w in enumerate(dict.fromkeys(WORDS))}
TRUTHS = ("0.7*prev(1) + 0.3*first()", "fallback(same_token_recent(), first())", "0.5*prev(2) + 0.5*first()",
          "gate(punct, first(), 0.6*prev(1) + 0.4*self())", "0.8*induction() + 0.2*first()",
          "0.6*first() + 0.4*window(1, 3)")
SIMPLE = ("prev(1)", "first()", "prev(2)", "first()", "induction()", "first()")


def sequences(count: int, seed: int = 0) -> list[Sequence]:
    """Word-level windows of 20-64 tokens, BOS first."""
    rng = np.random.default_rng(seed)
    out = []
    for doc in range(count):
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), int(rng.integers(19, 64)))]
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        offsets = [(0, 0)] + [(int(s), int(s) + len(w)) for s, w in zip(starts, words)]
        out.append(Sequence(ids=np.array([0] + [IDS[w] for w in words]), tokens=["<s>"] + [f"\u2581{w}" for w in words],
                            text=" ".join(words), offsets=np.array(offsets), doc=doc, has_bos=True))
    return out


def build(layers: int, heads: int, windows: int) -> tuple[ProgramSet, ProgramStore, dict[str, list[int]]]:
    """The ProgramSet and store of ``layers`` x ``heads`` known heads."""
    keys = [(layer, h) for layer in range(layers) for h in range(heads)]
    truth = {k: Program.parse(TRUTHS[n % len(TRUTHS)]) for n, k in enumerate(keys)}
    store = ProgramStore(sequences(windows), truth)
    third = windows // 3
    split = {"synth": list(range(third)), "select": list(range(third, 2 * third)),
             "test": list(range(2 * third, windows))}
    ps = ProgramSet(model="synthetic")
    for n, k in enumerate(keys):
        texts = (SIMPLE[n % len(SIMPLE)], "0.5*prev(1) + 0.5*first()", TRUTHS[n % len(TRUTHS)])
        progs = [Program.parse(t) for t in texts]
        got = {s: score_programs(store, [k], progs, split[s]) for s in ("select", "test")}
        scores = [{s: {m: float(v[0, c]) for m, v in got[s].items()} for s in got} for c in range(3)]
        ex = ScoredProgram.of(progs[0], "enumerative", scores[0], VOCAB, budget=READABLE_CHARS)
        near = ScoredProgram.of(progs[1], "library", scores[1], VOCAB, budget=40)
        rep = ScoredProgram.of(progs[2], "enumerative", scores[2], VOCAB)
        ps.add(k, progs[2], "enumerative", scores[2], explanation=ex, frontier=[ex, near, rep], vocab=VOCAB)
    return ps, store, split


def chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


PROBE = ("<script>window.addEventListener('load', function () { setTimeout(function () {"
         " var t = performance.getEntriesByType('navigation')[0];"
         " document.body.setAttribute('data-load-ms', String(Math.round(t.loadEventEnd)));"
         " document.body.setAttribute('data-canvases', String(document.querySelectorAll('canvas').length));"
         " }, 0); });</script>")


WINDOWS_SCRIPT = re.compile(r"<script type='application/json' id='hs-tokens'>.*?</script>\n<script>.*?</script>",
                            re.S)


def load_ms(page: Path, browser: str, profile: Path, draw: bool = True) -> tuple[float, int, float]:
    """(load event end in ms, canvases drawn, wall seconds of the headless run) for one load of ``page``;
    ``draw=False`` loads it without the windows' script (what drawing the windows adds to the load)."""
    probe = page.with_name("probe.html")
    text = page.read_text(encoding="utf-8")
    text = text if draw else WINDOWS_SCRIPT.sub("", text)
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--virtual-time-budget=30000", "--dump-dom"]
    t0 = time.perf_counter()
    dom = subprocess.run([browser, *flags, probe.resolve().as_uri()], capture_output=True, text=True,
                         timeout=300).stdout
    wall = time.perf_counter() - t0
    ms = re.search(r'data-load-ms="(\d+)"', dom)
    canv = re.search(r'data-canvases="(\d+)"', dom)
    return (float(ms.group(1)) if ms else float("nan"), int(canv.group(1)) if canv else -1, wall)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--windows", type=int, default=60)
    ap.add_argument("--loads", type=int, default=3)
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    out = Path(tempfile.mkdtemp(prefix="report-size-"))
    ps, store, split = build(args.layers, args.heads, args.windows)
    n = len(ps)
    one = write_report(out / "one.html", ps.subset([next(iter(ps.entries))]), store, split,
                       vocab=VOCAB).stat().st_size
    t0 = time.perf_counter()
    page = write_report(out / "report.html", ps, store, split, vocab=VOCAB)
    write_s = time.perf_counter() - t0
    text = page.read_text(encoding="utf-8")
    size = page.stat().st_size
    wins = sum(len(m) for m in re.findall(r"<div class='wins'.*?</div></div>", text))
    cands = sum(len(m) for m in re.findall(r"<details class='cands'>.*?</details>", text))
    tokens = len(re.search(r"<script type='application/json' id='hs-tokens'>.*?</script>", text).group(0))
    print(f"heads {n}, test windows {len(split['test'])}")
    print(f"report bytes {size:,} ({size / 2**20:.2f} MiB); one-head report {one:,}")
    print(f"bytes per head {(size - one) / max(n - 1, 1):,.0f}: windows view {wins / n:,.0f}, candidates table "
          f"{cands / n:,.0f}; the page's token table {tokens:,} in all")
    print(f"write_report {write_s:.1f} s")
    browser = chromium()
    if browser is None:
        print("headless Chromium not installed: no load time")
    else:
        runs = [load_ms(page, browser, out / f"profile{k}") for k in range(args.loads)]
        print(f"Chromium load event {statistics.median(r[0] for r in runs):,.0f} ms (median of {len(runs)}: "
              f"{', '.join(f'{r[0]:.0f}' for r in runs)}), canvases drawn {runs[0][1]}, headless run wall "
              f"{statistics.median(r[2] for r in runs):.1f} s")
        bare = [load_ms(page, browser, out / f"bare{k}", draw=False) for k in range(args.loads)]
        print(f"the same page without the windows' script: load event {statistics.median(r[0] for r in bare):,.0f} ms "
              f"(median of {len(bare)}), canvases drawn {bare[0][1]}")
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
