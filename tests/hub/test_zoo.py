"""Tests for the embedded default model: shipped files and loading (headsurgeon/hub/zoo.py), quality, and the recipe that
built them (recipes/tiny_stories/, loaded by path: it is not installed)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from headsurgeon.hub import zoo
from conftest import CORPUS, ROOT
from headsurgeon.core.fileio import split_documents

FIVE_MB = 5 * 1000 * 1000
EOT = "<|endoftext|>"
RECIPES = ROOT / "recipes" / "tiny_stories"


def _recipe(name: str):
    """Import recipes/tiny_stories/<name>.py by path as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"tiny_stories_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script runs
    spec.loader.exec_module(module)
    return module


train_recipe = _recipe("train")
sample_recipe = _recipe("sample")


def _need_corpus() -> str:
    if not CORPUS.is_file():
        pytest.skip(f"TinyStories text not found at {CORPUS} (../shared beside the checkout is absent)")
    return CORPUS.read_text(encoding="utf-8")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """One torch thread: on a shared CPU, tiny ops with 2 spinning OpenMP threads were >10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shipped():
    """The shipped model, tokenizer, directory and training record, loaded the plain transformers way."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    d = zoo.default_model_dir()
    model = GPT2LMHeadModel.from_pretrained(d, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    record = json.loads((d / "training.json").read_text(encoding="utf-8"))
    return model, tok, d, record


def _heldout_windows(tok, n_windows: int, seq_len: int) -> torch.Tensor:
    """Independent re-derivation of the held-out stream: last 10% of blank-line separated docs, EOT-joined."""
    text = _need_corpus()
    docs = [d.strip() for d in re.split(r"\n\s*\n", text) if d.strip()]
    held = docs[len(docs) - round(0.1 * len(docs)) :]
    eot = tok.convert_tokens_to_ids(EOT)
    stream: list[int] = []
    for d in held:
        stream.append(eot)
        stream.extend(tok.encode(d, add_special_tokens=False))
    # windows spread over the whole held-out stream
    starts = np.linspace(0, len(stream) - seq_len - 2, n_windows).astype(int)
    return torch.tensor([stream[s : s + seq_len + 1] for s in starts])


# ------------------------------------------------------------------------------------ shipped files


def test_shipped_files_and_size(shipped):
    _, _, d, _ = shipped
    assert d == Path(zoo.__file__).resolve().parent / "zoo_data" / "tiny-stories"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training.json"):
        assert (d / name).is_file(), name
    files = [p for p in d.rglob("*") if p.is_file()]
    apparent = sum(p.stat().st_size for p in files)
    assert apparent <= FIVE_MB, f"shipped model is {apparent} bytes"
    du = subprocess.run(["du", "-sb", str(d)], capture_output=True, text=True)
    if du.returncode == 0:
        assert int(du.stdout.split()[0]) <= FIVE_MB + 8192  # + the directory entry itself
    assert not any(p.suffix in (".bin", ".pt", ".pkl", ".pth") for p in files), "pickle-based weights shipped"


def test_loads_offline_with_expected_architecture(shipped):
    model, tok, _, record = shipped
    cfg = model.config
    assert cfg.model_type == "gpt2"
    assert model.config._attn_implementation == "eager"
    assert next(model.parameters()).dtype == torch.float32
    assert cfg.vocab_size == len(tok) == record["tokenizer"]["vocab_size"]
    assert 1024 <= cfg.vocab_size <= 4096
    eot = tok.convert_tokens_to_ids(EOT)
    assert tok.bos_token_id == tok.eos_token_id == eot == cfg.bos_token_id == cfg.eos_token_id
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == record["model"]["parameters"]
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()  # tied
    for k in ("n_layer", "n_head", "n_embd", "n_positions"):
        assert getattr(cfg, k) == record["config"][k]


def test_load_helper_matches_plain_transformers(shipped):
    model, tok, _, _ = shipped
    m2, t2 = zoo.load()
    assert not m2.training
    x = torch.tensor([[tok.eos_token_id] + tok.encode("The cat sat on the mat.")])
    with torch.no_grad():
        torch.testing.assert_close(m2(x).logits, model(x).logits, rtol=0, atol=0)
    assert t2.encode("Lily ran home.") == tok.encode("Lily ran home.")


def test_tokenizer_round_trips_and_matches_raw_tokenizers(shipped):
    from tokenizers import Tokenizer

    _, tok, d, _ = shipped
    raw = Tokenizer.from_file(str(d / "tokenizer.json"))  # independent path: the Rust tokenizer directly
    texts = [
        'Once upon a time, there was a little girl named Lily. "Hi!" she said.',
        "Line one.\nLine two.\n\n  Indented, tabs\tand  double  spaces ",
        "Café naïve — émoji 🐶 and mojibake â€™ too",
        "",
    ]
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False)
        assert tok.decode(ids) == t
        assert raw.encode(t).ids == ids
        assert tok.convert_tokens_to_ids(EOT) not in ids
        spans = tok(t, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
        # offsets tile the text; byte tokens that split one character all carry that character's span
        distinct = [sp for i, sp in enumerate(spans) if i == 0 or sp != spans[i - 1]]
        assert "".join(t[a:b] for a, b in distinct) == t
        if t.isascii():
            assert len(distinct) == len(spans)
    # EOT is one token and the tokenizer does not add it by itself (GPT-2 convention)
    assert tok.encode(EOT + "Hi", add_special_tokens=False)[0] == tok.eos_token_id
    assert tok("Hi")["input_ids"] == tok.encode("Hi", add_special_tokens=False)
    # the BPE actually merges: common words are single tokens, so text compresses well below bytes
    sample = texts[0]
    assert len(tok.encode(sample)) < 0.4 * len(sample.encode())


def test_heldout_loss_well_below_uniform_and_matches_record(shipped):
    model, tok, _, record = shipped
    x = _heldout_windows(tok, n_windows=12, seq_len=record["config"]["seq_len"])
    with torch.no_grad():
        logits = model(x[:, :-1]).logits.double()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp.gather(-1, x[:, 1:, None]).squeeze(-1)
    loss = float(nll.mean())
    # independent baselines: uniform over the vocabulary, and a unigram model fitted on the training documents
    uniform = math.log(model.config.vocab_size)
    counts = np.ones(model.config.vocab_size)  # add-one smoothing
    docs = [d.strip() for d in re.split(r"\n\s*\n", _need_corpus()) if d.strip()]
    for ids in tok(docs[: len(docs) - round(0.1 * len(docs))], add_special_tokens=False)["input_ids"]:
        np.add.at(counts, ids, 1)
    unigram = float(-np.log(counts / counts.sum())[x[:, 1:].numpy()].mean())
    assert loss < 0.6 * uniform, (loss, uniform)
    assert loss < unigram - 1.0, (loss, unigram)
    assert abs(loss - record["heldout_loss"]) < 0.25, (loss, record["heldout_loss"])
    # the record itself is consistent: held-out above train (unseen text), both far below uniform
    assert record["train_loss"] < record["heldout_loss"] < 0.6 * record["uniform_loss"]
    assert record["steps"] > 0 and record["train_wall_s"] > 0
    assert record["data"]["heldout_documents"] == round(0.1 * record["data"]["documents"])


def test_greedy_generation_is_english_like(shipped):
    model, tok, _, _ = shipped
    text = _need_corpus()
    vocab = set(re.findall(r"[a-z]+", text.lower()))
    x = torch.tensor([[tok.bos_token_id]])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=60,
                             pad_token_id=tok.eos_token_id)
    gen = tok.decode(out[0, 1:], skip_special_tokens=True)
    words = re.findall(r"[A-Za-z]+", gen)
    assert len(words) >= 10, gen
    known = sum(w.lower() in vocab for w in words) / len(words)
    assert known >= 0.9, (known, gen)
    assert gen.count(" ") >= 8 and re.search(r"[.!?]", gen), gen


def test_sampling_is_seeded_and_tidy(shipped):
    _, _, d, _ = shipped
    kw = dict(model_path=d, max_new_tokens=32, batch_size=3, min_chars=1, progress=False)
    a = sample_recipe.sample_stories(3, seed=7, **kw)
    assert a == sample_recipe.sample_stories(3, seed=7, **kw) and len(a) == 3
    assert a != sample_recipe.sample_stories(3, seed=8, **kw)
    for s in a:
        assert s == s.strip() and "\n\n" not in s and EOT not in s


# ------------------------------------------------------------------------------------ demo corpus


def test_demo_corpus_shipped_and_not_copied():
    path = zoo.demo_corpus_path()
    assert path == Path(zoo.__file__).resolve().parent / "zoo_data" / "demo_corpus.txt"
    raw = path.read_text(encoding="utf-8")
    stories = [s.strip() for s in raw.split("\n\n") if s.strip()]
    assert stories == zoo.read_demo_corpus()
    assert 150 <= len(stories) <= 300
    assert all(len(s) >= 40 and EOT not in s for s in stories)
    assert len(set(stories)) == len(stories)
    words = re.findall(r"[A-Za-z]+", raw)
    assert len(words) > 3000
    if CORPUS.is_file():
        source = set(split_documents(CORPUS.read_text(encoding="utf-8")))
        copied = [s for s in stories if s in source]
        assert len(copied) <= 0.05 * len(stories), copied[:3]


# ------------------------------------------------------------------------------------ helpers and errors


def test_missing_files_give_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "ZOO_DATA", tmp_path)
    with pytest.raises(zoo.ZooFilesMissingError, match=r"python recipes/tiny_stories/train\.py"):
        zoo.default_model_dir()
    with pytest.raises(FileNotFoundError, match=r"python recipes/tiny_stories/sample\.py"):
        zoo.demo_corpus_path()
    (tmp_path / "tiny-stories").mkdir()
    (tmp_path / "tiny-stories" / "config.json").write_text("{}")
    with pytest.raises(zoo.ZooFilesMissingError, match="model.safetensors"):
        zoo.default_model_dir()


def test_split_and_heldout_helpers():
    text = "A one.\r\n\r\nB two.\n \nC\nthree.\n\n\n\nD four.\n"
    docs = split_documents(text)
    assert docs == ["A one.", "B two.", "C\nthree.", "D four."]
    tr, he = train_recipe.heldout_split(list(range(100)), 0.1)
    assert tr == list(range(90)) and he == list(range(90, 100))
    tr, he = train_recipe.heldout_split(["a", "b"], 0.1)
    assert tr == ["a"] and he == ["b"]
    with pytest.raises(ValueError):
        train_recipe.heldout_split(["a"], 0.1)
    cfg = train_recipe.TrainConfig(lr=1.0, warmup_steps=10, min_lr_frac=0.1)
    assert train_recipe.lr_at(0.0, 0, cfg) == pytest.approx(0.1)
    assert train_recipe.lr_at(0.0, 20, cfg) == pytest.approx(1.0)
    assert train_recipe.lr_at(1.0, 1000, cfg) == pytest.approx(0.1)
    assert train_recipe.lr_at(0.5, 1000, cfg) == pytest.approx(0.55)


def test_recipe_cli_help_runs():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for script in ("train.py", "sample.py"):
        r = subprocess.run([sys.executable, str(RECIPES / script), "--help"], capture_output=True, text=True,
                           timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        assert "usage" in r.stdout and "--seed" in r.stdout and "--out" in r.stdout
        if script == "train.py":
            assert "--minutes" in r.stdout


def test_recipe_is_not_installed_and_defaults_match_the_shipped_model(shipped):
    _, _, _, record = shipped
    assert not hasattr(zoo, "train") and not hasattr(zoo, "TrainConfig") and not hasattr(zoo, "sample_stories")
    assert dataclasses.asdict(train_recipe.TrainConfig()) == record["config"]
    assert record["seed"] == train_recipe.TrainConfig().seed == 0


def _toy_corpus(n_docs: int = 60) -> str:
    rng = np.random.default_rng(0)
    names, things = ["Tom", "Mia", "Ben", "Sue"], ["ball", "kite", "cake", "dog", "tree"]
    docs = []
    for _ in range(n_docs):
        n, t = rng.choice(names), rng.choice(things)
        docs.append(f"{n} had a big {t}. {n} liked the {t} very much. One day the {t} was gone, "
                    f"and {n} was sad. Then {n} found the {t} and smiled.")
    return "\n\n".join(docs) + "\n"


def test_recipe_smoke_run_produces_loadable_dir(tmp_path):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    data = tmp_path / "toy.txt"
    data.write_text(_toy_corpus(), encoding="utf-8")
    out = tmp_path / "tiny"
    rc = train_recipe.main(["--out", str(out), "--data", str(data), "--minutes", "0.05", "--seed", "3",
                   "--vocab-size", "300", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--n-inner", "64",
                   "--n-positions", "64", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "2",
                   "--eval-every", "0", "--quiet"])
    assert rc == 0
    rec = json.loads((out / "training.json").read_text())
    assert rec["seed"] == 3 and rec["steps"] >= 1
    assert rec["recipe"] == "python recipes/tiny_stories/train.py --seed 3 --minutes 0.05"
    assert rec["data"]["documents"] == 60 and rec["data"]["heldout_documents"] == 6
    assert math.isfinite(rec["heldout_loss"]) and math.isfinite(rec["train_loss"])
    assert (out / "README.md").is_file()
    model = GPT2LMHeadModel.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert model.config.n_layer == 1 and model.config.n_embd == 32 and model.config.vocab_size == len(tok)
    assert len(tok) <= 300 and tok.convert_tokens_to_ids(EOT) == 0
    assert tok.decode(tok.encode("Mia had a big kite.")) == "Mia had a big kite."
    assert not list(tmp_path.glob(".tiny.tmp-*")), "temporary directory left behind"
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in [out, *out.iterdir()]), "not world-readable"
    # a second run replaces the directory atomically and stays loadable
    rc = train_recipe.main(["--out", str(out), "--data", str(data), "--steps", "2", "--seed", "4",
                   "--vocab-size", "300", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--n-inner", "64",
                   "--n-positions", "64", "--seq-len", "32", "--batch-size", "4", "--eval-every", "0", "--quiet"])
    assert rc == 0
    rec = json.loads((out / "training.json").read_text())
    assert rec["seed"] == 4 and rec["steps"] == 2 and rec["schedule"] == "fixed steps"
    GPT2LMHeadModel.from_pretrained(out, local_files_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny", "toy.txt"]
