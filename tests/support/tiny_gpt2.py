"""A tiny random GPT-2 with its own byte-level BPE, saved to a folder, for the checkpoint tests
(tests/hub/test_checkpoint.py, tests/hub/test_hub_remote.py)."""
from __future__ import annotations

from pathlib import Path

import torch

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog."


def make_tiny_gpt2(out: Path) -> Path:
    """A random 2-layer GPT-2 with a 300-token byte-level BPE, saved with save_pretrained (loads in ~0.3 s)."""
    import warnings

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([STORY, "The cat sat on the mat and looked at the dog."] * 4,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                             unk_token="<|endoftext|>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=128, vocab_size=len(fast),
                                       bos_token_id=0, eos_token_id=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(out)
        fast.save_pretrained(out)
    return out
