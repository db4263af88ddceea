"""A held-out cloze as a local lm-eval task: predict a passage's final word from the passage, LAMBADA-style.

lm-eval's ``lambada_openai`` (lm_eval/tasks/lambada/ in the installed package) asks for the loglikelihood of a
passage's last word (with its leading space) given the words before it; ``acc`` is whether greedy decoding gives
the word (the ``is_greedy`` of an ``output_type: loglikelihood`` request), ``perplexity`` is exp of the mean
negative log-likelihood of the target words. :func:`write_cloze_task` writes the same task over documents the
programs never saw (``explain`` passes its test split's), so a hybrid's cost shows on held-out text.

Each usable document gives one example: a target is a whole word (letters, inner apostrophes) that ends a
sentence (``.``, ``!`` or ``?`` follows it), preceded by one space and by at least ``MIN_CONTEXT_WORDS`` words of
the document; one is drawn per document from ``seed`` and the document's sha256, so a document's example does not
depend on the other documents. The context is the whole document up to the target; contexts longer than the
model's window are cut on the left by the model adapter (headsurgeon/surgery/measure/lm_eval_model.py), as lm-eval's own models do.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

from ...core import InputError
from ...core.fileio import atomic_write_bytes, sha256_bytes

__all__ = ["write_cloze_task", "MIN_CONTEXT_WORDS", "TASK_NAME"]

#: words of document a target needs before it (LAMBADA's targets need a passage, not a sentence start)
MIN_CONTEXT_WORDS = 10
#: a name lm-eval's command line and file names take as it is: a letter or _, then letters, digits, _ or -
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}")
# one space after a non-space, then a whole word of letters (inner apostrophes kept) right before . ! or ?
_TARGET = re.compile(r"(?<=\S) ([^\W\d_]+(?:['’][^\W\d_]+)*)(?=[.!?])")
_WORDS = re.compile(r"\S+")  # the words of a context, as str.split() counts them


def _check_name(name: object) -> str:
    """The task name, or an InputError saying what lm-eval (and the data file's name) needs."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise InputError(f"cloze task name {name!r} cannot be used: lm-eval takes task names in comma-separated "
                         "lists and as file names, so give 1-100 characters of letters, digits, _ or -, starting "
                         "with a letter or _ (e.g. 'headsurgeon_cloze')")
    return name


def _check_folder(folder: str | Path) -> Path:
    """The task folder, created if missing; an InputError when it is a file or cannot be made."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"the cloze task folder {folder} is a file: pass a folder (new or existing) for the "
                         "task's YAML and data files")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the cloze task folder {folder} ({e.strerror or e}): pass a folder you "
                         "can write") from None
    return folder.resolve()


def _claimed_elsewhere(folder: Path, name: str, own: Path) -> Path | None:
    """Another YAML file under ``folder`` (lm-eval indexes it recursively) that defines a task or group ``name``."""
    declares = re.compile(rf"^\s*(?:task|group)\s*:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.MULTILINE)
    for path in sorted(folder.rglob("*.yaml")):
        if path != own and path.is_file() and declares.search(path.read_text(encoding="utf-8", errors="replace")):
            return path
    return None


def _example(document: str, index: int, seed: int) -> dict[str, object] | None:
    """The document's cloze example (context, target with its leading space), or None when it has no target."""
    enough = next(itertools.islice(_WORDS.finditer(document), MIN_CONTEXT_WORDS - 1, None), None)
    starts = list(_TARGET.finditer(document, enough.end())) if enough is not None else []  # linear in the text
    if not starts:
        return None
    digest = hashlib.sha256(document.encode("utf-8")).hexdigest()
    pick = random.Random(f"headsurgeon-cloze:{seed}:{digest}").choice(starts)
    return {"context": document[: pick.start()], "target": " " + pick.group(1), "document": index}


def _examples(documents: Sequence[str], limit: int | None, seed: int) -> list[dict[str, object]]:
    """One example per usable document (duplicates once), then ``limit`` of them drawn with ``seed``, in order."""
    if isinstance(documents, (str, bytes)) or not isinstance(documents, Sequence):
        raise InputError(f"documents must be a list of strings (one per document), not {type(documents).__name__}")
    bad = next((i for i, d in enumerate(documents) if not isinstance(d, str)), None)
    if bad is not None:
        raise InputError(f"document {bad} is a {type(documents[bad]).__name__}, not a string: pass document texts")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit must be a whole number >= 1 or None (every usable document), not {limit!r}")
    seen: set[tuple[object, object]] = set()
    examples = []
    for i, document in enumerate(documents):
        example = _example(document, i, seed)
        if example is not None and (example["context"], example["target"]) not in seen:
            seen.add((example["context"], example["target"]))
            examples.append(example)
    if not examples:
        raise InputError(f"none of the {len(documents)} documents has a word ending a sentence after at least "
                         f"{MIN_CONTEXT_WORDS} words: the cloze needs passages of a few sentences (give more or "
                         "longer held-out documents)")
    if limit is not None and limit < len(examples):
        keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
        examples = [examples[i] for i in keep]
    return examples


def _config(name: str, data: Path, n: int, n_documents: int, seed: int, sha: str) -> str:
    """lm-eval's lambada_openai config over a local JSON-lines file (strings written as JSON, which YAML reads)."""
    q = json.dumps
    return "\n".join([
        f"# Held-out cloze by headsurgeon (headsurgeon/surgery/measure/cloze.py): the final word of {n} passages of {n_documents}",
        f"# documents, seed {seed}, scored as lm-eval's lambada_openai. write_cloze_task rewrites this file; the",
        "# data file is named by absolute path, so write the task again after moving this folder.",
        f"task: {q(name)}",
        "dataset_path: json",
        "dataset_kwargs:",
        "  data_files:",
        f"    test: {q(str(data))}",
        "output_type: loglikelihood",
        "test_split: test",
        "doc_to_text: context",
        "doc_to_target: target",
        "metric_list:",
        "  - metric: perplexity",
        "    aggregation: perplexity",
        "    higher_is_better: false",
        "  - metric: acc",
        "    aggregation: mean",
        "    higher_is_better: true",
        "metadata:",
        "  version: 1.0",
        f"  examples: {n}",
        f"  seed: {seed}",
        f"  data_sha256: {q(sha)}",
        "",
    ])


def write_cloze_task(documents: list[str], folder: Path, *, name: str = "headsurgeon_cloze",
                     limit: int | None = None, seed: int = 0) -> tuple[str, Path]:
    """Write a LAMBADA-style cloze over ``documents`` into ``folder`` (``NAME.yaml`` and its JSON-lines data, each
    atomically; no download) and return (task name, include path) for ``downstream(..., include_path=)``.

    ``limit``: at most this many examples (drawn with ``seed``; default one per usable document). The folder is
    indexed by lm-eval recursively, so give it a folder of its own; a name lm-eval already has would shadow
    lm-eval's task of that name.
    """
    name = _check_name(name)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InputError(f"seed must be a whole number, not {seed!r}")
    examples = _examples(documents, limit, seed)
    folder = _check_folder(folder)
    config = folder / f"{name}.yaml"
    other = _claimed_elsewhere(folder, name, config)
    if other is not None:
        raise InputError(f"{other} already defines an lm-eval task or group {name!r} in the folder {folder}: give "
                         "the cloze another name or another folder")
    body = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples).encode("utf-8")
    sha = sha256_bytes(body)
    data = folder / f"{name}.{sha[:12]}.jsonl"  # named by content: no reader (or datasets' cache) sees stale rows
    atomic_write_bytes(data, body)
    atomic_write_bytes(config, _config(name, data, len(examples), len(documents), seed, sha).encode("utf-8"))
    stale = re.compile(rf"{re.escape(name)}\.[0-9a-f]{{12}}\.jsonl")
    for old in folder.iterdir():
        if old != data and stale.fullmatch(old.name) and old.is_file():
            old.unlink(missing_ok=True)
    return name, folder
