"""The versioned formats share one reader/writer (headsurgeon/core/formats.py), the model source is a typed record
(headsurgeon/surgery/models/source_record.py), and AttentionStore and HeadStore read stores through one reader (headsurgeon/surgery/patterns/store_reader.py).
"""
from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

from headsurgeon.core.formats import FutureFormatError, check_versioned, write_versioned
from headsurgeon.synth.sequence import Sequence


def _future(path, key="version", version=None):
    """Rewrite the JSON file at ``path`` with its version one past what this headsurgeon reads; returns it."""
    obj = json.loads(path.read_text())
    obj[key] = version if version is not None else obj[key] + 1
    path.write_text(json.dumps(obj))
    return obj[key]


def _clear(err, path, version):
    """The one message a future version gets: the file, its version and the fix."""
    text = str(err.value)
    assert isinstance(err.value, FutureFormatError), type(err.value).__mro__
    assert str(path) in text and f"format version {version}" in text and "upgrade headsurgeon" in text, text


# ------------------------------------------------------------------------------------------- the store
def _store(directory, mode="dense"):
    """A two-shard store on disk written through AttentionStore's own writer (no model needed)."""
    from headsurgeon.surgery.patterns.store import AttentionStore

    rng = np.random.default_rng(0)
    seqs = [Sequence(ids=np.arange(n), tokens=[f"t{i}" for i in range(n)], text=" ".join(f"t{i}" for i in range(n)),
                     offsets=np.array([[i, i + 1] for i in range(n)]), doc=k) for k, n in enumerate((3, 4, 5))]
    store = AttentionStore(seqs, 2, 3, mode=mode, q_frac=0.3, causal=True, model_name="toy", directory=directory,
                           shard_size=2)
    store.save_sequences()
    for shard in range(store.n_shards):
        entries = {}
        for i in range(shard * 2, min(shard * 2 + 2, len(seqs))):
            p = rng.random((2, 3, seqs[i].n, seqs[i].n)).astype(np.float32)
            entries.update(store.put(i, p / p.sum(-1, keepdims=True)))
        store.write_shard(shard, entries)
    store.save_manifest(range(store.n_shards))
    return store


def test_a_future_store_manifest_is_refused_by_both_readers(tmp_path):
    from headsurgeon.scaleout.headstore import HeadStore
    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    _store(tmp_path / "s")
    version = _future(tmp_path / "s" / "manifest.json")
    for reader in (AttentionStore.load, HeadStore):
        with pytest.raises(StoreError) as err:
            reader(tmp_path / "s")
        _clear(err, tmp_path / "s" / "manifest.json", version)


def test_store_manifest_round_trips_byte_for_byte(tmp_path):
    from headsurgeon.surgery.patterns.store import AttentionStore

    store = _store(tmp_path / "s")
    first = (tmp_path / "s" / "manifest.json").read_bytes()
    meta = json.loads(first)
    assert (meta["format"], meta["version"]) == ("headsurgeon.attention_store", 2)
    again = AttentionStore.load(tmp_path / "s")
    again.save_manifest(range(again.n_shards))
    assert (tmp_path / "s" / "manifest.json").read_bytes() == first
    assert np.array_equal(again.batch()[0], store.batch()[0])


@pytest.mark.parametrize("mode", ["dense", "topq"])
def test_head_store_and_attention_store_share_one_reader(tmp_path, mode):
    from headsurgeon.scaleout.headstore import HeadStore
    from headsurgeon.surgery.patterns.store import AttentionStore
    from headsurgeon.surgery.patterns.store_reader import StoreReader

    _store(tmp_path / "s", mode)
    store, view = AttentionStore.load(tmp_path / "s"), HeadStore(tmp_path / "s")
    assert isinstance(store._reader, StoreReader) and isinstance(view.reader, StoreReader)
    assert store.layout == view.layout
    want, got = store.batch(), view.batch()
    assert np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1])


def _damage_in_both(directory):
    """The StoreError each reader raises on the store at ``directory``: (AttentionStore's, HeadStore's)."""
    from headsurgeon.scaleout.headstore import HeadStore
    from headsurgeon.surgery.patterns.store import AttentionStore, StoreError

    out = []
    for read in (lambda: AttentionStore.load(directory).batch([2]), lambda: HeadStore(directory).batch([2])):
        with pytest.raises(StoreError) as err:
            read()
        out.append(str(err.value))
    return out


def test_a_grown_shard_fails_the_same_way_in_both_readers(tmp_path):
    _store(tmp_path / "s")
    shard = tmp_path / "s" / "shard_00001.safetensors"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0")
    local, worker = _damage_in_both(tmp_path / "s")
    assert local == worker
    assert f"{shard} is damaged: it has {size + 1} bytes, the manifest recorded {size}" in local


def test_a_shard_of_the_wrong_shape_fails_the_same_way_in_both_readers(tmp_path):
    from safetensors.numpy import save_file

    _store(tmp_path / "s")
    shard = tmp_path / "s" / "shard_00001.safetensors"
    save_file({"s2": np.zeros((2, 3, 4, 4), dtype=np.float16)}, str(shard))  # sequence 2 has 5 tokens, not 4
    meta = json.loads((tmp_path / "s" / "manifest.json").read_text())
    del meta["shards"]["00001"]  # unlisted: no size or hash to catch it first, only the layout
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(meta))
    local, worker = _damage_in_both(tmp_path / "s")
    assert local == worker
    assert "tensor s2 is float16[2, 3, 4, 4], expected float16[2, 3, 5, 5]" in local


# ------------------------------------------------------------------------------------------- programs.json
def _programs(path):
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    ps = ProgramSet()
    ps.add((0, 1), Program.parse("prev(1)"), source="hand", scores={"test": {"iou": 0.5, "jsd": 0.25}})
    return ps.save(path)


def test_a_future_programs_file_is_refused(tmp_path):
    from headsurgeon.synth.errors import ProgramError
    from headsurgeon.synth.programset import ProgramSet

    path = _programs(tmp_path / "programs.json")
    version = _future(path, version=3)
    with pytest.raises(ProgramError) as err:
        ProgramSet.load(path)
    _clear(err, path, version)


def test_programs_file_round_trips_byte_for_byte(tmp_path):
    from headsurgeon.synth.programset import ProgramSet

    first = _programs(tmp_path / "a.json").read_bytes()
    assert first.startswith(b'{\n "format": "headsurgeon.programset",\n "version": 1,\n')
    ProgramSet.load(tmp_path / "a.json").save(tmp_path / "b.json")
    assert (tmp_path / "b.json").read_bytes() == first


# ------------------------------------------------------------------------------------------- checkpoint manifest
def test_a_future_checkpoint_manifest_is_refused(tmp_path):
    from headsurgeon.hub.checkpoint import FormatVersionError, read_manifest

    (tmp_path / "ck").mkdir()
    path = tmp_path / "ck" / "manifest.json"
    path.write_text(json.dumps({"format": "headsurgeon.hybrid", "format_version": 2, "heads": {}, "files": {},
                                "weights": {}, "base": {}}))
    with pytest.raises(FormatVersionError) as err:
        read_manifest(tmp_path / "ck")
    _clear(err, path, 2)


def test_checkpoint_manifest_header_is_written_as_before():
    from headsurgeon.hub.checkpoint.layout import CHECKPOINT, json_file

    doc = {**CHECKPOINT.header(), "created": "x"}
    assert json_file(doc) == b'{\n "format": "headsurgeon.hybrid",\n "format_version": 1,\n "created": "x"\n}\n'
    assert check_versioned(json.loads(json_file(doc)), CHECKPOINT, "m") == 1


# ------------------------------------------------------------------------------------------- the journal's run.json
def test_a_future_journal_run_file_is_refused(tmp_path):
    from headsurgeon.scaleout.journal import HeadJournal, JournalError

    HeadJournal(tmp_path / "heads", keys=tmp_path / "keys").start({"seed": 0})
    version = _future(tmp_path / "heads" / "run.json")
    with pytest.raises(JournalError) as err:
        HeadJournal(tmp_path / "heads", keys=tmp_path / "keys").start({"seed": 0})
    _clear(err, tmp_path / "heads" / "run.json", version)


def test_journal_run_file_round_trips(tmp_path):
    from headsurgeon.scaleout.journal import HeadJournal

    HeadJournal(tmp_path / "heads", keys=tmp_path / "keys").start({"seed": 0})
    first = (tmp_path / "heads" / "run.json").read_bytes()
    have = json.loads(first)
    assert (have["format"], have["version"]) == ("headsurgeon.head_journal", 2)
    assert list(have) == sorted(have)  # sorted keys, as the journal always wrote them
    assert HeadJournal(tmp_path / "heads", keys=tmp_path / "keys").start({"seed": 0}) == {}  # its own run: accepted
    assert (tmp_path / "heads" / "run.json").read_bytes() == first  # and never rewritten


# ------------------------------------------------------------------------------------------- a tp run's config.json
def test_a_future_tp_run_config_is_refused(tmp_path):
    from headsurgeon.core import InputError
    from headsurgeon.tp.rundir import load_run

    (tmp_path / "config.json").write_text(json.dumps({"format": 2, "task": "sort"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InputError) as err:
        load_run(tmp_path)
    _clear(err, tmp_path / "config.json", 2)


def test_tp_run_config_is_written_as_before(tmp_path):
    from headsurgeon.tp.rundir import RUN_CONFIG, _json

    write_versioned(tmp_path / "config.json", RUN_CONFIG, {"task": "sort"}, encode=_json)
    assert (tmp_path / "config.json").read_bytes() == b'{\n  "format": 1,\n  "task": "sort"\n}\n'
    assert check_versioned(json.loads((tmp_path / "config.json").read_bytes()), RUN_CONFIG, "c") == 1


# ------------------------------------------------------------------------------------------- the tensor cache
def test_a_future_tensor_cache_shard_is_a_miss_that_says_why(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from headsurgeon.kernels.cache import CacheEntryWarning, TensorCache, cache_key

    key = cache_key("p", "s", "causal")
    TensorCache(directory=tmp_path).put(key, np.ones((2, 2), dtype=np.float32))
    (shard,) = tmp_path.glob("*.safetensors")
    with safe_open(str(shard), "np") as f:
        meta = dict(f.metadata())
    assert meta["format"] == "headsurgeon-tensor-cache/1"
    assert np.array_equal(TensorCache(directory=tmp_path).get(key), np.ones((2, 2), dtype=np.float32))
    save_file(load_file(str(shard)), str(shard), metadata={**meta, "format": "headsurgeon-tensor-cache/2"})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert TensorCache(directory=tmp_path).get(key) is None
    (message,) = [str(w.message) for w in seen if issubclass(w.category, CacheEntryWarning)]
    assert str(shard) in message and "format version 2" in message and "upgrade headsurgeon" in message


# ------------------------------------------------------------------------------------------- the typed source
def test_each_source_kind_writes_the_json_the_loaders_wrote():
    from headsurgeon.surgery.models.handle import (EmbeddedSource, GgufSource, HfSource, Llama2cSource, ObjectSource,
                                            ZooSource, source_from_json)

    cases = [
        (Llama2cSource("/m.bin", "a" * 64), {"kind": "llama2c", "path": "/m.bin", "sha256": "a" * 64}),
        (Llama2cSource("/m.bin", "a" * 64, "/t.model", "b" * 64),
         {"kind": "llama2c", "path": "/m.bin", "sha256": "a" * 64, "tokenizer": "/t.model",
          "tokenizer_sha256": "b" * 64}),
        (GgufSource("/m.gguf", "c" * 64, "org/model"),
         {"kind": "gguf", "path": "/m.gguf", "sha256": "c" * 64, "name": "org/model"}),
        (HfSource("org/model"), {"kind": "hf", "name_or_path": "org/model"}),
        (HfSource("org/model", "main"), {"kind": "hf", "name_or_path": "org/model", "revision": "main"}),
        (ZooSource("tiny-stories"), {"kind": "zoo", "name": "tiny-stories"}),
        (EmbeddedSource("/ck", None, {"kind": "zoo", "name": "tiny-stories"}),
         {"kind": "embedded", "path": "/ck", "weights_sha256": None, "base": {"kind": "zoo", "name": "tiny-stories"}}),
        (ObjectSource(), {"kind": "object"}),
    ]
    for record, want in cases:
        assert json.dumps(record.to_json()) == json.dumps(want)  # keys in the loaders' order: manifests unchanged
        assert source_from_json(want) == record
    with pytest.raises(dataclasses.FrozenInstanceError):
        cases[0][0].path = "/other"  # a value: change it with dataclasses.replace


def test_a_malformed_source_record_names_the_problem():
    from headsurgeon.core import InputError
    from headsurgeon.surgery.models.handle import source_from_json

    with pytest.raises(InputError, match="unknown model source kind 'disk'"):
        source_from_json({"kind": "disk"})
    with pytest.raises(InputError, match="has no field '_pattern_edits'"):
        source_from_json({"kind": "zoo", "name": "tiny-stories", "_pattern_edits": True})


def test_the_handle_keeps_its_pattern_edit_probe_beside_its_source(stories):
    from headsurgeon.surgery.models.handle import Llama2cSource
    from headsurgeon.surgery.swap.replace import pattern_edits_take_effect
    from headsurgeon.synth.program import Program
    from headsurgeon.surgery.swap.replace import replace_heads

    assert isinstance(stories.source, Llama2cSource) and stories.source.path.endswith("stories260K.bin")
    assert stories.source.tokenizer.endswith("tok512.model") and len(stories.source.tokenizer_sha256) == 64
    assert stories.describe()["source"] == stories.source.to_json()
    replace_heads(stories, {(0, 1): Program.parse("prev(1)")}).restore()
    assert stories.pattern_edits is True and pattern_edits_take_effect(stories)
    assert "_pattern_edits" not in stories.source.to_json()
    copy = replace_heads(stories, {(0, 1): Program.parse("prev(1)")}, copy=True)
    assert copy.handle.source == stories.source
