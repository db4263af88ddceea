"""A model source plugs into load_model through the registry, as docs/architecture.md's recipe says."""
from __future__ import annotations

import pytest

from headsurgeon.surgery.models.loading import ModelLoadError, load_model
from headsurgeon.surgery.models.sources import ModelSource, model_sources, register_model_source, unregister_model_source


def test_builtin_sources_are_registered_in_order():
    names = [s.name for s in model_sources()]
    assert names.index("llama2c") < names.index("zoo") < names.index("huggingface") < names.index("bridge")
    assert names.index("gguf") < names.index("huggingface")  # a .gguf path is a file, never a hub id


def test_a_new_source_claims_its_prefix(gpt2_tokenizer_dir):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    def load_toy(spec, tokenizer, device, dtype, revision):
        layers = int(str(spec).split(":", 1)[1])
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=2, n_embd=16, n_positions=64,
                                           vocab_size=50257))
        return load_model(model, tokenizer=GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir))

    register_model_source(ModelSource("toy", lambda s: isinstance(s, str) and s.startswith("toy:"), load_toy))
    try:
        handle = load_model("toy:3")
        assert handle.n_layers == 3 and handle.n_heads == 2
        assert model_sources()[0].name == "toy"
    finally:
        unregister_model_source("toy")
    assert "toy" not in [s.name for s in model_sources()]


def test_unknown_objects_get_a_clear_error():
    with pytest.raises(ModelLoadError, match="cannot load a model from int"):
        load_model(42)
