"""Tiny hand-made GGUF files and a private conversion cache, for the GGUF tests (tests/surgery/test_gguf.py,
tests/surgery/test_hostile_gguf.py). ``cache`` and ``tiny`` are fixtures: a test module imports them by name."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from headsurgeon.surgery.models import gguf as hs_gguf


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: the 256 base tokens of a byte-level BPE vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0, layers: int = 2, d: int = 64, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 128) -> Path:
    """A random Llama-layout model with a byte-level BPE tokenizer; weights Q8_0 (dequantized on load)."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    merges = ["Ġ t", "Ġ a", "h e", "Ġt he", "i n", "Ġ s"]
    tokens = ["<|endoftext|>", *_byte_tokens(), *(m.replace(" ", "") for m in merges)]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(d // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    head = d // heads

    def tensor(name: str, shape: tuple[int, ...], norm: bool = False) -> None:
        data = (1.0 + 0.1 * rng.standard_normal(shape) if norm else 0.2 * rng.standard_normal(shape)).astype(np.float32)
        if norm:
            w.add_tensor(name, data)
        else:
            q = quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    tensor("token_embd.weight", (len(tokens), d))
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (d,), norm=True)
        tensor(f"blk.{i}.attn_q.weight", (heads * head, d))
        tensor(f"blk.{i}.attn_k.weight", (kv_heads * head, d))
        tensor(f"blk.{i}.attn_v.weight", (kv_heads * head, d))
        tensor(f"blk.{i}.attn_output.weight", (d, heads * head))
        tensor(f"blk.{i}.ffn_norm.weight", (d,), norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, d))
        tensor(f"blk.{i}.ffn_up.weight", (ffn, d))
        tensor(f"blk.{i}.ffn_down.weight", (d, ffn))
    tensor("output_norm.weight", (d,), norm=True)
    tensor("output.weight", (len(tokens), d))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A private user cache, so these tests never see (or fill) the real one."""
    root = tmp_path / "cache"
    monkeypatch.setenv(hs_gguf.CACHE_ENV, str(root))
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


IDS = torch.tensor([[0, 86, 9, 260, 100, 98, 117, 262, 98, 117, 14]])


def fake_parts(root: Path, chunks: list[bytes]) -> hs_gguf.GGUFParts:
    for i, chunk in enumerate(chunks):
        pkg = root / f"hs_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('parts are found, never imported')\n")
        (pkg / "data" / f"model.gguf.part{i:02d}").write_bytes(chunk)
    return hs_gguf.GGUFParts(packages=tuple(f"hs_fake_part{i}" for i in range(len(chunks))),
                             chunk_glob="data/model.gguf.part*", name="model.gguf",
                             sha256=hashlib.sha256(b"".join(chunks)).hexdigest())
