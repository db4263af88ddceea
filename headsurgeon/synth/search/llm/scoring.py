"""Scoring the agent's programs for one head: patterns (DSL kernels, or the sandbox for Python programs), JSD and
IoU on synth, IoU on select, and the feedback that shows the model where its best programs go wrong."""
from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....kernels.normalize import normalize_scores
from ....kernels.sparse import SparseRows
from . import prompts
from ...scored import ScoredProgram
from ...errors import ProgramExecutionError
from ...metrics import score_many
from ...program import Program
from ...sequence import Sequence
from ...tensors import ProgramTensor, program_patterns
from ..base import PatternSource
from .config import SOURCE, AgentConfig, AgentStats
from .transport import excerpt
from ....core import Head

#: numba kernels (DSL evaluation, normalization, metrics) run one call at a time across agent threads:
#: numba's default threading layer does not support concurrent parallel launches from several threads.
NUMBA_LOCK = threading.Lock()


@dataclass
class SynthFit:
    """A candidate scored on synth, with what its feedback needs: JSD per synth sequence and (for the programs
    shown as feedback) its synth patterns [B, N, N], dense or sparse (``synth.tensors.program_patterns``)."""

    candidate: ScoredProgram
    seq_jsd: np.ndarray
    pattern: ProgramTensor | None

    @property
    def program(self) -> Program:
        """The scored program."""
        return self.candidate.program

    @property
    def hypothesis(self) -> str:
        """The model's hypothesis for it."""
        return self.candidate.hypothesis

    @property
    def jsd(self) -> float:
        """Mean JSD on synth."""
        return self.candidate.scores["synth"]["jsd"]

    @property
    def iou(self) -> float:
        """Mean soft IoU on synth."""
        return self.candidate.scores["synth"]["iou"]


@dataclass
class HeadContext:
    """What every head of one run shares: the store, the splits, the system prompt and the request pool."""

    store: PatternSource
    causal: bool
    synth_idx: list[int]
    select_idx: list[int]
    synth_seqs: list[Sequence]
    select_seqs: list[Sequence]
    system: str
    pool: ThreadPoolExecutor


class ProgramScoring:
    """The scoring side of :class:`~headsurgeon.synth.search.llm.agent.LLMAgent` (a mixin: it uses the agent's
    ``config``, ``stats``, ``_lock``, ``_store_lock`` and ``_event``)."""

    config: AgentConfig
    stats: AgentStats
    _lock: threading.Lock
    _store_lock: threading.Lock
    _event: Callable[[dict[str, Any]], None]

    def _patterns(self, program: Program, seqs: list[Sequence], causal: bool) -> ProgramTensor:
        """Normalized patterns [B, N, N] (sparse DSL programs as ``SparseRows``); Python programs run in the
        sandbox outside the numba lock."""
        if program.sandboxed:
            scores = program.evaluate_scores(seqs, causal, timeout=self.config.program_timeout)
            lengths = np.array([s.n for s in seqs], dtype=np.int64)
            with NUMBA_LOCK:
                return np.asarray(normalize_scores(scores, lengths, causal), dtype=np.float32)
        with NUMBA_LOCK:
            return program_patterns(program, seqs, causal)

    def _try_patterns(self, program: Program, seqs: list[Sequence], causal: bool, head: tuple[int, int],
                      failures: list[dict[str, Any]], split: str) -> ProgramTensor | None:
        try:
            return self._patterns(program, seqs, causal)
        except Exception as e:  # noqa: BLE001 - e.g. a feature view that needs a missing spaCy model
            error: Exception = e
        reason = error.reason if isinstance(error, ProgramExecutionError) else "error"
        local = str(error) if isinstance(error, ProgramExecutionError) else f"{type(error).__name__}: {error}"
        with self._lock:
            self.stats.failed_programs += 1
            self.stats.failure_reasons[reason] += 1
        failures.append({"kind": program.kind, "text": program.text, "reason": reason,
                         "message": prompts.failure_feedback(error, program.text)})
        self._event({"event": "program_failed", "head": Head.label(head), "split": split, "reason": reason,
                     "hash": program.hash, "message": excerpt(local, 500)})
        return None

    def _score_synth(self, programs: list[tuple[Program, str]], real: np.ndarray, lengths: np.ndarray,
                     ctx: HeadContext, head: tuple[int, int], failures: list[dict[str, Any]]) -> list[SynthFit]:
        ok: list[tuple[Program, str, ProgramTensor]] = []
        for prog, hyp in programs:
            pat = self._try_patterns(prog, ctx.synth_seqs, ctx.causal, head, failures, "synth")
            if pat is not None:
                ok.append((prog, hyp, pat))
        if not ok:
            return []
        cand = [pad_to(p, real.shape[-1]) for _, _, p in ok]
        with NUMBA_LOCK:
            sc = score_many(real, cand, lengths, ctx.causal, metrics=("jsd", "iou"), per_sequence=True)
        out = []
        for k, (prog, hyp, pat) in enumerate(ok):
            seq_jsd = np.asarray(sc["jsd"][0, k], dtype=np.float64)
            scores = {"synth": {"jsd": float(seq_jsd.mean()), "iou": float(np.mean(sc["iou"][0, k]))}}
            out.append(SynthFit(ScoredProgram(prog, SOURCE, scores, hyp), seq_jsd, pat))
        return out

    def _score_select(self, head: tuple[int, int], attempts: list[SynthFit], ctx: HeadContext,
                      failures: list[dict[str, Any]]) -> list[ScoredProgram]:
        if not attempts:
            return []
        with self._store_lock:
            real, lengths = ctx.store.batch(ctx.select_idx, [head])
        real = np.asarray(real, dtype=np.float32)
        ok: list[tuple[SynthFit, ProgramTensor]] = []
        for a in attempts:
            pat = self._try_patterns(a.program, ctx.select_seqs, ctx.causal, head, failures, "select")
            if pat is not None:
                ok.append((a, pat))
        if not ok:
            return []
        cand = [pad_to(p, real.shape[-1]) for _, p in ok]
        with NUMBA_LOCK:
            sc = score_many(real, cand, lengths, ctx.causal, metrics=("iou", "jsd"))
        cands = []
        for k, (a, _) in enumerate(ok):
            cands.append(ScoredProgram(a.program, SOURCE, hypothesis=a.hypothesis, scores={
                "synth": {"jsd": a.jsd, "iou": a.iou},
                "select": {"iou": float(sc["iou"][0, k]), "jsd": float(sc["jsd"][0, k])},
            }))
        cands.sort(key=lambda c: (-c.scores["select"]["iou"], c.scores["synth"]["jsd"]))
        return cands

    def _feedback(self, attempts: list[SynthFit], failures: list[dict[str, Any]], real: np.ndarray,
                  lengths: np.ndarray, ctx: HeadContext) -> str:
        cfg = self.config
        shown = []
        for a in attempts[: cfg.refine_top]:
            if a.pattern is None:
                continue
            worst = np.argsort(-a.seq_jsd, kind="stable")[: cfg.feedback_sequences]
            seqs = []
            for b in worst:
                n = int(lengths[b])
                p, q = real[0, b, :n, :n], _sequence(a.pattern, int(b))[:n, :n]
                if ctx.causal:
                    p, q = np.tril(p), np.tril(q)
                rows_jsd = prompts.row_jsd(p, q)
                rows = [(int(i), prompts.top_keys(p[i]), prompts.top_keys(q[i]))
                        for i in np.argsort(-rows_jsd, kind="stable")[: cfg.feedback_rows] if rows_jsd[i] > 1e-6]
                rows.sort()
                seqs.append({"seq": ctx.synth_seqs[b], "jsd": float(a.seq_jsd[b]), "rows": rows})
            shown.append({"kind": a.program.kind, "text": a.program.text, "hypothesis": a.hypothesis,
                          "jsd": a.jsd, "iou": a.iou, "sequences": seqs})
        others = [{"kind": a.program.kind, "text": a.program.text, "jsd": a.jsd} for a in attempts[len(shown):][:8]]
        return prompts.feedback_section(shown, failures, others, cfg.max_tokens_shown)


def _sequence(pattern: ProgramTensor, b: int) -> np.ndarray:
    """Sequence ``b`` of a pattern batch as a dense array (feedback shows a few sequences' rows)."""
    return pattern.take([b]).to_dense()[0] if isinstance(pattern, SparseRows) else pattern[b]


def pad_to(pattern: ProgramTensor, width: int) -> ProgramTensor:
    """Zero-pad a [B, n, n] pattern to [B, width, width] (programs pad to their own batch's longest)."""
    if isinstance(pattern, SparseRows):
        return pattern.widen(width) if pattern.n <= width else pattern
    if pattern.shape[-1] == width:
        return pattern
    out = np.zeros(pattern.shape[:-2] + (width, width), dtype=np.float32)
    m = min(width, pattern.shape[-1])
    out[..., :m, :m] = pattern[..., :m, :m]
    return out
