"""The programs of a checkpoint: which heads a hybrid replaces, and loading each head's program file.

A head's declared kind, its file's suffix (its backend's ``suffix``) and the parsed content must agree, so
a DSL document never yields a Python program; kinds whose backend ``needs_trust`` load only when trusted
(SECURITY.md). Nothing is executed while loading.
"""
from __future__ import annotations

from typing import Any, Mapping

from headsurgeon.core.fileio import sha256_bytes
from headsurgeon.synth.backends import backend_kinds, get_backend
from headsurgeon.synth.errors import ProgramError, excerpt
from headsurgeon.synth.program import Program
from headsurgeon.synth.trust import trusts
from headsurgeon.surgery.swap.hybrid import HybridModel

from ...synth.trust import TrustPrograms
from .errors import CheckpointError, IntegrityError, UntrustedProgramError
from .files import member_parts
from .layout import PROGRAM_DIR

__all__ = ["programs_of", "load_programs"]


def programs_of(hybrid: HybridModel) -> list[tuple[tuple[int, int], Program, float]]:
    """(head, Program, alpha) of every program head of a hybrid, by head; other replacements are refused."""
    out = []
    for ph in hybrid.program_heads.values():
        program = ph.program
        if not isinstance(program, Program):
            raise CheckpointError(
                f"head L{ph.layer}H{ph.head} is replaced by a {type(program).__name__}, not a Program; only "
                "program heads (DSL or Python) can be saved in a hybrid checkpoint"
            )
        out.append(((ph.layer, ph.head), program, float(ph.alpha)))
    return sorted(out, key=lambda x: x[0])


def _head_entry(name: str, item: Any) -> tuple[tuple[int, int], str, str, str, float]:
    """(head, program file, kind, program hash, alpha) of one manifest head entry."""
    try:
        head = (int(item["layer"]), int(item["head"]))
        rel, kind, want = item["program"], item["kind"], item["hash"]
        alpha = float(item.get("alpha", 1.0))
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as e:
        raise IntegrityError(f"the manifest entry for head {name} is malformed ({excerpt(e)}); save the checkpoint "
                             "again") from None
    if not all(isinstance(v, str) for v in (rel, kind, want)):
        raise IntegrityError(f"the manifest entry for head {name} is malformed (program, kind and hash must be "
                             "strings); save the checkpoint again")
    if kind not in backend_kinds():
        raise CheckpointError(f"head {name}: unknown program kind {excerpt(kind)} in the manifest (expected "
                              f"{' or '.join(backend_kinds())})")
    return head, rel, kind, want, alpha


def _check_program_file(name: str, rel: str, kind: str) -> None:
    """The file a head names lives in programs/ and its suffix is the declared kind's (its backend's ``suffix``)."""
    parts = rel.split("/")
    if len(parts) != 2 or parts[0] != PROGRAM_DIR:
        raise CheckpointError(f"head {name}: its program file {excerpt(rel)} is not inside {PROGRAM_DIR}/, where "
                              "save_hybrid puts every program; this checkpoint was altered after saving: do not load "
                              "it, get it again from its author")
    suffix = get_backend(kind).suffix
    if not parts[1].endswith(suffix) or parts[1] == suffix:
        raise CheckpointError(f"head {name}: the manifest declares a {kind} program but its file {excerpt(rel)} does "
                              f"not end in {suffix}; the declared kind, the file suffix and the content must agree, so "
                              "this checkpoint was altered after saving: do not load it, get it again from its author")


def _parse_program(name: str, rel: str, kind: str, want: str, raw: bytes, trust: TrustPrograms) -> Any:
    """The head's Program, parsed as its declared kind only: DSL JSON can never yield Python, nothing runs."""
    backend = get_backend(kind)
    label = backend.label
    if backend.needs_trust and not trusts(trust, want, sha256_bytes(raw)):  # the one gate's rule (headsurgeon/synth/trust.py)
        raise UntrustedProgramError(
            f"{rel} (head {name}) is a {label} program and {label} programs load only when trusted. Read it, "
            f"then pass trust_programs=True to trust every program, or trust_programs={{'{want}'}} to trust "
            f"this one by its hash. ({label} programs never run at load time; they run only in the sandbox.)"
        )
    try:
        program = Program.from_file(raw.decode("utf-8"), kind)  # parsing and validation only: nothing is executed
    except (ProgramError, UnicodeDecodeError, RecursionError) as e:
        raise CheckpointError(f"{rel} (head {name}) is not a valid {label} program: {excerpt(str(e), 300)}") from None
    if program.kind != kind:
        raise CheckpointError(f"{rel} (head {name}) holds a {program.kind} program, the manifest declares {kind}")
    if program.hash != want:
        raise IntegrityError(f"{rel} (head {name}) has program hash {program.hash}, the manifest says {excerpt(want)}")
    return program


def load_programs(manifest: Mapping[str, Any], sources: Mapping[str, bytes], trust: TrustPrograms) -> tuple[dict, dict]:
    """head -> Program and head -> alpha from the verified program files' bytes."""
    programs: dict[tuple[int, int], Any] = {}
    alphas: dict[tuple[int, int], float] = {}
    for key, item in manifest["heads"].items():
        name = key if len(key) <= 40 and key.isprintable() else excerpt(key, 40)
        head, rel, kind, want, alpha = _head_entry(name, item)
        member_parts(rel)
        if rel not in manifest["files"] or rel not in sources:
            raise IntegrityError(f"head {name}'s program {excerpt(rel)} is not listed among the manifest's files")
        _check_program_file(name, rel, kind)
        programs[head] = _parse_program(name, rel, kind, want, sources[rel], trust)
        alphas[head] = alpha
    return programs, alphas
