"""load_model on local HF directories, llama2.c checkpoints and live objects, and its error messages."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import STORIES, need
from headsurgeon.surgery.models.loading import ModelLoadError, load_model


@pytest.mark.parametrize("kind,heads,kv,causal", [("gpt2", 4, 4, True), ("llama", 4, 2, True), ("bert", 4, 4, False)])
def test_local_hf_directories(random_models, random_model_dirs, kind, heads, kv, causal):
    h = random_models[kind]
    assert (h.n_layers, h.n_heads, h.n_kv_heads, h.d_head, h.causal) == (2, heads, kv, 8, causal)
    assert h.pattern_hooks == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert h.source.kind == "hf" and h.source.name_or_path == str(random_model_dirs[kind].resolve())
    ids = torch.tensor([h.tokenizer("Hello there, world")["input_ids"]])
    seen = {}
    h.model.run_with_hooks(ids, fwd_hooks=[("blocks.1.attn.hook_pattern",
                                            lambda p, hook: seen.setdefault("p", p.detach()))])
    assert seen["p"].shape == (1, heads, ids.shape[1], ids.shape[1])


def test_bridge_matches_hugging_face(random_models, random_model_dirs):
    from transformers import AutoModelForCausalLM

    for kind in ("gpt2", "llama"):
        hf = AutoModelForCausalLM.from_pretrained(random_model_dirs[kind], attn_implementation="eager").eval()
        ids = torch.tensor([[5, 17, 300, 9, 2000]])
        with torch.no_grad():
            assert torch.allclose(hf(ids).logits, random_models[kind].forward(ids), atol=1e-5)


@pytest.mark.parametrize("tok_file", ["tok512.model", "tok512.bin"])
def test_llama2c_greedy_decoding(tok_file):
    need(STORIES / "stories260K.bin")
    h = load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=STORIES / tok_file)
    assert (h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size, h.n_ctx, h.bos_id) == (5, 8, 4, 512, 512, 1)
    ids = torch.tensor([[h.bos_id]])
    with torch.no_grad():
        for _ in range(34):
            ids = torch.cat([ids, h.forward(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    text = h.tokenizer.decode(ids[0], skip_special_tokens=True)
    assert text.startswith("Once upon a time, there was a little girl named Lily. She loved to play outside "
                           "in the park."), text


def test_llama2c_tokenizers_agree_with_sentencepiece(documents):
    import sentencepiece as spm

    need(STORIES / "tok512.model")
    sp = spm.SentencePieceProcessor(model_file=str(STORIES / "tok512.model"))
    text = "\n\n".join(documents[:40])
    want = sp.encode(text)
    for f in ("tok512.model", "tok512.bin"):
        h_tok = load_model.__globals__["load_llama2c_tokenizer"](STORIES / f)
        assert h_tok(text, add_special_tokens=False)["input_ids"] == want


def test_llama2c_cross_entropy_on_tinystories(stories, documents):
    ids = stories.tokenizer("\n\n".join(documents[:600]), add_special_tokens=False)["input_ids"]
    windows = [[stories.bos_id] + ids[i * 511:(i + 1) * 511] for i in range(50)]
    assert all(len(w) == 512 for w in windows)
    x = torch.tensor(windows)
    with torch.no_grad():
        logits = torch.cat([stories.forward(x[i:i + 10]) for i in range(0, 50, 10)])
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 512), x[:, 1:].reshape(-1)).item()
    assert 1.2 <= ce <= 1.5, ce


def test_live_objects(random_model_dirs, stories):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(random_model_dirs["gpt2"])  # default sdpa attention
    tok = AutoTokenizer.from_pretrained(random_model_dirs["gpt2"])
    h = load_model(hf, tokenizer=tok)
    assert h.n_heads == 4 and h.source.kind == "object"
    again = load_model(stories.model, tokenizer=stories.tokenizer)  # a TransformerBridge
    assert again.model is stories.model and again.n_kv_heads == 4
    with pytest.raises(ModelLoadError, match="without its tokenizer"):
        load_model(hf)


def test_errors_unknown_paths_and_names(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope" / "model"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(f"llama2c:{tmp_path / 'missing.bin'}", tokenizer=tmp_path / "tok.model")
    with pytest.raises(ModelLoadError, match="cannot load a model from int"):
        load_model(42)


def test_errors_truncated_and_garbage_checkpoints(tmp_path):
    need(STORIES / "stories260K.bin")
    raw = (STORIES / "stories260K.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(f"llama2c:{tmp_path / 'cut.bin'}", tokenizer=STORIES / "tok512.model")
    (tmp_path / "junk.bin").write_bytes(b"\xff" * 4096)
    with pytest.raises(ModelLoadError, match="does not look like a llama2.c"):
        load_model(f"llama2c:{tmp_path / 'junk.bin'}", tokenizer=STORIES / "tok512.model")
    (tmp_path / "junk.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ModelLoadError, match="sentencepiece"):
        load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=tmp_path / "junk.model")


def test_error_tokenizer_vocabulary_mismatch(gpt2_tokenizer_dir):
    need(STORIES / "stories260K.bin")
    with pytest.raises(ModelLoadError, match="tokenizer/model mismatch: the tokenizer has 50257 tokens"):
        load_model(f"llama2c:{STORIES / 'stories260K.bin'}", tokenizer=str(gpt2_tokenizer_dir))


def test_error_model_without_attention_patterns(gpt2_tokenizer_dir):
    from transformers import GPT2TokenizerFast, MambaConfig, MambaForCausalLM

    tok = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir)
    mamba = MambaForCausalLM(MambaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, state_size=4))
    with pytest.raises(ModelLoadError, match="expose no hook_pattern"):
        load_model(mamba, tokenizer=tok)


def test_probe_rejects_a_bridge_whose_pattern_hook_never_fires(random_models, monkeypatch):
    """A bridge whose attention bypasses hook_pattern (e.g. fused kernels) must be refused, not silently used."""
    from headsurgeon.surgery.models import loading

    h = random_models["gpt2"]
    monkeypatch.setattr(h.model, "run_with_hooks", lambda *a, **k: h.model(a[0]))  # hooks never run
    with pytest.raises(ModelLoadError, match="does not expose patterns"):
        loading._probe_patterns(h.model, "gpt2", h.vocab_size)


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_an_unreachable_hub_id_fails_at_once_saying_what_was_tried_and_the_fix(monkeypatch, env):
    """Offline (or with the endpoint down) a hub id fails before transformers, which retries for most of a minute."""
    import huggingface_hub.constants
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY",
                "http_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)

    def reached(*args, **kwargs):
        raise AssertionError("went on to transformers' download path")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", reached)
    monkeypatch.setattr(TransformerBridge, "boot_transformers", reached)
    with pytest.raises(ModelLoadError) as error:
        load_model("headsurgeon-tests/no-such-model")
    message = str(error.value)
    assert "\n" not in message and "'headsurgeon-tests/no-such-model'" in message
    assert "Hugging Face cache" in message and "installed copies" in message  # what was tried
    assert "local folder" in message and ".gguf file" in message and "HF_HUB_OFFLINE=0" in message  # the fix
    assert ("offline (HF_HUB_OFFLINE is set)" if "HF_HUB_OFFLINE" in env else "http://127.0.0.1:9 is unreachable") \
        in message
