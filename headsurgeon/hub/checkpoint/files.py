"""Reading a checkpoint's files as untrusted input: no symlinks, regular files only, sizes before bytes.

Every file is opened through ``open_member``: each folder on its path and the file itself are opened without
following symlinks (only the Hub cache's links into its blobs/ folder are allowed), the file must be regular,
and its size is checked against the manifest before a byte is read; nothing is read past it (SECURITY.md).
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Mapping

from headsurgeon.synth.errors import excerpt

from .errors import IntegrityError
from .layout import MANIFEST, MAX_PROGRAM_BYTES

__all__ = ["member_parts", "symlink_error", "read_member", "read_whole", "file_info", "verify_files"]

_CHUNK = 1 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def member_parts(rel: Any) -> list[str]:
    """The folder names and file name of a manifest path; anything that could leave the checkpoint is refused."""
    parts = rel.split("/") if isinstance(rel, str) and len(rel) <= 1024 and rel.isprintable() else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in rel or ":" in parts[0]:
        raise IntegrityError(f"the manifest lists an unsafe path {excerpt(rel)} (outside the checkpoint, or not a "
                             "plain relative path); refusing to load")
    return parts


def symlink_error(root: Path, rel: str) -> IntegrityError:
    """The error for a symlink inside a checkpoint: loading never reads anything outside the folder."""
    return IntegrityError(
        f"{rel} in {root} is a symbolic link; a checkpoint holds only real files and folders, so that nothing is "
        "read from outside it. Replace the link by a copy of what it points to, or download or save the checkpoint "
        "again"
    )


def _open_error(root: Path, where: str, rel: str, error: OSError) -> IntegrityError:
    """Explain why opening ``where`` (``rel`` or one of its folders) failed."""
    path = root / where
    if path.is_symlink():
        return symlink_error(root, where)
    if not os.path.lexists(path):
        return IntegrityError(f"{rel} is missing from {root} (the manifest lists it); the checkpoint is incomplete: "
                              "download or save it again")
    if where != rel and not path.is_dir():
        return IntegrityError(f"{where} in {root} is not a folder, but the manifest lists {rel} inside it; "
                              "download or save the checkpoint again")
    return IntegrityError(f"cannot open {rel} in {root} ({error.strerror}); check its permissions")


def _open_hub_blob(root: Path, rel: str, blobs: Path) -> int:
    """Open a Hub cache link: allowed only when it resolves to a file directly inside the cache's blobs folder."""
    real = Path(os.path.realpath(root / rel))
    if real.parent != Path(os.path.realpath(blobs)):
        raise symlink_error(root, rel)
    try:
        return os.open(real, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError as e:
        raise IntegrityError(f"cannot open {rel} in {root} (a link to {real}: {e.strerror}); download the checkpoint "
                             "again") from None


def _check_regular(fd: int, root: Path, rel: str) -> os.stat_result:
    """fstat an opened member and refuse anything but a regular file (FIFOs, devices, sockets, folders)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise IntegrityError(f"{rel} in {root} is not a regular file ({what}); a checkpoint holds only regular files: "
                             "download or save it again")
    return st


def _open_member(root: Path, rel: str, links_into: Path | None = None) -> tuple[int, int]:
    """Open a checkpoint file without following any symlink (except Hub cache links into ``links_into``).

    Returns the descriptor and the file's size. O_NONBLOCK keeps a FIFO from blocking the open.
    """
    parts = member_parts(rel)
    dir_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                fd = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd)
            except OSError as e:
                raise _open_error(root, "/".join(parts[: i + 1]), rel, e) from None
            os.close(dir_fd)
            dir_fd = fd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dir_fd)
        except OSError as e:
            if links_into is None or not (root / rel).is_symlink():
                raise _open_error(root, rel, rel, e) from None
            fd = _open_hub_blob(root, rel, links_into)
    finally:
        os.close(dir_fd)
    return fd, _check_regular(fd, root, rel).st_size


def _size_error(root: Path, rel: str, size: int, want: int) -> IntegrityError:
    """The error for a file whose size is not the one the manifest lists."""
    what = "truncated" if size < want else "longer than saved"
    return IntegrityError(f"{rel} in {root} is {what}: {size} bytes, the manifest says {want} (sha256 would not "
                          "match); download or save the checkpoint again")


def _read_fd(fd: int, size: int, keep: bool) -> tuple[str, bytes | None]:
    """sha256 of exactly ``size`` bytes from ``fd`` (and the bytes, with keep); None if the file is shorter."""
    digest, chunks, left = hashlib.sha256(), [], size
    while left:
        chunk = os.read(fd, min(_CHUNK, left))
        if not chunk:
            return "", None
        digest.update(chunk)
        left -= len(chunk)
        if keep:
            chunks.append(chunk)
    return digest.hexdigest(), (b"".join(chunks) if keep else None)


def read_member(root: Path, rel: str, want_size: int, links_into: Path | None = None,
                 keep: bool = False) -> tuple[str, bytes | None]:
    """sha256 (and with keep the bytes) of a checkpoint file that must be ``want_size`` bytes; never reads past it."""
    fd, size = _open_member(root, rel, links_into)
    try:
        if size != want_size:
            raise _size_error(root, rel, size, want_size)
        digest, data = _read_fd(fd, size, keep)
        if not digest:
            raise _size_error(root, rel, os.fstat(fd).st_size, want_size)
        return digest, data
    finally:
        os.close(fd)


def read_whole(root: Path, rel: str, limit: int, links_into: Path | None = None) -> bytes:
    """The bytes of a checkpoint file without a listed size (manifest.json), refusing one over ``limit`` bytes."""
    fd, size = _open_member(root, rel, links_into)
    try:
        if size > limit:
            raise IntegrityError(f"{rel} in {root} is {size} bytes, more than the {limit} a {rel} may have; "
                                 "the checkpoint is damaged: download or save it again")
        _, data = _read_fd(fd, size, keep=True)
        if data is None:
            raise IntegrityError(f"{rel} in {root} shrank while it was read; load it again")
        return data
    finally:
        os.close(fd)


def file_info(rel: str, info: Any) -> tuple[int, str]:
    """The (size, sha256) the manifest lists for ``rel`` (a path member_parts accepted); both are required."""
    if not isinstance(info, dict) or "size" not in info:
        raise IntegrityError(f"the manifest gives no size for {rel}; sizes are required so that no file "
                             "is read past what was saved: save the checkpoint again")
    size, sha = info["size"], info.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise IntegrityError(f"the manifest's size for {rel} is {excerpt(size)}, not a byte count; save the "
                             "checkpoint again")
    if not isinstance(sha, str):
        raise IntegrityError(f"the manifest gives no sha256 for {rel}; save the checkpoint again")
    return size, sha


def _program_files(manifest: Mapping[str, Any]) -> set[str]:
    """The files the manifest's heads name as their programs."""
    return {program for item in manifest["heads"].values()
            if isinstance(item, dict) and isinstance(program := item.get("program"), str)}


def verify_files(root: Path, manifest: Mapping[str, Any], links_into: Path | None = None) -> dict[str, bytes]:
    """Check the folder's shape, then every listed file's size and sha256; returns the program files' bytes.

    No symlink, special file or unlisted (non-hidden) file may be present, and no path may leave the folder.
    """
    files = manifest["files"]
    _refuse_unlisted(root, files, links_into)
    programs = _program_files(manifest)
    kept: dict[str, bytes] = {}
    for rel, info in files.items():
        member_parts(rel)
        size, want = file_info(rel, info)
        if rel in programs and size > MAX_PROGRAM_BYTES:
            raise IntegrityError(f"{rel} in {root} is a program file of {size} bytes, too large for a program (at "
                                 f"most {MAX_PROGRAM_BYTES}); refusing to load this checkpoint")
        got, data = read_member(root, rel, size, links_into, keep=rel in programs)
        if got != want:
            raise IntegrityError(f"{rel} in {root} was modified after saving: sha256 {got}, the manifest says "
                                 f"{excerpt(want)}; download or save the checkpoint again")
        if data is not None:
            kept[rel] = data
    return kept


def _refuse_unlisted(root: Path, files: Mapping[str, Any], links_into: Path | None) -> None:
    """No symlink (but Hub cache links of listed files), and nothing unlisted but hidden entries, in the folder."""
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .cache/ of hub downloads, .git: never read
        for name in sorted(dirs) + sorted(n for n in names if not n.startswith(".")):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() and not (links_into is not None and (rel in files or rel == MANIFEST)):
                raise symlink_error(root, rel)
            if name in dirs or rel in files or rel == MANIFEST:
                continue
            if not path.is_file():
                raise IntegrityError(f"{rel} in {root} is not a regular file and is not listed in the manifest; "
                                     "remove it, or download or save the checkpoint again")
            raise IntegrityError(f"{rel} in {root} is not listed in the manifest (added after saving?); remove it "
                                 "or move it out of the checkpoint folder")
