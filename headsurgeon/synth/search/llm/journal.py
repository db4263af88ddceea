"""The agent's JSONL run journal: events appended and flushed, finished heads fsynced, read back to resume a run
without asking about finished heads again."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any


from ....core.fileio import json_default
from ...scored import ScoredProgram
from ...program import Program
from .config import SOURCE
from ....core import InputError

JOURNAL_VERSION = 1


class RunJournal:
    """An append-only JSONL journal of one agent run (see the module docstring for the events)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: Any = None

    def read(self) -> list[dict[str, Any]]:
        """All complete events (a line cut short by a killed writer is ignored)."""
        if not self.path.is_file():
            return []
        events = []
        with open(self.path, "r", encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(ev, dict):
                    events.append(ev)
        return events

    def open(self) -> None:
        """Open for appending (ending a half-written last line first)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = False
        if self.path.is_file() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._file = open(self.path, "a", encoding="utf-8")
        if needs_newline:  # a killed writer left half a line: end it so the next event stands alone
            self._file.write("\n")
            self._file.flush()

    def write(self, event: dict[str, Any], sync: bool = False) -> None:
        """Append one event; flush always, fsync when ``sync`` (finished heads)."""
        if self._file is None:
            return
        line = json.dumps({"time": round(time.time(), 3), **event}, sort_keys=True, default=json_default)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()
            if sync:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (later writes are ignored)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def candidate_to_json(c: ScoredProgram) -> dict[str, Any]:
    """A candidate as the journal records it."""
    return {"program": c.program.to_json(), "kind": c.program.kind, "hash": c.program.hash,
            "hypothesis": c.hypothesis, "scores": c.scores.to_json()}


def candidate_from_json(obj: dict[str, Any]) -> ScoredProgram:
    """A journaled candidate back (an error when its program's hash changed)."""
    prog = Program.from_json(obj["program"], kind=obj.get("kind"))
    if obj.get("hash") and obj["hash"] != prog.hash:
        raise InputError(f"program hash changed ({obj['hash'][:12]} -> {prog.hash[:12]})")
    return ScoredProgram(prog, SOURCE, obj.get("scores") or {}, obj.get("hypothesis", ""))
