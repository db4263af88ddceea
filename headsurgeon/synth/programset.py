"""ProgramSet: the chosen program per head with its IoU/JSD on each split and where it came from.

Per head it keeps the **replacement** (the most faithful program at any size: ``Entry.program``), the
**explanation** (the best program whose rendered text fits ``READABLE_CHARS``) and the **frontier** (the best
program per budget of ``BUDGETS``), see headsurgeon/synth/select.py. Saves to / loads from JSON (no pickle), with big
numeric tables in a safetensors side file (headsurgeon/synth/programtables.py), and feeds ``replace_heads`` directly (it
maps head → replacement Program). Python programs inside are only parsed and AST-validated on load; they ever
run only in the sandbox.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterable, Mapping
from typing import Any, Iterator

from headsurgeon.core.fileio import atomic_file
from headsurgeon.core.formats import check_versioned

from ..core import WHICHES, Head, InputError, Metric, Split, HeadLike
from . import programtables
from .backends import get_backend
from .errors import ProgramError
from .program import Program
from .programs_file import PROGRAMS, clip, read_programs_file
from .scored import ScoredProgram
from .trust import API_FLAG, require_trusted, TrustPrograms
from ..core.vocabulary import TokenVocabulary

FORMAT, VERSION = PROGRAMS.name, PROGRAMS.version  # declared once in headsurgeon/synth/programs_file.py
WHICH = WHICHES
#: head → program, as the functions that swap heads take it: per head a Program, DSL text, program JSON or a pattern
#: provider (headsurgeon/surgery/swap/providers.py ``as_provider`` reads each)
ProgramMap = Mapping[Any, Any]  # keys: anything Head.parse reads (a Mapping's key type is invariant)


def _cost_kl(costs: Any, label: str, variant: str) -> float | None:
    """``costs[label][variant]["kl"]`` of a programs.json's meta (data from a file: anything else is None)."""
    row = costs.get(label) if isinstance(costs, dict) else None
    cell = row.get(variant) if isinstance(row, dict) else None
    kl = cell.get("kl") if isinstance(cell, dict) else None
    return float(kl) if isinstance(kl, (int, float)) and not isinstance(kl, bool) else None


def _declared_kind(item: dict) -> str | None:
    """The entry's declared program kind (a registered backend's), which its program must match; None if absent."""
    kind = item.get("kind")
    return None if kind is None else get_backend(kind).kind  # an unknown kind: ProgramValidationError


def _program(item: dict, head: tuple[int, int], tables: dict | None, read: dict[str, Program]) -> Program:
    """The program of a programs.json record (an entry, its explanation or a frontier point). ``read``: the programs
    already read from this document, by their JSON: a head's replacement is usually also a frontier point, often its
    explanation too, and a fitted table program takes milliseconds to check, so each is read once (programs are
    immutable values)."""
    try:
        kind = _declared_kind(item)
        key = json.dumps([kind, item["program"]], sort_keys=True)
        if key not in read:
            read[key] = Program.from_json(programtables.unpack(item["program"], tables), kind=kind)
        return read[key]
    except ProgramError as e:
        raise ProgramError(f"program for {Head.label(head)} is invalid: {e}") from e
    except KeyError:
        raise ProgramError(f"a record for {Head.label(head)} has no program") from None


def _replacement(name: str, doc: str) -> property:
    """A read-only view of the replacement's ``name`` (``entry.program`` is ``entry.replacement.program``)."""
    return property(lambda self: getattr(self.replacement, name), doc=doc)


@dataclass
class Entry:
    """One head: its replacement (the most faithful program, any size), explanation and frontier points.

    Each is a ``ScoredProgram`` (headsurgeon/synth/scored.py); ``entry.program``, ``.source``, ``.scores``, ``.text`` ... and
    ``iou()`` read the replacement's.
    """

    replacement: ScoredProgram
    explanation: ScoredProgram | None = None
    frontier: list[ScoredProgram] = field(default_factory=list)

    program = _replacement("program", "The replacement Program (what ``replace_heads`` installs).")
    source = _replacement("source", "The searcher that proposed the replacement.")
    scores = _replacement("scores", "The replacement's Scores per split.")
    hypothesis = _replacement("hypothesis", "What the searcher said the head does.")
    text = _replacement("text", "The replacement as rendered (with the vocabulary at selection time).")
    gloss = _replacement("gloss", "The replacement's English gloss.")
    chars = _replacement("chars", "Characters of the replacement's rendered text.")
    size = _replacement("size", "The replacement's description length (``Program.size``).")

    def iou(self, split: Split = "test") -> float | None:
        return self.replacement.iou(split)

    def to_json(self, head: tuple[int, int], tables: dict | None = None, written: dict[int, Any] | None = None) -> dict:
        """This entry's record in programs.json (big tables packed into ``tables`` when given). ``written``: the JSON
        of the programs already written, by ``id``: a program in several slots is converted once (a record's
        fields are never mutated, so they may share it)."""
        written = {} if written is None else written

        def prog(p: Program) -> Any:
            if id(p) not in written:
                written[id(p)] = p.to_json() if tables is None else programtables.pack(p.to_json(), tables)
            return written[id(p)]

        rep = self.replacement
        item = {"head": Head.label(head), **rep.to_json(prog(rep.program)), "hypothesis": rep.hypothesis,
                "scores": rep.scores.to_json()}
        for m in ("budget", "iou", "jsd", "topq", "digits"):
            item.pop(m, None)  # the replacement's scores live in "scores"
        if self.explanation is not None:
            item["explanation"] = self.explanation.to_json(prog(self.explanation.program))
        if self.frontier:
            item["frontier"] = [c.to_json(prog(c.program)) for c in self.frontier]
        return item

    @classmethod
    def from_json(cls, item: dict, tables: dict | None = None, read: dict[str, Program] | None = None) -> "Entry":
        """Read a programs.json record; old records (no explanation, frontier, size, chars, gloss) load too.
        ``read``: programs already read from the same document, by their JSON (ProgramSet.from_json shares one)."""
        head = Head.parse(item["head"])
        read = {} if read is None else read
        if "chars" in item:  # old files' "text" is program.text, not a rendering: render it again
            rendered = {"text": item.get("text") or None, "gloss": item.get("gloss") or None, "chars": item["chars"]}
        else:
            rendered = {"text": None, "gloss": None, "chars": None}
        rendered = {k: v if isinstance(v, str if k != "chars" else int) else None for k, v in rendered.items()}
        replacement = ScoredProgram(_program(item, head, tables, read), str(item.get("source", "unknown")),
                                    item.get("scores") or {}, str(item.get("hypothesis", "")), **rendered)
        explanation = None
        if isinstance(item.get("explanation"), dict):
            ex = item["explanation"]
            explanation = ScoredProgram.from_json(ex, _program(ex, head, tables, read))
        frontier = [ScoredProgram.from_json(f, _program(f, head, tables, read))
                    for f in item.get("frontier") or [] if isinstance(f, dict)]
        return cls(replacement, explanation, frontier)


class ProgramSet:
    """head → Entry, ordered by head; iterate ``.items()`` for (head, Program) like a dict."""

    def __init__(self, entries: Mapping[Head, Entry] | None = None, model: str = "",
                 meta: dict | None = None, vocab_fingerprint: str | None = None, origin: str | None = None) -> None:
        self.entries: dict[Head, Entry] = dict(sorted((entries or {}).items()))
        self.model = model
        self.meta = dict(meta or {})
        self.vocab_fingerprint = vocab_fingerprint  # Vocabulary.fingerprint of the tokenizer (headsurgeon/synth/vocab.py)
        #: where the programs came from when someone else may have written them (a file, a document); None: built
        #: in this process. Python programs of a set with an origin run only through the trust gate (headsurgeon/synth/trust.py)
        self.origin = origin

    def programs(self, which: str = "replacement") -> dict[Head, Program]:
        """head → Program: every head's replacement, or the explanations of the heads that have one."""
        if which not in WHICH:
            raise InputError(f"which must be one of {WHICH}, got {which!r}")
        if which == "replacement":
            return {h: e.program for h, e in self.entries.items()}
        return {h: e.explanation.program for h, e in self.entries.items() if e.explanation is not None}

    # mapping face: what replace_heads needs
    def items(self) -> Iterator[tuple[Head, Program]]:
        return iter([(h, e.program) for h, e in self.entries.items()])

    def keys(self) -> list[Head]:
        return list(self.entries)

    def __getitem__(self, head: HeadLike) -> Program:
        return self.entries[Head.parse(head)].program

    def __contains__(self, head: object) -> bool:
        return Head.parse(head) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Head]:
        return iter(self.entries)

    def add(self, head: HeadLike, program: Program | str, source: str = "unknown", scores: dict | None = None,
            hypothesis: str = "", explanation: ScoredProgram | None = None,
            frontier: list[ScoredProgram] | None = None, vocab: TokenVocabulary | None = None) -> None:
        """Set a head's replacement (with its explanation and frontier); ``vocab`` renders its text and gloss.

        ``program``: a Program or DSL text (parsed with ``vocab``; Python source goes through ``Program.python``).
        """
        if isinstance(program, str):
            program = Program.parse(program, vocab=vocab)
        replacement = (ScoredProgram(program, source, scores, hypothesis) if vocab is None
                       else ScoredProgram.of(program, source, scores, vocab, hypothesis))
        self.entries[Head.parse(head)] = Entry(replacement, explanation, list(frontier or []))
        self.entries = dict(sorted(self.entries.items()))

    def slots(self) -> Iterator[tuple[str, str, Program]]:
        """(head, slot, Program) for every program a head holds: its replacement, explanation and frontier points."""
        for h, e in self.entries.items():
            yield Head.label(h), "replacement", e.program
            if e.explanation is not None:
                yield Head.label(h), "explanation", e.explanation.program
            for i, c in enumerate(e.frontier):
                budget = "unbounded" if c.budget is None else f"{c.budget} characters"
                yield Head.label(h), f"frontier point {i} ({budget})", c.program

    def require_trusted(self, trust_programs: TrustPrograms = False, flag: str = API_FLAG, fix: str | None = None) -> None:
        """The trust gate (headsurgeon/synth/trust.py) over every program of every head, when this set came from a file or
        document (``origin``); a set built in this process is your own code and passes."""
        if self.origin is not None:
            require_trusted(self.slots(), trust_programs, origin=self.origin, flag=flag, fix=fix)

    def trusted(self, trust_programs: TrustPrograms = False, flag: str = API_FLAG, fix: str | None = None) -> "ProgramSet":
        """This set after the trust gate, marked as trusted (so code it is handed to need not ask again)."""
        self.require_trusted(trust_programs, flag, fix)
        if self.origin is None:
            return self
        return ProgramSet(self.entries, self.model, self.meta, self.vocab_fingerprint)

    def ranked(self, split: Split = "test", metric: Metric = "iou") -> list[Head]:
        """Heads from best to worst on ``split`` (IoU descending; JSD ascending)."""
        sign = -1 if metric in ("iou", "topq") else 1

        def key(h: Head) -> tuple[float, Head]:
            got = self.entries[h].scores.get(split, metric)
            return (sign * (got if got is not None else float("-inf") * sign), h)
        return sorted(self.entries, key=key)

    def subset(self, heads: Iterable[HeadLike]) -> "ProgramSet":
        keys = [Head.parse(h) for h in heads]
        return ProgramSet({h: self.entries[h] for h in keys}, self.model, self.meta, self.vocab_fingerprint, self.origin)

    def summary(self, split: Split = "test") -> dict[str, float]:
        ious = [i for i in (e.iou(split) for e in self.entries.values()) if i is not None]
        if not ious:
            return {"heads": len(self.entries)}
        ious_sorted = sorted(ious)
        mid = len(ious_sorted) // 2
        median = ious_sorted[mid] if len(ious_sorted) % 2 else 0.5 * (ious_sorted[mid - 1] + ious_sorted[mid])
        out: dict[str, float] = {"heads": len(self.entries), "mean_iou": sum(ious) / len(ious), "median_iou": median,
               "share_iou_ge_0.9": sum(i >= 0.9 for i in ious) / len(ious),
               "share_iou_ge_0.7": sum(i >= 0.7 for i in ious) / len(ious)}
        for m in ("vw_iou", "vw_jsd"):  # measured where the store had value norms (headsurgeon/synth/weighted.py)
            got = [g for g in (e.replacement.scores.get(split, m) for e in self.entries.values()
                               if e.replacement is not None) if g is not None]
            if got:
                out[f"mean_{m}"] = sum(got) / len(got)
        return out

    # JSON
    def to_json(self, tables: dict | None = None) -> dict:
        """The programs.json document; with ``tables`` (a dict), big numeric lists go there as references."""
        written: dict[int, Any] = {}  # keyed by id: every program stays alive in self while the dict lives
        programs = [e.to_json(h, tables, written) for h, e in self.entries.items()]
        obj: dict[str, Any] = {**PROGRAMS.header(VERSION if tables else 1), "model": self.model,
                               "meta": self.meta}
        if self.vocab_fingerprint:
            obj["vocab_fingerprint"] = self.vocab_fingerprint
        obj["programs"] = programs
        return obj

    @classmethod
    def from_json(cls, obj: dict, tables: dict | None = None,
                  origin: str = "this programs.json document") -> "ProgramSet":
        """Read a programs.json document; ``tables``: the side file's arrays (``load`` reads them). The set's
        ``origin`` marks its programs as someone else's: Python ones pass only the trust gate (headsurgeon/synth/trust.py)."""
        check_versioned(obj, PROGRAMS, origin)  # headsurgeon/core/formats.py: a newer version says to upgrade
        entries: dict[Head, Entry] = {}
        read: dict[str, Program] = {}
        for item in obj.get("programs", []):
            entries[Head.parse(item["head"])] = Entry.from_json(item, tables, read)
        fingerprint = obj.get("vocab_fingerprint")
        return cls(entries, obj.get("model", ""), obj.get("meta", {}),
                   fingerprint if isinstance(fingerprint, str) and fingerprint else None, origin)

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (one compact line per head), big tables to ``<stem>.tables.safetensors`` beside it."""
        path = Path(path)
        tables: dict = {}
        obj = self.to_json(tables)
        if tables:
            side = programtables.tables_path(path)
            obj["tables"] = {"file": side.name, "sha256": programtables.save_tables(side, tables)}
        programs = obj.pop("programs")
        lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in obj.items()]
        lines += [' "programs": [', ",\n".join("  " + json.dumps(p, separators=(",", ":"), ensure_ascii=False)
                                              for p in programs), " ]", "}"]
        with atomic_file(path, "wb") as f:  # UTF-8: token strings stay readable (and short) in the file
            f.write(("\n".join(line for line in lines if line) + "\n").encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, trust_programs: TrustPrograms = False) -> "ProgramSet":
        """Read programs.json (and its tables side file when it names one). The file may be hostile: its size and
        layout are checked first (headsurgeon/synth/programs_file.py) and every failure is a one-line ProgramError.

        The set remembers the file as its ``origin``: its Python programs (in any slot) run only once trusted,
        here (``trust_programs=True`` or their hashes) or where it is used (``replace_heads(..., trust_programs=)``).
        """
        path = Path(path)
        obj = read_programs_file(path)
        try:
            tables = programtables.load_tables(path, obj["tables"]) if obj.get("tables") is not None else None
            programs = cls.from_json(obj, tables, origin=str(path))
        except ProgramError as e:
            raise ProgramError(f"{path}: {clip(str(e))}") from None
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise ProgramError(f"{path} is not a usable program set ({type(e).__name__}: {clip(str(e), 200)})") from None
        return programs.trusted(trust_programs) if trust_programs else programs

    def explanation(self, head: HeadLike) -> Program | None:
        """The head's readable explanation (None when it has none); ``programs[head]`` is its replacement."""
        entry = self.entries[Head.parse(head)]
        return entry.explanation.program if entry.explanation is not None else None

    def table(self, split: Split = "test", width: int = 60) -> list[dict[str, Any]]:
        """One row per head, what a reader scans first: the explanation (cut to ``width`` characters) with its IoU,
        the replacement's IoU, JSD and length, and who proposed it; with per-head causal costs in ``meta``
        (explain's ``head_costs``), each kind's KL and the mean ablation's."""
        def cut(text: str) -> str:
            return text if len(text) <= width else text[: width - 1] + "…"

        costs = self.meta.get("head_costs")
        costs = costs.get("heads") if isinstance(costs, dict) else None
        rows = []
        for head, entry in self.entries.items():
            ex = entry.explanation
            row = {"head": Head.label(head), "explanation": cut(ex.text) if ex is not None else None,
                   "explanation_iou": ex.iou(split) if ex is not None else None,
                   "replacement_iou": entry.replacement.iou(split), "replacement_jsd": entry.replacement.jsd(split),
                   "replacement_chars": entry.chars, "source": entry.source}
            if costs is not None:  # explain(head_costs=True): KL(base ‖ swapped) per token on the select windows
                for variant, column in (("explanation", "explanation_kl"), ("replacement", "replacement_kl"),
                                        ("mean", "mean_ablation_kl")):
                    row[column] = _cost_kl(costs, Head.label(head), variant)
            rows.append(row)
        return rows

    def __repr__(self) -> str:
        """One line: heads, readable explanations, mean test IoU of replacements and explanations."""
        text = f"ProgramSet({len(self)} heads of {self.model or 'a model'}"
        readable = [e.explanation for e in self.entries.values() if e.explanation is not None]
        text += f", {len(readable)} with a readable explanation"
        summary = self.summary("test")
        if "mean_iou" in summary:
            text += f"; mean test IoU: replacements {summary['mean_iou']:.3f}"
            ious = [i for i in (c.iou("test") for c in readable) if i is not None]
            if ious:
                text += f", explanations {sum(ious) / len(ious):.3f}"
        return text + ")"
