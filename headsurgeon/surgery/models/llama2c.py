"""llama2.c checkpoints and tokenizers → transformers ``LlamaForCausalLM`` + fast tokenizer.

llama2.c rotates adjacent (even, odd) pairs; transformers rotates the two halves of each head.
The wq/wk rows are permuted as llama2.c's own HF export does, so logits match llama2.c's.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch
from ...core import HeadsurgeonError

HEADER = struct.Struct("<7i")


class Llama2cFormatError(HeadsurgeonError, ValueError):
    """A model file is missing, unreadable, truncated or of the wrong format."""


def read_header(path: Path) -> dict:
    """The header of a llama2.c checkpoint (sizes and counts), checked for sanity; the weights are not read."""
    if not path.is_file():
        raise Llama2cFormatError(f"llama2.c checkpoint not found: {path} (pass llama2c:/path/to/model.bin)")
    with path.open("rb") as f:
        raw = f.read(HEADER.size)
    if len(raw) < HEADER.size:
        raise Llama2cFormatError(f"{path} is too short to be a llama2.c checkpoint ({len(raw)} bytes)")
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = HEADER.unpack(raw)
    if not (0 < dim <= 65536 and 0 < hidden <= 1 << 20 and 0 < n_layers <= 1024 and 0 < n_heads <= dim
            and 0 < n_kv <= n_heads and n_heads % n_kv == 0 and dim % n_heads == 0 and 0 < seq_len <= 1 << 20
            and vocab != 0):
        raise Llama2cFormatError(
            f"{path} does not look like a llama2.c (legacy fp32) checkpoint: header "
            f"dim={dim} hidden={hidden} layers={n_layers} heads={n_heads} kv_heads={n_kv} vocab={vocab} seq={seq_len}"
        )
    return dict(dim=dim, hidden=hidden, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                vocab=abs(vocab), shared=vocab > 0, seq_len=seq_len)


def _permute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder q/k rows from llama2.c's interleaved pairs to transformers' rotate-half layout."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def load_llama2c(path: str | Path) -> "torch.nn.Module":
    """Read a llama2.c legacy fp32 ``.bin`` into an eager-attention ``LlamaForCausalLM``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    h = read_header(path)
    dim, hidden, L, nh, nkv, V, T = (h[k] for k in ("dim", "hidden", "n_layers", "n_heads", "n_kv_heads", "vocab", "seq_len"))
    hd = dim // nh
    kv_dim = nkv * hd
    shapes = [
        ("emb", (V, dim)), ("att_norm", (L, dim)), ("wq", (L, dim, dim)), ("wk", (L, kv_dim, dim)),
        ("wv", (L, kv_dim, dim)), ("wo", (L, dim, dim)), ("ffn_norm", (L, dim)), ("w1", (L, hidden, dim)),
        ("w2", (L, dim, hidden)), ("w3", (L, hidden, dim)), ("norm", (dim,)),
        ("freq_real", (T, hd // 2)), ("freq_imag", (T, hd // 2)),
    ]
    if not h["shared"]:
        shapes.append(("cls", (V, dim)))
    need = sum(int(np.prod(s)) for _, s in shapes)
    data = np.fromfile(path, dtype="<f4", offset=HEADER.size)
    if data.size < need:
        raise Llama2cFormatError(
            f"{path} is truncated: the header promises {need} float32 weights but the file holds {data.size}; "
            "re-download or re-export the checkpoint"
        )
    if not np.isfinite(data[:need]).all():
        raise Llama2cFormatError(f"{path} contains NaN/inf weights; the file is corrupted")
    w, pos = {}, 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        w[name] = data[pos: pos + size].reshape(shape)
        pos += size

    config = LlamaConfig(
        vocab_size=V, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=L,
        num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=T,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=h["shared"],
        bos_token_id=1, eos_token_id=2, pad_token_id=0, attn_implementation="eager",
    )
    model = LlamaForCausalLM(config)
    sd = {"model.embed_tokens.weight": w["emb"], "model.norm.weight": w["norm"]}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = w["att_norm"][i]
        sd[p + "post_attention_layernorm.weight"] = w["ffn_norm"][i]
        sd[p + "self_attn.q_proj.weight"] = _permute_rope(w["wq"][i], nh)
        sd[p + "self_attn.k_proj.weight"] = _permute_rope(w["wk"][i], nkv)
        sd[p + "self_attn.v_proj.weight"] = w["wv"][i]
        sd[p + "self_attn.o_proj.weight"] = w["wo"][i]
        sd[p + "mlp.gate_proj.weight"] = w["w1"][i]
        sd[p + "mlp.down_proj.weight"] = w["w2"][i]
        sd[p + "mlp.up_proj.weight"] = w["w3"][i]
    sd["lm_head.weight"] = w["emb"] if h["shared"] else w["cls"]
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    if missing or unexpected:
        raise Llama2cFormatError(f"llama2.c conversion mismatch: missing {missing}, unexpected {unexpected}")
    if h["shared"]:
        model.tie_weights()
    model.config._attn_implementation = "eager"
    return model.eval()


def read_pieces(path: str | Path) -> tuple[list[str], list[float]]:
    """Vocabulary pieces and scores from a sentencepiece ``.model`` or a llama2.c ``tokenizer.bin``."""
    path = Path(path)
    if not path.is_file():
        raise Llama2cFormatError(f"tokenizer file not found: {path}")
    if path.suffix == ".model":
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        try:
            sp.Load(str(path))
        except Exception as e:  # sentencepiece raises OSError/RuntimeError on junk
            raise Llama2cFormatError(f"{path} is not a readable sentencepiece model: {e}") from e
        n = sp.GetPieceSize()
        return [sp.IdToPiece(i) for i in range(n)], [float(sp.GetScore(i)) for i in range(n)]
    raw = path.read_bytes()
    if len(raw) < 4:
        raise Llama2cFormatError(f"{path} is too short to be a llama2.c tokenizer.bin")
    pieces, scores, pos = [], [], 4  # first int: max token length
    while pos < len(raw):
        if pos + 8 > len(raw):
            raise Llama2cFormatError(f"{path} is truncated at byte {pos}")
        score, length = struct.unpack_from("<fi", raw, pos)
        pos += 8
        if length < 0 or pos + length > len(raw):
            raise Llama2cFormatError(f"{path} is truncated or corrupted at byte {pos}")
        pieces.append(raw[pos: pos + length].decode("utf-8", errors="replace"))
        scores.append(score)
        pos += length
    # llama2.c writes spaces where sentencepiece writes ▁, and the 3 specials as <unk>, \n<s>\n, \n</s>\n
    fixed = []
    for i, p in enumerate(pieces):
        if i < 3:
            fixed.append(["<unk>", "<s>", "</s>"][i])
        else:
            fixed.append(p.replace(" ", "\u2581"))
    return fixed, scores


def build_tokenizer(pieces: list[str], scores: list[float]):
    """A transformers fast tokenizer reproducing a sentencepiece BPE model with byte fallback.

    Like sentencepiece (and unlike llama2.c's run.c, which keeps every space), runs of spaces collapse to
    one: a ``tokenizer.bin`` and its ``.model`` encode identically (tests/surgery/test_llama2c_tokenizer.py).
    """
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for merged, i in vocab.items():
        if i < 3 or len(merged) < 2 or (merged.startswith("<0x") and merged.endswith(">")):
            continue
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[i], vocab[left], vocab[right], left, right))
    merges.sort()
    bpe = BPE(vocab=vocab, merges=[(m[3], m[4]) for m in merges], unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    tok = Tokenizer(bpe)
    from tokenizers import Regex

    # sentencepiece's default normalization: collapse runs of spaces, strip the ends, then mark spaces
    tok.normalizer = normalizers.Sequence([
        normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=True, right=True),
        normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581"),
    ])
    tok.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>",
        add_bos_token=True, clean_up_tokenization_spaces=False,
    )


def load_llama2c_tokenizer(path: str | Path):
    """Load a sentencepiece ``.model`` or llama2.c ``tokenizer.bin`` as a transformers fast tokenizer."""
    return build_tokenizer(*read_pieces(path))
