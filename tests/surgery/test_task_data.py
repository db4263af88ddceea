"""Downstream task data offline (headsurgeon/surgery/measure/task_data.py): a missing dataset is one TaskDataError at once."""
from __future__ import annotations

import socket

import pytest

from headsurgeon.surgery.measure import task_data
from headsurgeon.surgery.measure.task_data import TaskDataError, hub_data


def dead_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_unreachable_hub_turns_a_dataset_download_into_one_clear_error(monkeypatch, tmp_path):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", dead_endpoint())
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))  # nothing cached
    before = constants.HF_HUB_OFFLINE
    with pytest.raises(TaskDataError, match=r"task\(s\) eaps6 .*cannot be reached.*network access"):
        with hub_data(["eaps6"]):
            assert constants.HF_HUB_OFFLINE  # offline mode: no retries with backoff
            datasets.load_dataset("Rowan/hellaswag", split="validation", cache_dir=str(tmp_path))
    assert constants.HF_HUB_OFFLINE == before and datasets.config.HF_HUB_OFFLINE == before


def test_a_reachable_hub_changes_nothing_and_other_errors_pass_through(monkeypatch):
    from huggingface_hub import constants

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        before = constants.HF_HUB_OFFLINE
        with pytest.raises(KeyError):
            with hub_data(["hs_cloze"]):
                assert constants.HF_HUB_OFFLINE == before  # the Hub answers: online as before
                raise KeyError("not a connection failure")


def test_connection_failures_are_recognised_through_the_exception_chain():
    try:
        try:
            raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub")
        except ConnectionError as inner:
            raise RuntimeError("building the task failed") from inner
    except RuntimeError as e:
        assert task_data._is_connection_failure(e)
    assert not task_data._is_connection_failure(ValueError("bad config"))
