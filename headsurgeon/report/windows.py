"""Several test windows per head in report.html: the shown program's best, median and worst window by IoU (on the
crop the page draws), switchable without reloading, with the windows' tokens as strings.

Each map travels as one byte per visible cell (base64, scaled to the window's largest value) and a small script
draws it on a canvas; the tokens of a window are written once for the whole page. A head costs a few kilobytes,
so a report of hundreds of heads stays light (benchmarks/report_size.py measures it).
"""
from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from headsurgeon.synth.metrics import score_many

from .plots import CELL, DIVERGING, SEQUENTIAL

if TYPE_CHECKING:  # importing the searchers' package registers them all: the report needs only the protocol
    from headsurgeon.synth.search.base import PatternReader

#: how the chosen windows are labelled, from the best IoU to the worst
LABELS = ("best", "median", "worst")


@dataclass
class Window:
    """One test window of one head: where it is, how the program did on it, and the maps drawn from it."""

    index: int
    n: int
    label: str
    iou: float
    maps: dict[str, np.ndarray] = field(default_factory=dict)
    causal: bool = True


def _crop(pats: np.ndarray, seqs: list[Any], max_tokens: int) -> list[np.ndarray]:
    return [np.asarray(pats[b, :m, :m], dtype=np.float32) for b, m in
            enumerate(min(s.n, max_tokens) for s in seqs)]


def _program_maps(program: Any, seqs: list[Any], causal: bool, max_tokens: int) -> list[np.ndarray] | None:
    """A program's patterns on ``seqs``, cropped; None when it cannot run here (a report never fails on one)."""
    try:
        return _crop(program.evaluate(seqs, causal=causal), seqs, max_tokens)
    except Exception:  # noqa: BLE001 - an unrunnable program shows no windows rather than breaking the page
        return None


class RealCrops:
    """The real patterns of the looked-at windows, cropped, read once per window for every head (a store's
    ``patterns(index)`` decodes all heads of a window at once; reading it per head would repeat that work)."""

    def __init__(self, store: PatternReader, max_tokens: int) -> None:
        self.store, self.max_tokens = store, max_tokens
        self._windows: dict[int, np.ndarray] = {}

    def get(self, index: int, head: tuple[int, int]) -> np.ndarray:
        """Head ``head``'s real pattern on window ``index``, its first ``max_tokens`` tokens."""
        m = min(self.store.sequences[index].n, self.max_tokens)
        if not hasattr(self.store, "patterns"):
            return np.asarray(self.store.pattern(index, *head), dtype=np.float32)[:m, :m]
        if index not in self._windows:
            self._windows[index] = np.array(self.store.patterns(index)[:, :, :m, :m], dtype=np.float32)
        return self._windows[index][head[0], head[1]]


def _ious(real: list[np.ndarray], prog: list[np.ndarray], causal: bool) -> list[float]:
    """Soft IoU of each (real, program) crop pair, in one scoring pass over the padded crops."""
    width = max(r.shape[0] for r in real)
    pads = [np.zeros((len(real), width, width), dtype=np.float32) for _ in range(2)]
    for b, (r, p) in enumerate(zip(real, prog)):
        pads[0][b, : r.shape[0], : r.shape[0]], pads[1][b, : p.shape[0], : p.shape[0]] = r, p
    got = score_many(pads[0][None], pads[1][None], [r.shape[0] for r in real], causal, ("iou",), per_sequence=True,
                     check=False)  # the store and the program were checked when they were scored
    return [float(x) for x in got["iou"][0, 0]]


def choose(v: Any, store: PatternReader, test_idx: list[int], max_tokens: int = 24, look: int = 30,
           cache: dict[str, list[np.ndarray] | None] | None = None, reals: RealCrops | None = None) -> list[Window]:
    """The best, median and worst of the first ``look`` test windows for head ``v`` (a ``heads.HeadView``), by the
    IoU of its explanation (else its replacement) on the first ``max_tokens`` tokens; fewer when fewer exist.

    ``cache`` keeps a program's cropped patterns by hash, so a program shared by many heads runs once.
    """
    idx = list(test_idx[:look])
    shown = v.explanation or v.replacement
    if not idx or shown is None:
        return []
    cache = {} if cache is None else cache
    reals = RealCrops(store, max_tokens) if reals is None else reals
    seqs = [store.sequences[i] for i in idx]
    key = shown.program.hash
    if key not in cache:
        cache[key] = _program_maps(shown.program, seqs, store.causal, max_tokens)
    prog = cache[key]
    if prog is None:
        return []
    real = [reals.get(i, v.head) for i in idx]
    ious = _ious(real, prog, store.causal)
    order = sorted(range(len(idx)), key=lambda k: (-ious[k], -real[k].shape[0], k))
    picks = list(dict.fromkeys([order[0], order[len(order) // 2], order[-1]]))  # fewer windows: each once
    labels = {3: LABELS, 2: (LABELS[0], LABELS[2]), 1: ("only",)}[len(picks)]
    name = "explanation" if v.explanation is not None else "replacement"
    out = []
    for k, label in zip(picks, labels):
        maps = {"real": real[k], name: prog[k]}
        if name == "explanation" and not v.same():
            rep = _program_maps(v.replacement.program, [seqs[k]], store.causal, max_tokens)
            if rep is not None:
                maps["replacement"] = rep[0]
        out.append(Window(idx[k], real[k].shape[0], label, ious[k], maps, bool(store.causal)))
    return out


def add_windows(views: list[Any], store: PatternReader, test_idx: list[int], max_tokens: int = 24, look: int = 30) -> None:
    """Attach each head's chosen windows (``choose``) to its ``HeadView.windows``, programs run once per hash."""
    cache: dict[str, list[np.ndarray] | None] = {}
    reals = RealCrops(store, max_tokens)
    for v in views:
        v.windows = choose(v, store, test_idx, max_tokens, look, cache, reals)


def encode(matrix: np.ndarray, top: float, causal: bool) -> str:
    """The visible cells (causal: the lower triangle, row by row) as bytes 0..255 of ``top``, in base64."""
    m = np.clip(np.asarray(matrix, dtype=np.float64) / (top or 1.0), 0.0, 1.0)
    cells = m[np.tril_indices(m.shape[0])] if causal else m.reshape(-1)
    return base64.b64encode(np.round(cells * 255).astype(np.uint8).tobytes()).decode()


def decode(text: str, n: int, causal: bool, top: float) -> np.ndarray:
    """``encode``'s inverse (to 1/255 of ``top``): the [n, n] map."""
    cells = np.frombuffer(base64.b64decode(text), dtype=np.uint8).astype(np.float64) / 255 * top
    out = np.zeros((n, n))
    if causal:
        out[np.tril_indices(n)] = cells
    else:
        out[:] = cells.reshape(n, n)
    return out


def windows_html(windows: list[Window]) -> str:
    """One head's windows: a button per window (label and IoU) and the encoded maps the script draws."""
    if not windows:
        return ""
    causal = windows[0].causal
    buttons, bodies = [], []
    for k, w in enumerate(windows):
        top = max(float(m.max()) for m in w.maps.values() if m.size) or 1.0
        data = " ".join(f"data-{name}='{encode(m, top, causal)}'" for name, m in w.maps.items())
        buttons.append(f"<button type='button' class='wbtn{' on' if k == 0 else ''}' data-k='{k}'>"
                       f"{html.escape(w.label)}: window {w.index}, IoU {w.iou:.2f}</button>")
        bodies.append(f"<div class='win' data-w='{w.index}' data-n='{w.n}' data-top='{top:.4g}' "
                      f"data-maps='{' '.join(w.maps)}' {data}{'' if k == 0 else ' hidden'}></div>")
    return (f"<div class='wins' data-causal='{int(causal)}'><div class='small'>{len(windows)} test windows "
            f"(the program's {', '.join(w.label for w in windows)} by IoU on the first tokens): "
            f"{' '.join(buttons)}</div>{''.join(bodies)}</div>")


def _lut(cmap: str, stops: int = 64) -> str:
    """A matplotlib colormap as ``stops`` hex colours in one string (the script interpolates nothing)."""
    import matplotlib

    cm = matplotlib.colormaps[cmap]
    return "".join("%02x%02x%02x" % tuple(round(255 * c) for c in cm(i / (stops - 1))[:3]) for i in range(stops))


def tokens_json(windows: list[list[Window]], store: PatternReader) -> str:
    """The tokens of every window shown, once for the page, as JSON safe inside a script element."""
    seen = sorted({w.index for ws in windows for w in ws})
    table = {str(i): [str(t) for t in store.sequences[i].tokens[: max(w.n for ws in windows for w in ws
                                                                          if w.index == i)]] for i in seen}
    return json.dumps(table, ensure_ascii=False).replace("<", "\\u003c")  # nothing in it can close the script


WINDOWS_STYLE = """
.wins { margin: .4em 0; } .wins .wbtn { font-size: 11px; margin: 0 2px; } .wins .wbtn.on { font-weight: bold; }
.wtoks { font-family: monospace; font-size: 11px; margin: .3em 0; max-width: 62em; }
.wtoks span { background: #eef; margin: 0 1px; padding: 0 2px; border-radius: 2px; white-space: pre; }
.wmaps { display: flex; gap: 14px; flex-wrap: wrap; } .wmaps canvas { image-rendering: pixelated; display: block; }
"""


def windows_script(windows: list[list[Window]], store: PatternReader) -> str:
    """The page's token table and the script that draws a head's window when shown (the first on load)."""
    if not any(windows):
        return ""
    return ("<script type='application/json' id='hs-tokens'>" + tokens_json(windows, store) + "</script>\n"
            "<script>\n(function () {\n"
            f"  var CELL = {CELL}, SEQ = '{_lut(SEQUENTIAL)}', DIV = '{_lut(DIVERGING)}';\n"
            + _SCRIPT + "})();\n</script>")


# draws one window: its tokens as strings, then real, program(s) and program - real on canvases
_SCRIPT = r"""
  var TOK = JSON.parse(document.getElementById('hs-tokens').textContent);
  var NAMES = {real: 'real attention', explanation: 'explanation', replacement: 'replacement'};
  function colour(lut, t) {
    var i = Math.max(0, Math.min(63, Math.round(t * 63))) * 6;
    return [parseInt(lut.substr(i, 2), 16), parseInt(lut.substr(i + 2, 2), 16), parseInt(lut.substr(i + 4, 2), 16)];
  }
  function cells(text, n, causal, top) {
    var raw = atob(text), out = new Array(), k = 0;
    for (var i = 0; i < n; i++) {
      out.push(new Array());
      for (var j = 0; j < n; j++) {
        out[i].push(causal && j > i ? 0 : raw.charCodeAt(k++) / 255 * top);
      }
    }
    return out;
  }
  function figure(title, m, n, lut, lo, hi) {
    var f = document.createElement('figure'), c = document.createElement('canvas');
    f.className = 'map';
    var cap = document.createElement('figcaption');
    cap.textContent = title;
    c.width = c.height = n;  // one pixel per cell, scaled up by CSS (pixelated)
    c.style.width = c.style.height = (n * CELL) + 'px';
    var g = c.getContext('2d'), img = g.createImageData(n, n);
    for (var i = 0; i < n; i++) {
      for (var j = 0; j < n; j++) {
        var rgb = colour(lut, (m[i][j] - lo) / (hi - lo || 1)), o = 4 * (i * n + j);
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    g.putImageData(img, 0, 0);
    f.appendChild(cap); f.appendChild(c);
    return f;
  }
  function draw(win, causal) {
    if (win.dataset.drawn) { return; }
    var n = +win.dataset.n, top = +win.dataset.top, toks = (TOK[win.dataset.w] || new Array()).slice(0, n);
    var line = document.createElement('div');
    line.className = 'wtoks';
    toks.forEach(function (t) {
      var s = document.createElement('span');
      s.textContent = t.replace(/\u2581|\u0120/g, '_').replace(/\n|\u010a/g, '\u21b5');
      line.appendChild(s);
    });
    var maps = {}, row = document.createElement('div');
    row.className = 'wmaps';
    win.dataset.maps.split(' ').forEach(function (name) {
      maps[name] = cells(win.dataset[name], n, causal, top);
      row.appendChild(figure(NAMES[name] || name, maps[name], n, SEQ, 0, top));
    });
    var other = maps.explanation || maps.replacement;
    if (other) {
      var d = new Array(), lim = 1e-3;
      for (var i = 0; i < n; i++) {
        d.push(new Array());
        for (var j = 0; j < n; j++) {
          d[i].push(other[i][j] - maps.real[i][j]);
          lim = Math.max(lim, Math.abs(d[i][j]));
        }
      }
      row.appendChild(figure('program \u2212 real (red: the program attends more)', d, n, DIV, -lim, lim));
    }
    win.appendChild(line); win.appendChild(row);
    win.dataset.drawn = '1';
  }
  document.querySelectorAll('div.wins').forEach(function (box) {
    var causal = box.dataset.causal === '1', wins = box.querySelectorAll('div.win');
    var buttons = box.querySelectorAll('button.wbtn');
    draw(wins[0], causal);
    buttons.forEach(function (b) {
      b.addEventListener('click', function () {
        wins.forEach(function (w, k) { w.hidden = k !== +b.dataset.k; });
        buttons.forEach(function (o) { o.classList.toggle('on', o === b); });
        draw(wins[+b.dataset.k], causal);
      });
    });
  });
"""
