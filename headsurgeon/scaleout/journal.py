"""The per-head journal of an explain run: one record per finished head under ``OUT/heads/``, written atomically
(kernels/fileio.py) and never rewritten, so a driver killed mid-run resumes without redoing finished heads.

Layout: ``run.json`` holds the fingerprint of the inputs (store, splits, seed, searchers and their options);
``L{layer}H{head}.json`` holds a head's selected entry (synth/programset.py ``Entry.to_json``), the selection's
metadata, per-stage seconds and, when asked for, its ΔPPL. Serial and Ray runs write the same records.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from ..kernels.fileio import atomic_write_bytes, json_default
from ..synth.programset import Entry, ProgramSet, head_key, head_label

FORMAT = "headsurgeon.head_journal"
VERSION = 1
_RECORD = re.compile(r"L\d+H\d+\.json")


class JournalMismatchError(ValueError):
    """The journal folder was written by a run with other inputs."""


def _dumps(obj: Any) -> bytes:
    """JSON as programs.json writes it (NaN kept: scores of programs that failed are NaN; synth/select.py)."""
    return json.dumps(obj, default=json_default, sort_keys=True).encode("utf-8")


class HeadJournal:
    """Append-only per-head records of one explain run in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def start(self, fingerprint: dict[str, Any]) -> dict[tuple[int, int], dict]:
        """Bind the journal to this run's inputs and return the records already written (head → record).

        A folder written for other inputs is refused (its records would mix two runs).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        run = self.directory / "run.json"
        want = json.loads(_dumps({"format": FORMAT, "version": VERSION, "fingerprint": fingerprint}))
        if run.is_file():
            try:
                have = json.loads(run.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise JournalMismatchError(f"{run} is unreadable ({e}); delete {self.directory} to start over") from None
            if have != want:
                changed = sorted(k for k in set(want["fingerprint"]) | set(have.get("fingerprint") or {})
                                 if want["fingerprint"].get(k) != (have.get("fingerprint") or {}).get(k))
                raise JournalMismatchError(
                    f"{self.directory} holds heads of a run with other inputs (differs in: {', '.join(changed) or 'format'});"
                    f" use another output folder, or delete {self.directory} to start over")
        else:
            atomic_write_bytes(run, _dumps(want))
        return self.records()

    def records(self) -> dict[tuple[int, int], dict]:
        """Every complete record, by head (files are renamed into place whole, so a record is never half-written)."""
        out: dict[tuple[int, int], dict] = {}
        if not self.directory.is_dir():
            return out
        for path in sorted(self.directory.iterdir()):
            if not _RECORD.fullmatch(path.name):
                continue
            rec = json.loads(path.read_text(encoding="utf-8"))
            out[head_key(rec["head"])] = rec
        return out

    def write(self, record: dict[str, Any]) -> None:
        """Add one head's record (atomically; a head already journaled keeps its first record)."""
        path = self.directory / f"{head_label(head_key(record['head']))}.json"
        if not path.exists():
            atomic_write_bytes(path, _dumps(record))

    def programset(self, heads: Iterable[tuple[int, int]], model: str = "",
                   vocab_fingerprint: str | None = None) -> ProgramSet:
        """The ProgramSet of ``heads`` as journaled (every head must have a record)."""
        recs = self.records()
        heads = list(heads)
        missing = [head_label(h) for h in heads if h not in recs]
        if missing:
            raise KeyError(f"the journal {self.directory} has no record for {', '.join(missing[:8])}")
        ps = ProgramSet({h: Entry.from_json(recs[h]["entry"]) for h in heads if recs[h].get("entry")}, model,
                        next((dict(recs[h]["meta"]) for h in heads if recs[h].get("meta")), {}), vocab_fingerprint)
        return ps
