"""The target folder of a save: refuse foreign folders, keep user files, swap atomically, tidy after kills.

A save replaces only the files an earlier save wrote (listed in its manifest and unchanged since); every
other entry of the folder is hard-linked (or copied) into the new folder before the atomic swap, so it
survives. A previous checkpoint is renamed aside first and deleted only after the new one is in place.
"""
from __future__ import annotations

import os
import shutil
import stat
import uuid
import warnings
from pathlib import Path

from headsurgeon.core.fileio import fsync_dir, sha256_file
from headsurgeon.synth.errors import excerpt

from .errors import CheckpointError, NotACheckpointError
from .files import file_info, read_member
from .layout import CARD, MANIFEST
from .manifest import read_manifest_at

__all__ = ["checked_target", "previous_files", "carry_user_files", "clean_stale", "swap_into_place"]


def _pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a save in progress owns its temporary folders)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def checked_target(directory: str | Path) -> Path:
    """The absolute checkpoint path; a file or a symlink there is refused."""
    target = Path(directory).expanduser().absolute()
    if target.is_symlink():
        raise CheckpointError(f"{target} is a symbolic link (to {os.path.realpath(target)}); save to the folder it "
                              "points to, or choose another path")
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"{target} exists and is a file; choose a directory path for the checkpoint")
    return target


def verified_files(target: Path) -> tuple[set[str], str | None]:
    """Files of ``target`` listed in its manifest with their saved size and sha256, and why it is no checkpoint."""
    try:
        manifest = read_manifest_at(target)
    except NotACheckpointError:
        return set(), "has no headsurgeon manifest.json"
    except CheckpointError as e:
        return set(), f"its manifest.json cannot be used ({excerpt(str(e), 160)})"
    ours: set[str] = set()
    problem = None if CARD in manifest["files"] else f"its manifest.json lists no {CARD}"
    for rel, info in manifest["files"].items():
        try:
            size, want = file_info(rel, info)
            got, _ = read_member(target, rel, size)
        except CheckpointError:
            got, want = "", "?"
        if got == want:
            ours.add(rel)
        elif problem is None:
            problem = f"its manifest.json lists {excerpt(rel, 80)}, which is missing or changed since it was saved"
    return ours, problem


def previous_files(target: Path, overwrite: bool) -> set[str]:
    """What an earlier save wrote into ``target`` (and may be replaced); a folder it did not write needs overwrite."""
    if not target.is_dir():
        return set()
    with os.scandir(target) as entries:
        if next(entries, None) is None:
            return set()
    ours, problem = verified_files(target)
    if problem is None:
        return ours | {MANIFEST}
    if overwrite:
        return ours
    raise CheckpointError(
        f"{target} is not empty and {problem}, so it is not a headsurgeon checkpoint; refusing to write into it "
        "(saving never deletes files it did not write). Choose a new or empty folder, or pass overwrite=True to "
        "write the checkpoint into it: files with the checkpoint's names are replaced, all other files are kept"
    )


def _plan_carry(src: Path, rel_dir: str, tmp: Path, ours: set[str], our_dirs: set[str],
                plan: dict[str, list]) -> None:
    """Sort the entries of ``src`` (a folder of the old checkpoint) into files to carry, folders and conflicts."""
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = rel_dir + entry.name
        new = tmp / rel
        if entry.is_dir(follow_symlinks=False):
            if os.path.lexists(new) and not new.is_dir():
                plan["conflicts"].append(rel + "/")
                continue
            if rel not in our_dirs:
                plan["dirs"].append((Path(entry.path), new))
            _plan_carry(Path(entry.path), rel + "/", tmp, ours, our_dirs, plan)
        elif rel in ours:
            continue  # written by the earlier save: replaced or dropped
        elif os.path.lexists(new):
            plan["conflicts"].append(rel)
        else:
            plan["files"].append((Path(entry.path), new))


def _link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` as a hard link (same file, nothing copied), or as a copy where links are unsupported."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except OSError:
        pass
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_file():
        shutil.copy2(src, dst, follow_symlinks=False)
    else:
        raise CheckpointError(f"cannot keep {src} in the new checkpoint folder (it is not a regular file and this file "
                              "system has no hard links); move it out of the folder and save again")


def carry_user_files(target: Path, tmp: Path, ours: set[str], overwrite: bool) -> None:
    """Give the new folder every entry of the old one that no earlier save wrote; a name clash needs overwrite."""
    if not target.is_dir():
        return
    our_dirs = {"/".join(rel.split("/")[:i]) for rel in ours for i in range(1, rel.count("/") + 1)}
    plan: dict[str, list] = {"files": [], "dirs": [], "conflicts": []}
    _plan_carry(target, "", tmp, ours, our_dirs, plan)
    if plan["conflicts"] and not overwrite:
        names = ", ".join(plan["conflicts"][:5]) + (" ..." if len(plan["conflicts"]) > 5 else "")
        raise CheckpointError(f"{target} holds files that an earlier save did not write, with the names of files this "
                              f"save writes: {names}. Move them out of the folder, or pass overwrite=True to replace "
                              "them")
    for src, dst in plan["dirs"]:
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copystat(src, dst, follow_symlinks=False)
    for src, dst in plan["files"]:
        dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src, dst)


def _stale(target: Path, kind: str) -> list[Path]:
    """Leftover ``.<name>.<kind>-<pid>-*`` folders of saves to ``target`` whose process has died."""
    prefix = f".{target.name}.{kind}-"
    if not target.parent.is_dir():
        return []
    out = []
    for p in sorted(target.parent.iterdir()):
        if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink():
            try:
                pid = int(p.name[len(prefix):].split("-")[0])
            except ValueError:
                continue
            if not _pid_alive(pid):
                out.append(p)
    return out


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``b`` is ``a`` (a hard link) or a regular file with the same bytes."""
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    if (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino):
        return True
    if stat.S_ISLNK(sa.st_mode) and stat.S_ISLNK(sb.st_mode):
        return os.readlink(a) == os.readlink(b)
    if not (stat.S_ISREG(sa.st_mode) and stat.S_ISREG(sb.st_mode)) or sa.st_size != sb.st_size:
        return False
    return sha256_file(a) == sha256_file(b)


def _only_in(old: Path, target: Path) -> list[str]:
    """Files of a stale ``.old`` copy that are neither its own checkpoint files nor present in ``target``."""
    ours, _ = verified_files(old)
    left = []
    for folder, _dirs, names in os.walk(old):
        for name in sorted(names):
            path = Path(folder) / name
            rel = path.relative_to(old).as_posix()
            if rel not in ours and rel != MANIFEST and not _same_file(path, target / rel):
                left.append(rel)
    return left


def clean_stale(target: Path) -> None:
    """Tidy up after killed saves: put a lone ``.old`` copy back; delete copies that hold nothing else."""
    for old in _stale(target, "old"):
        if not os.path.lexists(target):
            os.rename(old, target)  # killed between the two renames of the swap: the previous checkpoint goes back
            continue
        left = _only_in(old, target)
        if left:
            warnings.warn(f"{old.name} (left by an interrupted save) holds files that are not in {target}: "
                          f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}; it is kept: move what you need "
                          "out of it, then delete it")
        else:
            shutil.rmtree(old, ignore_errors=True)
    for tmp in _stale(target, "tmp"):
        shutil.rmtree(tmp, ignore_errors=True)  # new files and links to files that are still in place


def swap_into_place(tmp: Path, target: Path) -> None:
    """Rename tmp to target; an existing target is moved aside first and deleted only afterwards."""
    old = None
    if target.exists() or target.is_symlink():
        old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None and not target.exists():
            os.rename(old, target)  # put the previous checkpoint back
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
