"""What a newcomer touches first: a callable model handle, short reprs, batches, and paths that fail fast."""
from __future__ import annotations

import pytest
import torch

import headsurgeon as hs
from headsurgeon.surgery.models.loading import ModelLoadError, load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-stories")


def test_handle_is_callable_like_the_hybrid(tiny):
    ids = torch.tensor([tiny.tokenizer.encode("Once upon a time there was a cat.")])
    assert torch.equal(tiny(ids), tiny.forward(ids))


def test_reprs_are_short(tiny, tmp_path):
    text = repr(tiny)
    assert text.count("\n") == 0 and len(text) < 200 and "4 layers x 4 heads" in text
    seqs = hs.make_sequences(tiny, ["Once upon a time.", "The cat sat."], max_len=16)
    store = hs.capture(tiny, seqs, progress=False)
    assert repr(store).count("\n") == 0 and "2 sequences x 4 layers x 4 heads" in repr(store)


def test_batches_cover_every_sequence_once(tiny):
    seqs = hs.make_sequences(tiny, [f"Story number {i} is short." for i in range(7)], max_len=16)
    got = list(hs.batches(seqs, batch_size=3, shuffle=True, seed=1))
    assert [ids.shape[0] for ids, _ in got] == [3, 3, 1]
    rows = sorted(tuple(ids[b, : int(mask[b].sum())].tolist()) for ids, mask in got for b in range(ids.shape[0]))
    assert rows == sorted(tuple(s.ids.tolist()) for s in seqs)
    with pytest.raises(ValueError, match="batch_size"):
        next(hs.batches(seqs, batch_size=0))


@pytest.mark.parametrize("spec", ["stories260K.bin", "./missing-model", "runs/a/b", "weights.safetensors"])
def test_missing_local_paths_fail_fast_without_the_hub(spec, monkeypatch):
    import huggingface_hub

    def no_network(*_a, **_k):
        raise AssertionError("a local path must never reach the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    with pytest.raises(ModelLoadError, match="file not found"):
        load_model(spec)


def test_hybrid_and_program_set_reprs_are_short(tiny):
    programs = {f"L{layer}H{head}": "prev(1)" for layer in range(4) for head in range(4)}
    hybrid = hs.replace_heads(tiny, programs)
    lines = repr(hybrid).splitlines()
    assert lines[0].startswith("HybridModel(tiny-stories: 16 of 16 heads replaced") and len(lines) <= 10
    assert "... and 8 more" in lines[-1]
    ps = hs.ProgramSet()
    ps.add((0, 1), hs.Program.parse("prev(1)"), source="hand")
    assert repr(ps) == "ProgramSet(1 heads of a model, 0 with a readable explanation)"


def test_card_shows_the_scores_of_the_program_set_the_hybrid_came_from(tiny, tmp_path):
    ps = hs.ProgramSet(model="tiny-stories")
    ps.add((0, 1), hs.Program.parse("prev(1)"), source="hand", scores={"test": {"iou": 0.4242, "jsd": 0.3131}})
    hybrid = hs.replace_heads(tiny, ps)
    path = hs.save_hybrid(hybrid, tmp_path / "ck")
    card = (path / "README.md").read_text()
    row = next(line for line in card.splitlines() if line.startswith("| L0H1"))
    assert "0.424" in row and "0.313" in row and "hand" in row
    assert (path / "manifest.json").stat().st_mode & 0o077 != 0  # normal permissions, not mkstemp's 0600
