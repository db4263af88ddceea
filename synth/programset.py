"""ProgramSet: the chosen program per head with its IoU/JSD on each split and where it came from.

Saves to / loads from JSON (no pickle) and feeds ``replace_heads`` directly (it maps head → Program).
Python programs inside are only parsed and AST-validated on load; they ever run only in the sandbox.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from headsurgeon.kernels.fileio import atomic_file

from .backends import get_backend
from .errors import ProgramError
from .program import Program

FORMAT = "headsurgeon.programset"
VERSION = 1
SPLITS = ("synth", "select", "test")


def head_key(head: Any) -> tuple[int, int]:
    """(3, 5) or "L3H5" → (3, 5)."""
    if isinstance(head, str):
        m = re.fullmatch(r"\s*L(\d+)H(\d+)\s*", head, flags=re.IGNORECASE)
        if not m:
            raise ValueError(f"cannot read head {head!r}: write 'L3H5'")
        return int(m.group(1)), int(m.group(2))
    layer, h = head
    return int(layer), int(h)


def head_label(head: tuple[int, int]) -> str:
    return f"L{head[0]}H{head[1]}"


def _declared_kind(item: dict) -> str | None:
    """The entry's declared program kind (a registered backend's), which its program must match; None if absent."""
    kind = item.get("kind")
    return None if kind is None else get_backend(kind).kind  # an unknown kind: ProgramValidationError


@dataclass
class Entry:
    """One head's chosen program, its scores per split ({"iou", "jsd", "topq"}) and provenance."""

    program: Program
    source: str = "unknown"
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    hypothesis: str = ""

    def iou(self, split: str = "test") -> float | None:
        return self.scores.get(split, {}).get("iou")


class ProgramSet:
    """head → Entry, ordered by head; iterate ``.items()`` for (head, Program) like a dict."""

    def __init__(self, entries: dict[tuple[int, int], Entry] | None = None, model: str = "",
                 meta: dict | None = None) -> None:
        self.entries: dict[tuple[int, int], Entry] = dict(sorted((entries or {}).items()))
        self.model = model
        self.meta = dict(meta or {})

    # mapping face: what replace_heads needs
    def items(self) -> Iterator[tuple[tuple[int, int], Program]]:
        return iter([(h, e.program) for h, e in self.entries.items()])

    def keys(self) -> list[tuple[int, int]]:
        return list(self.entries)

    def __getitem__(self, head: Any) -> Program:
        return self.entries[head_key(head)].program

    def __contains__(self, head: Any) -> bool:
        return head_key(head) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.entries)

    def add(self, head: Any, program: Program, source: str = "unknown", scores: dict | None = None,
            hypothesis: str = "") -> None:
        self.entries[head_key(head)] = Entry(program, source, dict(scores or {}), hypothesis)
        self.entries = dict(sorted(self.entries.items()))

    def require_trusted(self, trust_programs: Any = False) -> None:
        """Refuse Python programs unless trusted (True, or their hashes): programs.json files from others hold them."""
        if trust_programs is True:
            return
        allowed = {trust_programs} if isinstance(trust_programs, str) else set(trust_programs or ())
        untrusted = [(h, e.program.hash) for h, e in self.entries.items()
                     if e.program.needs_trust and e.program.hash not in allowed]
        if untrusted:
            heads = ", ".join(f"{head_label(h)} ({digest})" for h, digest in untrusted[:5])
            more = f" and {len(untrusted) - 5} more" if len(untrusted) > 5 else ""
            raise ProgramError(f"this program set holds Python programs for {heads}{more}; Python programs run only "
                               "when trusted: read them, then trust them (--trust-programs, or trust_programs=True "
                               "or a set of their hashes)")

    def ranked(self, split: str = "test", metric: str = "iou") -> list[tuple[int, int]]:
        """Heads from best to worst on ``split`` (IoU descending; JSD ascending)."""
        sign = -1 if metric in ("iou", "topq") else 1
        return sorted(self.entries, key=lambda h: (sign * (self.entries[h].scores.get(split, {}).get(metric)
                                                           if self.entries[h].scores.get(split, {}).get(metric)
                                                           is not None else float("-inf") * sign), h))

    def subset(self, heads: list[Any]) -> "ProgramSet":
        keys = [head_key(h) for h in heads]
        return ProgramSet({h: self.entries[h] for h in keys}, self.model, self.meta)

    def summary(self, split: str = "test") -> dict[str, float]:
        ious = [e.iou(split) for e in self.entries.values() if e.iou(split) is not None]
        if not ious:
            return {"heads": len(self.entries)}
        ious_sorted = sorted(ious)
        mid = len(ious_sorted) // 2
        median = ious_sorted[mid] if len(ious_sorted) % 2 else 0.5 * (ious_sorted[mid - 1] + ious_sorted[mid])
        return {"heads": len(self.entries), "mean_iou": sum(ious) / len(ious), "median_iou": median,
                "share_iou_ge_0.9": sum(i >= 0.9 for i in ious) / len(ious),
                "share_iou_ge_0.7": sum(i >= 0.7 for i in ious) / len(ious)}

    # JSON
    def to_json(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "meta": self.meta,
            "programs": [{"head": head_label(h), "kind": e.program.kind, "text": e.program.text,
                          "program": e.program.to_json(), "source": e.source, "hypothesis": e.hypothesis,
                          "scores": e.scores} for h, e in self.entries.items()],
        }

    @classmethod
    def from_json(cls, obj: dict) -> "ProgramSet":
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ProgramError("not a headsurgeon program set (missing format: headsurgeon.programset)")
        if int(obj.get("version", 0)) > VERSION:
            raise ProgramError(f"program set format version {obj['version']} is newer than this headsurgeon "
                               f"reads ({VERSION}); upgrade headsurgeon")
        entries = {}
        for item in obj.get("programs", []):
            head = head_key(item["head"])
            try:
                kind = _declared_kind(item)
                program = Program.from_json(item["program"], kind=kind)
            except ProgramError as e:
                raise ProgramError(f"program for {head_label(head)} is invalid: {e}") from e
            entries[head] = Entry(program, item.get("source", "unknown"), item.get("scores", {}),
                                  item.get("hypothesis", ""))
        return cls(entries, obj.get("model", ""), obj.get("meta", {}))

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (temp file, fsync, rename)."""
        path = Path(path)
        with atomic_file(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ProgramSet":
        path = Path(path)
        try:
            obj = json.loads(path.read_text())
        except FileNotFoundError:
            raise
        except json.JSONDecodeError as e:
            raise ProgramError(f"{path} is not valid JSON ({e})") from e
        return cls.from_json(obj)

    def __repr__(self) -> str:
        return f"ProgramSet({len(self)} heads, model={self.model!r})"
