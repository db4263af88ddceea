"""Downstream task data offline: one clear line in seconds instead of half a minute of retries and a traceback.

lm-eval downloads a task's dataset from the Hugging Face Hub (``datasets``), and ``huggingface_hub`` retries a
failed connection with backoff (about 25 s per dataset) before a raw ``ConnectionError``. :func:`hub_data` probes
the Hub's host once (one TCP connect, ``PROBE_TIMEOUT`` s); when it cannot be reached it runs the evaluation in
the libraries' offline mode, so cached datasets and local tasks still work and a missing download fails at once,
and it turns a connection failure into a :class:`TaskDataError` naming the tasks and the fix.
"""
from __future__ import annotations

import contextlib
import socket
from typing import Iterator
from urllib.parse import urlparse

from ...core import HeadsurgeonError

__all__ = ["TaskDataError", "hub_data", "PROBE_TIMEOUT"]

PROBE_TIMEOUT = 3.0  # seconds for the one TCP connect to the Hub's host
_CONNECTION_ERRORS = {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectError", "ConnectTimeout",
                      "ConnectionError", "NameResolutionError", "MaxRetryError"}


class TaskDataError(HeadsurgeonError, ValueError):
    """A downstream task's dataset cannot be downloaded (no network); the message names the tasks and the fix."""


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(getattr(constants, "ENDPOINT", "https://huggingface.co"))


def _reachable(endpoint: str) -> bool:
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT):
            return True
    except OSError:
        return False


def _is_connection_failure(error: BaseException | None) -> bool:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionError) or type(error).__name__ in _CONNECTION_ERRORS:
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def _offline(on: bool) -> Iterator[None]:
    """huggingface_hub's and datasets' offline switches, set for the block (they are read at call time)."""
    if not on:
        yield
        return
    from huggingface_hub import constants

    try:
        from datasets import config as ds_config
    except ImportError:  # pragma: no cover - lm-eval depends on datasets
        ds_config = None
    saved = (constants.HF_HUB_OFFLINE, getattr(ds_config, "HF_HUB_OFFLINE", None))
    constants.HF_HUB_OFFLINE = True
    if ds_config is not None:
        ds_config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved[0]
        if ds_config is not None:
            ds_config.HF_HUB_OFFLINE = saved[1]


@contextlib.contextmanager
def hub_data(tasks: list[str]) -> Iterator[None]:
    """Run a downstream evaluation of ``tasks``: offline mode when the Hub is unreachable, one clear error."""
    from huggingface_hub import constants

    endpoint = _endpoint()
    already = bool(constants.HF_HUB_OFFLINE)
    cut_off = not already and not _reachable(endpoint)
    try:
        with _offline(cut_off):
            yield
    except Exception as e:  # noqa: BLE001 - only connection failures are translated; the rest propagates
        if not _is_connection_failure(e):
            raise
        why = "offline mode is on (HF_HUB_OFFLINE)" if already else f"{endpoint} cannot be reached from this machine"
        raise TaskDataError(
            f"the datasets of task(s) {', '.join(tasks)} are not cached and cannot be downloaded: {why}. Run once "
            "with network access (the datasets are then cached), point HF_DATASETS_CACHE / HF_HOME at a cache that "
            "holds them, or use tasks with local data (--include-path)") from None
