"""The held-out cloze (headsurgeon/surgery/measure/cloze.py): a LAMBADA-style local lm-eval task written from given documents only."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import CORPUS, need

WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")


@pytest.fixture(scope="module")
def documents() -> list[str]:
    """Held-out documents: the last 120 of the shared TinyStories text (no program was fitted on them here)."""
    from headsurgeon.core.fileio import split_documents

    return split_documents(need(CORPUS).read_text(encoding="utf-8"))[-120:]


def _config(folder: Path, name: str) -> dict:
    import yaml

    return yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8"))


def _rows(folder: Path, name: str = "headsurgeon_cloze") -> list[dict]:
    data = Path(_config(folder, name)["dataset_kwargs"]["data_files"]["test"])
    return [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]


def test_examples_are_final_words_of_the_given_documents(documents, tmp_path):
    """Every example is a prefix of one given document followed by a whole, sentence-final word with its space."""
    from headsurgeon.surgery.measure.cloze import MIN_CONTEXT_WORDS, write_cloze_task

    name, include = write_cloze_task(documents, tmp_path / "task")
    assert (name, include) == ("headsurgeon_cloze", (tmp_path / "task").resolve())
    rows = _rows(include)
    assert len(documents) / 2 < len(rows) <= len(documents)  # one per usable document
    for row in rows:
        context, target, doc = row["context"], row["target"], documents[row["document"]]
        assert target.startswith(" ") and WORD.fullmatch(target[1:])
        assert doc.startswith(context + target) and doc[len(context + target)] in ".!?"
        assert len(context.split()) >= MIN_CONTEXT_WORDS and not context[-1].isspace()


def test_examples_are_deterministic_for_a_seed(documents, tmp_path):
    """Same seed, same bytes; another seed, other words; a document's example does not depend on the others."""
    from headsurgeon.surgery.measure.cloze import write_cloze_task

    def rows(docs, folder, **kw):
        return _rows(write_cloze_task(docs, tmp_path / folder, **kw)[1])

    first = rows(documents, "a")
    assert rows(documents, "b") == first
    assert rows(documents, "c", seed=1) != first
    assert rows(documents[40:], "d") == [{**r, "document": r["document"] - 40} for r in first if r["document"] >= 40]
    some = rows(documents, "e", limit=10)
    assert len(some) == 10 and all(r in first for r in some) and some == rows(documents, "f", limit=10)


def test_rewriting_the_task_replaces_its_data(documents, tmp_path):
    """A second write into the same folder leaves one data file, the one the YAML names, with the new rows."""
    from headsurgeon.surgery.measure.cloze import write_cloze_task

    write_cloze_task(documents, tmp_path, seed=0)
    write_cloze_task(documents, tmp_path, seed=1)
    (data,) = tmp_path.glob("*.jsonl")
    assert Path(_config(tmp_path, "headsurgeon_cloze")["dataset_kwargs"]["data_files"]["test"]) == data
    assert _rows(tmp_path) == _rows(write_cloze_task(documents, tmp_path / "fresh", seed=1)[1])


def test_task_loads_in_lm_evals_task_manager_offline_as_lambada_does(documents, tmp_path, monkeypatch):
    """lm-eval builds the task from the folder with the Hub switched off; its requests and metrics are lambada's."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install 'headsurgeon[eval]' (or .[test])")
    import datasets
    import huggingface_hub
    import lm_eval
    import yaml
    from lm_eval.tasks import TaskManager

    from headsurgeon.surgery.measure.cloze import write_cloze_task

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    name, include = write_cloze_task(documents, tmp_path, name="held_out_cloze", limit=8)
    task = TaskManager(include_path=str(include), include_defaults=False).load([name])["tasks"][name]
    docs = list(task.test_docs())
    assert [(task.doc_to_text(d), task.doc_to_target(d)) for d in docs] == [
        (r["context"], r["target"]) for r in _rows(include, name)]
    lambada = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "lambada" / "lambada_openai.yaml").read_text())
    ours = _config(include, name)
    assert task.OUTPUT_TYPE == "loglikelihood" == lambada["output_type"]
    assert ours["metric_list"] == lambada["metric_list"]  # acc (is_greedy) and the target's perplexity


def test_downstream_scores_base_and_hybrids_on_the_cloze(documents, tmp_path, monkeypatch):
    """Base and hybrid accuracies and perplexities through downstream; every head on first() costs perplexity.

    With 16 examples and a base accuracy near 0.1 on the 16-head embedded model, accuracy moves by one or two
    examples, so the crude hybrid is checked on the target words' perplexity, which rises several-fold."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install 'headsurgeon[eval]' (or .[test])")
    import functools

    import lm_eval.tasks

    import headsurgeon as hs
    from headsurgeon.surgery.measure.cloze import write_cloze_task
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.synth.program import Program

    # the task manager without lm-eval's 14,000 task files (downstream otherwise indexes them all, 12-35 s here);
    # downstream finds the cloze through include_path all the same
    monkeypatch.setattr(lm_eval.tasks, "TaskManager",
                        functools.partial(lm_eval.tasks.TaskManager, include_defaults=False))
    handle = load_model("tiny-stories")
    short = [d for d in documents if len(d.split()) <= 40]  # short contexts: a fast forward
    name, include = write_cloze_task(short, tmp_path / "cloze", limit=16)

    def scores(programs: str, heads: list, **kw) -> dict[str, dict]:
        result = hs.downstream(handle, [name], programs={h: Program.parse(programs) for h in heads}, **kw)
        assert result["hybrid_heads"] == len(heads)
        return {row["metric"]: row for row in result["rows"]}

    few = scores("prev(1)", handle.heads[:3], limit=4, include_path=include)  # the returned Path
    assert set(few) == {"acc", "perplexity"} and all(row["n"] == 4 for row in few.values())
    assert 0 <= few["acc"]["base"] <= 1 and 0 <= few["acc"]["hybrid"] <= 1 and few["perplexity"]["hybrid"] > 1
    crude = scores("first()", handle.heads, include_path=str(include))
    assert crude["acc"]["n"] == 16 and 0 <= crude["acc"]["hybrid"] <= 1
    assert crude["perplexity"]["hybrid"] > crude["perplexity"]["base"] > 1
    low, high = crude["perplexity"]["delta_ci95"]
    assert 0 < low <= crude["perplexity"]["delta"] <= high


@pytest.mark.parametrize("documents, kwargs, match", [
    ([], {}, "none of the 0 documents"),
    (["Too short to ask for a word."], {}, "none of the 1 documents"),
    ("one long string, not a list", {}, "list of strings"),
    ([b"bytes"], {}, "document 0 is a bytes"),
    (["x"], {"name": "a,b"}, "cannot be used"),
    (["x"], {"name": "with space"}, "cannot be used"),
    (["x"], {"name": "../up"}, "cannot be used"),
    (["x"], {"name": ""}, "cannot be used"),
    (["x"], {"limit": 0}, "limit must be"),
])
def test_bad_input_names_the_problem(documents, kwargs, match, tmp_path):
    from headsurgeon.core import InputError
    from headsurgeon.surgery.measure.cloze import write_cloze_task

    with pytest.raises(InputError, match=match):
        write_cloze_task(documents, tmp_path / "task", **kwargs)
    assert not (tmp_path / "task").exists()  # refused before anything is written


def test_bad_folders_name_the_problem(documents, tmp_path):
    """A folder that is a file, and a folder where another YAML file already defines the task's name."""
    from headsurgeon.core import InputError
    from headsurgeon.surgery.measure.cloze import write_cloze_task

    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(InputError, match="is a file"):
        write_cloze_task(documents, tmp_path / "file")
    (tmp_path / "tasks" / "mine").mkdir(parents=True)
    (tmp_path / "tasks" / "mine" / "other.yaml").write_text("task: headsurgeon_cloze\noutput_type: loglikelihood\n")
    with pytest.raises(InputError, match="other.yaml already defines.*another name"):
        write_cloze_task(documents, tmp_path / "tasks")
    assert write_cloze_task(documents, tmp_path / "tasks", name="cloze_2")[0] == "cloze_2"
