"""Recipe step 2: sample the shipped demo corpus (headsurgeon/hub/zoo_data/demo_corpus.txt) from the trained tiny-stories model.

    python recipes/tiny_stories/sample.py      # after train.py; 200 stories, seed 0, temperature 0.8

Each story is sampled from the BOS token until ``<|endoftext|>``; unfinished ones are cut at their last sentence
end and short or garbled ones dropped, so the demo runs on text the model itself finds natural.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Sequence as TypingSequence

from headsurgeon.hub.zoo import DEMO_CORPUS_NAME, ZOO_DATA, default_model_dir
from headsurgeon.core.fileio import atomic_write_bytes

RECIPE = "python recipes/tiny_stories/sample.py"
# U+FFFD (bytes that do not decode) and the UTF-8-read-as-cp1252 mojibake that the source text contains
_MOJIBAKE = re.compile("\ufffd|\u00e2\u20ac|\u00c3|\u00c2")


def _finish_story(text: str, ended: bool) -> str:
    """Tidy one sampled story: one line, whitespace collapsed; cut an unfinished one at its last sentence end."""
    text = re.sub(r"\s+", " ", text).strip()
    if not ended:
        cut = max(text.rfind(c) for c in ".!?")
        if cut > 0:
            cut += 1
            if cut < len(text) and text[cut] == '"':
                cut += 1
            text = text[:cut]
    return text.strip()


def sample_stories(
    n: int = 200,
    *,
    model_path: Path | None = None,
    temperature: float = 0.8,
    seed: int = 0,
    max_new_tokens: int = 200,
    batch_size: int = 25,
    min_chars: int = 40,
    threads: int | None = None,
    progress: bool = True,
) -> list[str]:
    """Sample ``n`` stories from a zoo model, each from the BOS token until EOT, with a fixed seed.

    Unfinished stories (no EOT within ``max_new_tokens``) are cut at their last sentence end; stories shorter
    than ``min_chars``, with undecodable bytes or with mojibake (learned from the source text) are dropped.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer, GPT2LMHeadModel

    path = Path(model_path) if model_path else default_model_dir()
    if threads:
        torch.set_num_threads(threads)
    model = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    eot = tok.eos_token_id  # <|endoftext|>: BOS, EOS and pad of the recipe's tokenizer
    max_new = min(max_new_tokens, model.config.n_positions - 1)
    torch.manual_seed(seed)
    stories: list[str] = []
    bar = tqdm(total=n, disable=not progress, desc="sample", file=sys.stderr)
    attempts = 0
    while len(stories) < n and attempts < 4 * n:
        x = torch.full((batch_size, 1), eot, dtype=torch.long)
        with torch.no_grad():
            out = model.generate(
                x, attention_mask=torch.ones_like(x), do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                max_new_tokens=max_new, eos_token_id=eot, pad_token_id=eot,
            )
        for row in out[:, 1:].tolist():
            attempts += 1
            ended = eot in row
            ids = row[: row.index(eot)] if ended else row
            story = _finish_story(tok.decode(ids, skip_special_tokens=True), ended)
            if len(story) >= min_chars and not _MOJIBAKE.search(story) and len(stories) < n:
                stories.append(story)
                bar.update(1)
    bar.close()
    return stories


def write_demo_corpus(stories: TypingSequence[str], path: Path | None = None) -> Path:
    """Write stories separated by blank lines (atomically, world-readable as package data) and return the path."""
    path = Path(path) if path else ZOO_DATA / DEMO_CORPUS_NAME
    atomic_write_bytes(path, ("\n\n".join(s.strip() for s in stories) + "\n").encode("utf-8"))
    path.chmod(0o644)  # the temporary file behind the atomic write is owner-only
    return path


def _parser() -> argparse.ArgumentParser:
    s = argparse.ArgumentParser(prog=RECIPE, description="Sample stories from BOS into a blank-line separated "
                                "demo corpus.")
    s.add_argument("--model-dir", type=Path, default=None, help="model directory (default: the shipped one)")
    s.add_argument("--out", type=Path, default=None, help=f"output file (default: {ZOO_DATA / DEMO_CORPUS_NAME})")
    s.add_argument("--n", type=int, default=200, help="number of stories")
    s.add_argument("--temperature", type=float, default=0.8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-new-tokens", type=int, default=200)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--quiet", action="store_true")
    return s


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: sample and write the demo corpus."""
    args = _parser().parse_args(argv)
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py's main
    stories = sample_stories(args.n, model_path=args.model_dir, temperature=args.temperature, seed=args.seed,
                             max_new_tokens=args.max_new_tokens, threads=args.threads, progress=not args.quiet)
    path = write_demo_corpus(stories, args.out)
    print(f"wrote {len(stories)} stories to {path} ({path.stat().st_size / 1e3:.1f} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
