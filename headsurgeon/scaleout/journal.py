"""The per-head journal of an explain run: one record per finished head under ``OUT/heads/``, written atomically
(headsurgeon/core/fileio.py) and never rewritten, so a driver killed mid-run resumes without redoing finished heads.

Layout: ``run.json`` holds the fingerprint of the inputs (store, splits, seed, searchers and their options) and a
random run id; ``L{layer}H{head}.json`` holds a head's selected entry (headsurgeon/synth/programset.py ``Entry.to_json``), the
selection's metadata, per-stage seconds and, when asked for, its ΔPPL. Serial and Ray runs write the same records
(the driver writes them all).

The folder is untrusted input like programs.json (SECURITY.md, "Explaining on a Ray cluster"): anyone who can
write to OUT could put records there. So every record, and run.json, carries an HMAC-SHA256 under a per-run
random key kept **outside** OUT, in ``journal_keys()/<run id>`` (mode 0600; only this user can read it): a record
that was forged, edited after it was written, or written by another run does not verify and is refused, naming
the file and the fix. Records present without run.json are refused too (never taken for a fresh run). The
programs of verified records still pass the trust gate (headsurgeon/synth/trust.py) with the run's own trust: Python only
where the run's searchers could propose it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import warnings
from pathlib import Path
from typing import Any, Iterable

from ..synth.trust import TrustPrograms
from ..core.fileio import UnsafeFileError, atomic_write_bytes, json_default, read_bounded
from ..core.formats import FileFormat, check_versioned, write_versioned
from ..synth.errors import ProgramError
from ..synth.programset import Entry, ProgramSet
from ..core import Head, HeadsurgeonError, JournalMismatchError

class JournalError(HeadsurgeonError, ValueError):
    """The journal folder cannot be used: unreadable, forged or altered records, or a missing run.json or key."""


#: run.json's format (headsurgeon/core/formats.py); 2: records and run.json carry an HMAC under a key outside OUT
RUN_FILE = FileFormat("headsurgeon.head_journal", 2, (2,), "a run file of a headsurgeon journal",
                      "delete the output folder's heads/ to start over (its heads are searched again)",
                      error=JournalError)
FORMAT, VERSION = RUN_FILE.name, RUN_FILE.version
_RUN_ID = re.compile(r"[0-9a-f]{32}")
#: the largest run.json or record read (a record holds one head's entry: programs, scores, notes)
MAX_RECORD_BYTES = 16 << 20
KEY_BYTES = 32


def journal_keys() -> Path:
    """Where run keys live: ``$HEADSURGEON_JOURNAL_KEYS``, else ``$XDG_CACHE_HOME`` (or ~/.cache)/headsurgeon/journal-keys."""
    env = os.environ.get("HEADSURGEON_JOURNAL_KEYS")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "headsurgeon" / "journal-keys"


def _dumps(obj: Any) -> bytes:
    """JSON as programs.json writes it (NaN kept: scores of programs that failed are NaN; headsurgeon/synth/select.py)."""
    return json.dumps(obj, default=json_default, sort_keys=True).encode("utf-8")


def _canonical(obj: Any) -> Any:
    """``obj`` as it reads back from its JSON (tuples → lists, numpy → numbers), so a MAC is taken on one form."""
    return json.loads(_dumps(obj))


def _is_record_name(name: str) -> bool:
    """``L3H5.json``, the one spelling a record file has (headsurgeon/core/__init__.py ``Head``)."""
    try:
        return name.endswith(".json") and f"{Head.parse(name[:-5])}.json" == name
    except HeadsurgeonError:
        return False


class HeadJournal:
    """Append-only per-head records of one explain run in ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path, keys: str | Path | None = None) -> None:
        self.directory = Path(directory)
        self.keys = Path(keys) if keys is not None else journal_keys()
        self._key: bytes | None = None
        self._run_id: str | None = None

    # ------------------------------------------------------------------ reading untrusted files
    def _fix(self) -> str:
        return f"delete {self.directory} to start over (its heads are searched again)"

    def _read(self, path: Path) -> Any:
        """A JSON file of the journal, read bounded (headsurgeon/core/fileio.py), or a JournalError naming it and the fix."""
        try:
            return json.loads(read_bounded(path, MAX_RECORD_BYTES, "a journal file"))
        except (OSError, UnsafeFileError, ValueError, RecursionError) as e:
            raise JournalError(f"{path} is unreadable ({' '.join(str(e).split())[:300]}); {self._fix()}") from None

    def _mac(self, kind: str, body: Any) -> str:
        assert self._key is not None and self._run_id is not None
        message = _dumps({"kind": kind, "run": self._run_id, "body": body})
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _key_path(self, run_id: str) -> Path:
        return self.keys / run_id

    def _new_key(self) -> tuple[str, bytes]:
        """A fresh run id and key, the key written with mode 0600 into ``self.keys`` (made 0700)."""
        self.keys.mkdir(parents=True, exist_ok=True, mode=0o700)
        run_id, key = secrets.token_hex(16), secrets.token_bytes(KEY_BYTES)
        fd = os.open(self._key_path(run_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        return run_id, key

    def _load_key(self, run: Path, run_id: Any) -> bytes:
        if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
            raise JournalError(f"{run} names no valid run id; it was not written by this headsurgeon: {self._fix()}")
        path = self._key_path(run_id)
        try:
            key = read_bounded(path, KEY_BYTES, "a journal key")
        except FileNotFoundError:
            raise JournalError(f"{self.directory} was written by a run whose key ({path}) is not on this machine or "
                               f"for this user, so its records cannot be verified; {self._fix()}") from None
        except (OSError, UnsafeFileError) as e:
            raise JournalError(f"the key of {self.directory} is unreadable ({e}); {self._fix()}") from None
        if len(key) != KEY_BYTES:
            raise JournalError(f"the key of {self.directory} ({path}) is damaged; {self._fix()}")
        return key

    # ------------------------------------------------------------------ the public face
    def start(self, fingerprint: dict[str, Any]) -> dict[tuple[int, int], dict]:
        """Bind the journal to this run's inputs and return the records already written (head → record).

        A folder written for other inputs is refused (its records would mix two runs), and so are records
        without a run.json, records that do not verify, and a run.json whose key is not here (module docstring).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        run = self.directory / "run.json"
        want = _canonical({**RUN_FILE.header(), "fingerprint": fingerprint})
        if os.path.lexists(run):
            body = self._open_run()
            if body != want:
                found = body.get("fingerprint")
                had = found if isinstance(found, dict) else {}
                changed = sorted(k for k in set(want["fingerprint"]) | set(had)
                                 if want["fingerprint"].get(k) != had.get(k))
                raise JournalMismatchError(
                    f"{self.directory} holds heads of a run with other inputs (differs in: {', '.join(changed) or 'format'});"
                    f" use another output folder, or delete {self.directory} to start over")
        else:
            found = self._record_paths()
            if found:
                raise JournalError(f"{self.directory} holds {len(found)} head record(s) ({found[0].name}, ...) but no "
                                   f"run.json, so nothing says which run wrote them; {self._fix()}")
            self._run_id, self._key = self._new_key()
            write_versioned(run, RUN_FILE, {"fingerprint": want["fingerprint"], "run": self._run_id,
                                            "mac": self._mac("run", want)}, encode=_dumps)
        return self.records()

    def _open_run(self) -> dict[str, Any]:
        """Read and verify run.json, taking its run's key; returns its body (format, version, fingerprint)."""
        run = self.directory / "run.json"
        if not os.path.lexists(run):
            found = self._record_paths()
            raise JournalError(f"{self.directory} holds {len(found)} head record(s) ({found[0].name}, ...) but no "
                               f"run.json, so nothing says which run wrote them; {self._fix()}")
        have = self._read(run)
        check_versioned(have, RUN_FILE, str(run))
        self._run_id = have.get("run")
        self._key = self._load_key(run, self._run_id)
        body = {k: have.get(k) for k in ("format", "version", "fingerprint")}
        if not hmac.compare_digest(str(have.get("mac", "")), self._mac("run", body)):
            raise JournalError(f"{run} was altered after this run wrote it (its HMAC does not verify); {self._fix()}")
        return body

    def _record_paths(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return [p for p in sorted(self.directory.iterdir()) if _is_record_name(p.name)]

    def _record(self, path: Path) -> Any:
        """A record's JSON, or None for a record that is not JSON (torn or truncated): it is dropped with a warning
        naming it, its head is searched again and every other record is kept. Anything else stays an error."""
        try:
            data = read_bounded(path, MAX_RECORD_BYTES, "a journal file")
        except (OSError, UnsafeFileError) as e:
            raise JournalError(f"{path} is unreadable ({' '.join(str(e).split())[:300]}); {self._fix()}") from None
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            path.unlink(missing_ok=True)
            warnings.warn(f"{path} is damaged ({' '.join(str(e).split())[:120]}); dropped it, so that head is searched "
                          "again (the other records are kept)", stacklevel=3)
            return None

    def records(self) -> dict[tuple[int, int], dict]:
        """Every record, by head, each verified against its run's key (run.json's; ``start`` checks its inputs);
        a damaged record is dropped with a warning (``_record``)."""
        out: dict[tuple[int, int], dict] = {}
        paths = self._record_paths()
        if paths and self._key is None:
            self._open_run()
        for path in paths:
            rec = self._record(path)
            if rec is None:
                continue
            mac = rec.pop("mac", None) if isinstance(rec, dict) else None
            if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac("record", rec)):
                raise JournalError(f"{path} was not written by this run, or was altered after it was (its HMAC does "
                                   f"not verify); {self._fix()}")
            try:
                head = Head.parse(rec["head"])
            except (KeyError, TypeError, ValueError):
                raise JournalError(f"{path} names no head; {self._fix()}") from None
            if path.name != f"{Head.label(head)}.json":
                raise JournalError(f"{path} holds the record of {Head.label(head)}; {self._fix()}")
            out[head] = rec
        return out

    def write(self, record: dict[str, Any]) -> None:
        """Add one head's record (atomically, with its HMAC; a head already journaled keeps its first record)."""
        if self._key is None:
            raise JournalError(f"{self.directory}: call start() before writing records")
        path = self.directory / f"{Head.label(Head.parse(record['head']))}.json"
        if not os.path.lexists(path):
            body = _canonical(record)
            atomic_write_bytes(path, _dumps({**body, "mac": self._mac("record", body)}))

    def programset(self, heads: Iterable[tuple[int, int]], model: str = "", vocab_fingerprint: str | None = None,
                   trust: TrustPrograms = True, records: dict[tuple[int, int], dict] | None = None) -> ProgramSet:
        """The ProgramSet of ``heads`` as journaled (every head must have a record), after the trust gate
        (headsurgeon/synth/trust.py) with ``trust``: the run's own (which Python programs its searchers could propose).
        ``records``: what :meth:`records` returned a moment ago (verified then), so as not to read them twice."""
        recs = self.records() if records is None else records
        heads = list(heads)
        missing = [Head.label(h) for h in heads if h not in recs]
        if missing:
            raise JournalError(f"the journal {self.directory} has no record for {', '.join(missing[:8])}")
        try:
            entries = {Head(*h): Entry.from_json(recs[h]["entry"]) for h in heads if recs[h].get("entry")}
        except (ProgramError, KeyError, TypeError, ValueError) as e:
            raise JournalError(f"a record in {self.directory} holds an unusable entry ({e}); {self._fix()}") from None
        ps = ProgramSet(entries, model, next((dict(recs[h]["meta"]) for h in heads if recs[h].get("meta")), {}),
                        vocab_fingerprint, origin=f"the journal {self.directory}")
        return ps.trusted(trust, fix="this run's searchers propose no such programs (only the LLM agent, a library "
                                     f"or your own searchers do), so these records are not this run's; {self._fix()}")
