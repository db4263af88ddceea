"""Stage configs: the CLI's flags are the config fields, one default per setting, explain's keyword shortcuts beside
config=, and --dtype reaching load_model (headsurgeon/configs.py, headsurgeon/surgery/configs.py, headsurgeon/core/configs.py)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect

import pytest

from headsurgeon.cli import build_parser, main, parse
from headsurgeon.configs import (CaptureConfig, CorpusConfig, ExplainConfig, MeasureConfig, ModelConfig,
                                 ScaleoutConfig, SearchConfig)
from headsurgeon.core.configs import add_flags, flags, from_flags, setting, shortcut_paths
from headsurgeon.core import InputError

MODEL_COMMANDS = ("info", "capture", "explain", "score", "eval", "ablate")


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings} - {"-h", "--help"}


def default_of(p: argparse.ArgumentParser, flag: str):
    return next(a.default for a in p._actions if flag in a.option_strings)


def test_explain_flags_are_the_config_fields():
    got = options(subparser("explain"))
    assert got == set(flags(ExplainConfig))
    today = {"--capture-only", "--delta-ppl", "--device", "--heads-per-task", "--include-path", "--library",
             "--library-budget", "--limit", "--llm-base-url", "--llm-model", "--llm-cost-cap", "--max-len",
             "--max-sequences", "--ray", "--searchers", "--seed", "--store-url", "--tasks", "--tokenizer"}
    assert today | {"--dtype", "--order", "--cloze", "--head-costs"} <= got


def test_a_field_added_to_a_config_becomes_a_flag():
    @dataclasses.dataclass(frozen=True)
    class Toy:
        window: int = setting(8, help="tokens per window", type=int)
        names: tuple[str, ...] = setting(("a",), nargs="+", help="names")
        python_only: float = setting(0.5, flag=None, help="not on the command line")
        fast: bool = setting(False, action="store_true", help="go fast")

    p = argparse.ArgumentParser()
    add_flags(p, Toy)
    assert options(p) == set(flags(Toy)) == {"--window", "--names", "--fast"}
    assert from_flags(Toy, p.parse_args([])) == Toy()
    assert from_flags(Toy, p.parse_args(["--window", "3", "--names", "x", "y", "--fast"])) == \
        Toy(window=3, names=("x", "y"), fast=True)
    with pytest.raises(InputError, match="no flags for"):
        add_flags(argparse.ArgumentParser(), Toy, only=("python_only",))


def test_the_cli_defaults_are_the_config_defaults(monkeypatch, tmp_path):
    seen = {}

    def stand_in(model, corpus, out, config):
        seen["config"] = config
        raise InputError("stand-in: stop here")

    monkeypatch.setattr(importlib.import_module("headsurgeon.pipeline"), "explain", stand_in)
    assert main(["explain", "m", "c", str(tmp_path)]) == 1
    assert seen["config"] == ExplainConfig()
    args = parse(build_parser(), ["explain", "m", "c", "o", "--max-len", "20", "--ray", "host:6379", "--llm-model",
                                  "chat", "--searchers", "enumerative", "--dtype", "bfloat16", "--cloze"])
    cfg = from_flags(ExplainConfig, args, scaleout=ScaleoutConfig.from_ray_flag(args.address))
    assert cfg.corpus.max_len == 20 and cfg.search.searchers == ("enumerative",) and cfg.measure.cloze
    assert cfg.scaleout == ScaleoutConfig(executor="ray", address="host:6379")
    assert cfg.search.agent_config.model == "chat" and cfg.model.dtype == "bfloat16"
    assert ScaleoutConfig.from_ray_flag("") == ScaleoutConfig(executor="ray", address=None)


def test_one_default_per_setting():
    from headsurgeon.pipeline import explain
    from headsurgeon.surgery.patterns.capture import capture
    from headsurgeon.surgery.corpus import load_corpus, make_sequences
    from headsurgeon.surgery.measure.eval_report import evaluate_programs
    from headsurgeon.surgery.models.loading import load_model

    corpus, capture_cfg, model = CorpusConfig(), CaptureConfig(), ModelConfig()

    def defaults(fn):
        return {k: v.default for k, v in inspect.signature(fn).parameters.items()}

    for fn in (load_corpus, evaluate_programs):
        d = defaults(fn)
        assert (d["max_len"], d["max_sequences"], d["seed"]) == (corpus.max_len, corpus.max_sequences, corpus.seed)
    assert defaults(load_corpus)["fractions"] == corpus.fractions
    assert defaults(load_corpus)["separator"] == corpus.separator
    assert defaults(make_sequences)["max_len"] == corpus.max_len
    assert "config" in defaults(explain)  # explain's defaults are ExplainConfig's
    assert ExplainConfig().corpus == corpus
    d = defaults(capture)
    assert (d["mode"], d["q_frac"], d["batch_size"], d["shard_size"], d["value_norms"]) == dataclasses.astuple(capture_cfg)
    d = defaults(load_model)
    assert (d["tokenizer"], d["device"], d["dtype"]) == (model.tokenizer, model.device, model.dtype)
    for name in ("capture", "explain", "score", "eval", "ablate", "demo"):
        p = subparser(name)
        assert default_of(p, "--max-len") == corpus.max_len and default_of(p, "--seed") == corpus.seed
        assert default_of(p, "--max-sequences") == corpus.max_sequences
    assert default_of(subparser("eval"), "--order") == MeasureConfig().order == "iou"


def test_a_config_and_shortcuts_together_or_unknown_names_are_input_errors(tmp_path):
    from headsurgeon.pipeline import explain

    with pytest.raises(InputError, match=r"config= and keyword settings.*max_len is ExplainConfig\.corpus\.max_len"):
        explain("tiny-stories", None, tmp_path, config=ExplainConfig(), max_len=16)
    with pytest.raises(InputError, match=r"unknown setting\(s\) 'max_lenght' \(did you mean 'max_len'\?\)"):
        explain("tiny-stories", None, tmp_path, max_lenght=16)
    with pytest.raises(InputError, match="config must be a ExplainConfig, got dict"):
        explain("tiny-stories", None, tmp_path, config={"max_len": 16})
    assert not any(tmp_path.iterdir())  # refused before anything was written
    # a shortcut is the field of the same name, wherever it sits
    built = ExplainConfig.resolve(None, {"max_len": 16, "searchers": ("enumerative",), "delta_ppl": True,
                                         "executor": "ray", "capture_only": True})
    assert built == dataclasses.replace(
        ExplainConfig(), corpus=CorpusConfig(max_len=16), search=SearchConfig(searchers=("enumerative",)),
        measure=MeasureConfig(delta_ppl=True), scaleout=ScaleoutConfig(executor="ray"), capture_only=True)
    assert len(shortcut_paths(ExplainConfig)) == len(set(shortcut_paths(ExplainConfig)))


def test_searcher_options_reach_their_factories():
    from headsurgeon.synth.search.base import SearchSettings, make_searcher
    from headsurgeon.synth.search.learned.config import LearnedConfig

    search = SearchConfig(library=("prev(1)",), enumerative={"beam": 2}, learned=LearnedConfig(steps=3))
    opts = search.options()
    assert opts["library"] == ["prev(1)"] and opts["llm"] is None
    settings = SearchSettings(options=opts)
    from headsurgeon.synth.search.enumerative import EnumerativeConfig

    assert make_searcher("enumerative", settings).config == EnumerativeConfig(beam=2)
    seeded = SearchSettings(seed=7, options=SearchConfig(enumerative=EnumerativeConfig(top_k=3)).options())
    assert make_searcher("enumerative", seeded).config == EnumerativeConfig(top_k=3, seed=7)  # the run's seed
    assert make_searcher("learned", settings).options["config"].steps == 3
    assert set(SearchConfig().options()) == {"llm", "library"}  # today's journal fingerprint keys, unchanged


@pytest.fixture
def dtype_probe():
    """A model source ``probe:`` that records the dtype load_model hands it, then stops the run."""
    from headsurgeon.surgery.models.handle import ModelLoadError
    from headsurgeon.surgery.models.sources import ModelSource, register_model_source, unregister_model_source

    seen = []

    def load(spec, tokenizer, device, dtype, revision):
        seen.append(dtype)
        raise ModelLoadError("probe: stop here")

    register_model_source(ModelSource("probe", lambda s: isinstance(s, str) and s.startswith("probe:"), load))
    yield seen
    unregister_model_source("probe")


def test_dtype_flag_reaches_load_model_from_every_model_subcommand(dtype_probe, tmp_path, capsys):
    import torch

    corpus = tmp_path / "c.txt"
    corpus.write_text("one two three four five six.\n\nseven eight nine ten eleven.\n")
    for name in MODEL_COMMANDS:
        positionals = {"info": [], "capture": [str(corpus), str(tmp_path / "s")], "explain": [str(corpus),
                       str(tmp_path / "o")], "score": [str(corpus), "--head", "L0H0", "--program", "prev(1)"],
                       "eval": [str(corpus)], "ablate": [str(corpus), "--heads", "L0H0"]}[name]
        assert main([name, "probe:x", *positionals, "--dtype", "float16"]) == 1, name
        assert "probe: stop here" in capsys.readouterr().err
    assert dtype_probe == [torch.float16] * len(MODEL_COMMANDS)
    with pytest.raises(SystemExit):
        main(["info", "probe:x", "--dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_dtype_names_resolve_and_live_models_are_not_converted(gpt2_tokenizer_dir):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from headsurgeon.surgery.configs import DTYPES, torch_dtype
    from headsurgeon.surgery.models.handle import ModelLoadError
    from headsurgeon.surgery.models.loading import load_model

    assert [torch_dtype(d) for d in DTYPES] == [torch.float32, torch.bfloat16, torch.float16]
    assert torch_dtype(torch.float64) is torch.float64
    with pytest.raises(InputError, match="unknown dtype 'half'; use one of float32, bfloat16, float16"):
        load_model("tiny-stories", dtype="half")
    with pytest.raises(InputError, match="not a floating-point type"):
        torch_dtype(torch.int8)
    live = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, n_positions=16, vocab_size=50257))
    with pytest.raises(ModelLoadError, match="keeps its own: convert it first"):
        load_model(live, tokenizer=GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir), dtype="float16")
    assert {p.dtype for p in live.parameters()} == {torch.float32}  # left as it was


def test_model_help_names_gguf_files_and_the_installed_real_models():
    from headsurgeon.surgery.configs import MODEL_HELP
    from headsurgeon.surgery.models.sources import INSTALLED_COPIES, INSTALLED_PARTS

    for name in MODEL_COMMANDS:
        model = next(a for a in subparser(name)._actions if a.dest == "model")
        assert model.help == MODEL_HELP, name
    for needed in (".gguf", "llama2c:PATH.bin", "tiny-stories", "HuggingFaceTB/SmolLM2-135M-Instruct",
                   "google/gemma-3-270m"):
        assert needed in MODEL_HELP
    named = {"HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"}
    assert named <= set(INSTALLED_COPIES) | set(INSTALLED_PARTS)  # the help names ids load_model resolves offline


@pytest.mark.e2e
def test_explain_runs_from_a_config_and_each_stage_gets_its_settings(tmp_path):
    import headsurgeon as hs
    from headsurgeon.pipeline import explain
    from headsurgeon.surgery.patterns.store import AttentionStore

    config = hs.ExplainConfig(corpus=hs.CorpusConfig(max_len=16, max_sequences=12),
                              capture=hs.CaptureConfig(mode="topq", q_frac=0.1, shard_size=5),
                              capture_only=True, progress=False)
    result = explain("tiny-stories", None, tmp_path, config=config)
    store = AttentionStore.load(tmp_path / "store")
    assert len(store) == len(result.splits.all) == 12 and store.mode == "topq"
    assert max(s.n for s in result.splits.all) <= 16
