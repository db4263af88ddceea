"""Recipe for headsurgeon's embedded default model, one script read top to bottom (nanoGPT's data/*/prepare.py style).

    python recipes/tiny_stories/train.py      # ~25 min on 2 CPU cores; writes headsurgeon/hub/zoo_data/tiny-stories/
    python recipes/tiny_stories/sample.py     # then writes headsurgeon/hub/zoo_data/demo_corpus.txt from the trained model

It trains a byte-level BPE tokenizer and a tiny GPT-2 from scratch on ``../shared/data/corpora/tinystories-valid.txt``
(blank-line separated documents; the last ``heldout_frac`` of them are held out and their loss is reported in
``training.json``). ``<|endoftext|>`` is the tokenizer's BOS, EOS, pad and document separator (GPT-2 convention:
the tokenizer does not add it by itself). The defaults of :class:`TrainConfig` and seed 0 produce the shipped
files; the installed library only locates and loads them (headsurgeon/hub/zoo.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence as TypingSequence

import numpy as np

from headsurgeon.hub.zoo import DEFAULT_NAME, ZOO_DATA
from headsurgeon.core.fileio import json_bytes, split_documents

EOT = "<|endoftext|>"
RECIPE = "python recipes/tiny_stories/train.py"
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "corpora" / "tinystories-valid.txt"


# --------------------------------------------------------------------------------------------- data


def heldout_split(docs: list[str], heldout_frac: float) -> tuple[list[str], list[str]]:
    """Split documents into (train, held-out): the last ``heldout_frac`` of them are held out (at least one)."""
    if not 0.0 < heldout_frac < 1.0:
        raise ValueError(f"heldout_frac must be in (0, 1), got {heldout_frac}")
    if len(docs) < 2:
        raise ValueError(f"need at least 2 documents to hold some out, got {len(docs)}")
    n_held = min(len(docs) - 1, max(1, round(len(docs) * heldout_frac)))
    return docs[: len(docs) - n_held], docs[len(docs) - n_held :]


def train_tokenizer(docs: TypingSequence[str], vocab_size: int, model_max_length: int) -> Any:
    """Train a byte-level BPE (GPT-2 style, ``<|endoftext|>`` special) and wrap it as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(docs), trainer=trainer)
    if tok.token_to_id(EOT) != 0:
        raise RuntimeError(f"expected {EOT} to get id 0, got {tok.token_to_id(EOT)}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        pad_token=EOT,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def encode_stream(tokenizer: Any, docs: TypingSequence[str]) -> np.ndarray:
    """Encode documents into one int64 stream ``EOT d0 EOT d1 ... EOT`` (EOT both opens and closes each)."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    enc = tokenizer(list(docs), add_special_tokens=False)["input_ids"]
    out: list[int] = []
    for ids in enc:
        out.append(eot)
        out.extend(ids)
    out.append(eot)
    return np.asarray(out, dtype=np.int64)


# --------------------------------------------------------------------------------------------- training


@dataclasses.dataclass
class TrainConfig:
    """Hyper-parameters of the recipe; the defaults produce the shipped ``tiny-stories`` model."""

    seed: int = 0
    minutes: float = 24.0  # wall-clock budget of the optimisation loop (time-based stopping rule)
    max_steps: int = 0  # >0: a fixed step budget instead (deterministic schedule), still capped by ``minutes``
    threads: int = 2
    vocab_size: int = 2048
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_inner: int = 512
    n_positions: int = 256
    seq_len: int = 256
    batch_size: int = 8  # 8 x 256 tokens: more updates per CPU-second than larger batches at this scale
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.1  # ~190k training tokens seen many times: regularise against memorising
    bf16: str = "auto"  # bf16 autocast for matmuls: "auto" (where the CPU has native bf16), "on", "off"
    heldout_frac: float = 0.1
    max_docs: int = 0  # >0: use only the first N documents (smoke runs)
    eval_tokens: int = 0  # >0: evaluate at most this many tokens per split (smoke runs); 0 = whole held-out set
    log_every: int = 50
    eval_every: int = 250  # held-out loss curve for training.json (monitoring only); 0 = off


def build_model(cfg: TrainConfig, vocab_size: int, eot_id: int) -> Any:
    """Build a fresh GPT-2 LM (eager attention, tied embeddings) from the recipe's hyper-parameters."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.n_inner,
        activation_function="gelu_new",
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config)
    model.config._attn_implementation = "eager"
    model.config.attn_implementation = "eager"
    return model


def lr_at(progress: float, step: int, cfg: TrainConfig) -> float:
    """Learning rate: linear warm-up over ``warmup_steps``, then cosine from ``lr`` to ``min_lr_frac*lr`` by progress."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup_steps))
    p = min(1.0, max(0.0, progress))
    cos = cfg.min_lr_frac + (1.0 - cfg.min_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * p))
    return cfg.lr * warm * cos


def stream_loss(model: Any, stream: np.ndarray, seq_len: int, max_tokens: int = 0, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) over consecutive non-overlapping windows of a token stream."""
    import torch

    n_win = max(1, (len(stream) - 1) // seq_len)
    if max_tokens > 0:
        n_win = max(1, min(n_win, max_tokens // seq_len))
    starts = [i * seq_len for i in range(n_win)]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for b in range(0, len(starts), batch_size):
            chunk = [stream[s : s + seq_len + 1] for s in starts[b : b + batch_size]]
            width = min(len(c) for c in chunk)
            x = torch.from_numpy(np.stack([c[:width] for c in chunk]))
            logits = model(input_ids=x[:, :-1], attention_mask=torch.ones_like(x[:, :-1])).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(loss)
            count += x[:, 1:].numel()
    model.train(was_training)
    return total / count


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def train(cfg: TrainConfig, data_path: Path | None = None, out_dir: Path | None = None, progress: bool = True) -> dict:
    """Run the recipe: tokenizer, model, time-budgeted AdamW training, evaluation; save into ``out_dir`` atomically."""
    import torch
    from tqdm import tqdm

    data_path = Path(data_path) if data_path else DEFAULT_DATA
    out_dir = Path(out_dir) if out_dir else ZOO_DATA / DEFAULT_NAME
    if not data_path.is_file():
        raise FileNotFoundError(
            f"training text not found at {data_path}; pass --data PATH to a blank-line separated text file "
            "(the recipe uses ../shared/data/corpora/tinystories-valid.txt beside the checkout)"
        )
    if cfg.seq_len > cfg.n_positions:
        raise ValueError(f"seq_len {cfg.seq_len} exceeds n_positions {cfg.n_positions}")
    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    t_start = time.time()
    load0 = _loadavg()

    docs = split_documents(data_path.read_text(encoding="utf-8"))
    if cfg.max_docs > 0:
        docs = docs[: cfg.max_docs]
    train_docs, held_docs = heldout_split(docs, cfg.heldout_frac)
    tokenizer = train_tokenizer(train_docs, cfg.vocab_size, cfg.n_positions)
    eot = tokenizer.convert_tokens_to_ids(EOT)
    train_ids = encode_stream(tokenizer, train_docs)
    held_ids = encode_stream(tokenizer, held_docs)
    if len(train_ids) < cfg.seq_len + 2:
        raise ValueError(f"training stream has {len(train_ids)} tokens, fewer than seq_len+2={cfg.seq_len + 2}")

    model = build_model(cfg, len(tokenizer), eot)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    gen = np.random.default_rng(cfg.seed)
    use_bf16 = _use_bf16(cfg.bf16)
    budget_s = cfg.minutes * 60.0
    t_loop = time.time()
    step, running, tokens_seen = 0, float("nan"), 0
    curve: list[tuple[int, float, float]] = []  # (step, seconds, held-out loss) every eval_every steps
    bar = tqdm(total=cfg.max_steps if cfg.max_steps > 0 else None, disable=not progress, unit="step",
               desc=f"train ({cfg.minutes:g} min budget)", file=sys.stderr, mininterval=2.0)
    while True:
        elapsed = time.time() - t_loop
        if cfg.max_steps > 0:
            if step >= cfg.max_steps or elapsed >= budget_s:
                break
            prog = step / cfg.max_steps
        else:
            if elapsed >= budget_s:
                break
            prog = elapsed / budget_s
        lr = lr_at(prog, step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = gen.integers(0, len(train_ids) - cfg.seq_len - 1, size=cfg.batch_size)
        x = torch.from_numpy(np.stack([train_ids[s : s + cfg.seq_len + 1] for s in starts]))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(input_ids=x[:, :-1], attention_mask=torch.ones_like(x[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        lv = loss.detach().item()
        running = lv if step == 0 else 0.98 * running + 0.02 * lv
        step += 1
        tokens_seen += x[:, 1:].numel()
        bar.update(1)
        if step % cfg.log_every == 0:
            bar.set_postfix(loss=f"{running:.3f}", lr=f"{lr:.2e}", held=f"{curve[-1][2]:.3f}" if curve else "-")
        if cfg.eval_every > 0 and step % cfg.eval_every == 0:
            # Monitoring only (the final model is the last step's; nothing is selected on held-out data).
            curve.append((step, round(time.time() - t_loop, 1), round(stream_loss(model, held_ids, cfg.seq_len,
                                                                                  cfg.eval_tokens), 4)))
            model.train()
    bar.close()
    train_s = time.time() - t_loop

    model.eval()
    held_loss = stream_loss(model, held_ids, cfg.seq_len, cfg.eval_tokens)
    n_eval = cfg.eval_tokens if cfg.eval_tokens > 0 else len(held_ids)
    train_loss = stream_loss(model, train_ids, cfg.seq_len, n_eval)  # same token budget as the held-out eval

    record = {
        "name": DEFAULT_NAME if out_dir.name == DEFAULT_NAME else out_dir.name,
        "recipe": f"{RECIPE} --seed {cfg.seed} --minutes {cfg.minutes:g}",
        "config": dataclasses.asdict(cfg),
        "seed": cfg.seed,
        "data": {
            "file": data_path.name,
            "bytes": data_path.stat().st_size,
            "documents": len(docs),
            "train_documents": len(train_docs),
            "heldout_documents": len(held_docs),
            "heldout_rule": f"last {cfg.heldout_frac:g} of blank-line separated documents",
            "train_tokens": int(len(train_ids)),
            "heldout_tokens": int(len(held_ids)),
        },
        "tokenizer": {"type": "byte-level BPE (tokenizers)", "vocab_size": len(tokenizer), "special": EOT,
                      "bos_eos_pad_id": int(eot)},
        "model": {"architecture": "GPT2LMHeadModel", "parameters": int(n_params), "dtype": "float32",
                  "attn_implementation": "eager"},
        "steps": step,
        "tokens_seen": int(tokens_seen),
        "epochs": round(tokens_seen / max(1, len(train_ids)), 3),
        "schedule": "fixed steps" if cfg.max_steps > 0 else "time-based (cosine over elapsed/budget)",
        "heldout_curve": [{"step": a, "seconds": b, "heldout_loss": c} for a, b, c in curve],
        "train_loss_running": round(running, 4),
        "train_loss": round(train_loss, 4),
        "heldout_loss": round(held_loss, 4),
        "heldout_ppl": round(math.exp(held_loss), 3),
        "uniform_loss": round(math.log(len(tokenizer)), 4),
        "loss_unit": "nats/token, mean over non-overlapping seq_len windows of the EOT-joined document stream",
        "train_wall_s": round(train_s, 1),
        "total_wall_s": None,
        "torch_threads": cfg.threads,
        "bf16_autocast": use_bf16,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg_start_end": [round(load0, 2), round(_loadavg(), 2)],  # CPU shared with other jobs?
        "versions": _versions(),
        "platform": platform.platform(),
    }
    _save_atomic(model, tokenizer, out_dir, record, t_start)
    return json.loads((out_dir / "training.json").read_text())


def _use_bf16(mode: str) -> bool:
    """Resolve the ``bf16`` setting: "auto" uses bf16 autocast only where oneDNN has native bf16 kernels."""
    import torch

    if mode not in ("auto", "on", "off"):
        raise ValueError(f"bf16 must be 'auto', 'on' or 'off', got {mode!r}")
    if mode != "auto":
        return mode == "on"
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def _versions() -> dict:
    import tokenizers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "python": platform.python_version()}


def write_model_card(path: Path, record: dict | None = None) -> Path:
    """Write README.md (a short model card: recipe, data, figures, provenance) from training.json's record."""
    path = Path(path)
    rec = record if record is not None else json.loads((path / "training.json").read_text(encoding="utf-8"))
    c, d = rec["config"], rec["data"]
    card = f"""# {rec['name']} — the headsurgeon embedded default model

A {c['n_layer']}-layer, {c['n_head']}-head, d_model {c['n_embd']} GPT-2 (`GPT2LMHeadModel`, eager attention,
{rec['model']['parameters']:,} parameters, float32) with its own byte-level BPE tokenizer ({rec['tokenizer']['vocab_size']}
tokens, `{EOT}` = BOS/EOS/pad = id {rec['tokenizer']['bos_eos_pad_id']}; the tokenizer does not add it by itself).
Trained by the project's recipe, from scratch, on {d['train_documents']} documents of TinyStories text
(`{d['file']}`, the start of the TinyStories validation split); the last {d['heldout_documents']} documents are held out.

| figure | value |
|---|---|
| steps / tokens seen / epochs | {rec['steps']} / {rec['tokens_seen']:,} / {rec['epochs']} |
| train loss (nats/token) | {rec['train_loss']} |
| held-out loss (nats/token) | {rec['heldout_loss']} (perplexity {rec['heldout_ppl']}; uniform {rec['uniform_loss']}) |
| training wall time | {rec['train_wall_s']} s on {rec['torch_threads']} CPU threads |

Reproduce: `{rec['recipe']}` (seed {rec['seed']}; the time-based schedule makes the step count depend on the machine).
Load: `GPT2LMHeadModel.from_pretrained(dir)`, `AutoTokenizer.from_pretrained(dir)` or
`headsurgeon.hub.zoo.load("{rec['name']}")`.

Training data: TinyStories (Eldan & Li 2023), CDLA-Sharing-1.0; the weights are a computational result of that data.
"""
    (path / "README.md").write_text(card, encoding="utf-8")
    return path / "README.md"


def _portable_tokenizer_config(path: Path) -> None:
    """Name the generic fast-tokenizer class so that AutoTokenizer loads the files with transformers 4 and 5."""
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def _make_readable(path: Path) -> None:
    """mkdtemp and safetensors create owner-only modes; shipped package data must be world-readable."""
    path.chmod(0o755)
    for p in path.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _record_bytes(record: dict) -> bytes:
    """training.json's bytes: the record in its own key order, indented, non-finite floats as null."""
    return json_bytes(record, indent=2, sort_keys=False) + b"\n"


def _save_atomic(model: Any, tokenizer: Any, out_dir: Path, record: dict, t_start: float) -> None:
    """Write model + tokenizer + training.json + README.md into a temp dir beside ``out_dir`` and swap it in.

    A directory has no atomic replace, so the old one is renamed aside, the new one renamed in, the old removed;
    single files elsewhere in the library are written with headsurgeon.core.fileio.
    """
    import torch

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model = model.to(torch.float32)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _portable_tokenizer_config(tmp)
        record["total_wall_s"] = round(time.time() - t_start, 1)
        record["size_bytes"] = _dir_size(tmp) + 4096  # + training.json, roughly
        (tmp / "training.json").write_bytes(_record_bytes(record))
        write_model_card(tmp, record)
        _make_readable(tmp)
        record["size_bytes"] = _dir_size(tmp)
        (tmp / "training.json").write_bytes(_record_bytes(record))
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            out_dir.rename(old)
        tmp.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    t = argparse.ArgumentParser(prog=RECIPE, description="Train the tiny GPT-2 + BPE tokenizer on TinyStories text; "
                                "writes model, tokenizer, training.json and README.md.")
    t.add_argument("--out", type=Path, default=None, help=f"output directory (default: {ZOO_DATA / DEFAULT_NAME})")
    t.add_argument("--data", type=Path, default=None, help="blank-line separated training text "
                   "(default: ../shared/data/corpora/tinystories-valid.txt beside the checkout)")
    t.add_argument("--minutes", type=float, default=d.minutes, help="wall-clock training budget (time-based stop)")
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--steps", type=int, default=d.max_steps, dest="max_steps",
                   help="fixed number of steps (deterministic schedule) instead of the time-based one")
    t.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads")
    for f in ("vocab_size", "n_layer", "n_head", "n_embd", "n_inner", "n_positions", "seq_len", "batch_size",
              "warmup_steps", "max_docs", "eval_tokens", "eval_every"):
        t.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(d, f), dest=f)
    for f in ("lr", "dropout", "weight_decay", "heldout_frac"):
        t.add_argument("--" + f.replace("_", "-"), type=float, default=getattr(d, f), dest=f)
    t.add_argument("--bf16", choices=("auto", "on", "off"), default=d.bf16,
                   help="bf16 autocast (weights stay float32; ~1.5x fewer CPU-seconds per step on AVX512-BF16)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    return t


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: train and save, then print a one-line summary."""
    args = _parser().parse_args(argv)
    if "torch" not in sys.modules:
        # On a CPU shared with other jobs, OpenMP threads that spin at barriers made steps ~4x slower than
        # sleeping ones (measured on 2 cores at load ~10); must be set before torch loads its OpenMP runtime.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in fields})
    rec = train(cfg, args.data, args.out, progress=not args.quiet)
    out = args.out or ZOO_DATA / DEFAULT_NAME
    print(f"saved {out} ({rec['size_bytes'] / 1e6:.2f} MB): {rec['steps']} steps, {rec['epochs']} epochs, "
          f"train loss {rec['train_loss']:.3f}, held-out loss {rec['heldout_loss']:.3f} nats/token "
          f"(uniform {rec['uniform_loss']:.3f}), {rec['total_wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
