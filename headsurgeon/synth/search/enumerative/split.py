"""One split's sequences as padded arrays, chunk by chunk: ids, lengths, features, real patterns and the
primitives' row-normalized score matrices (through an optional ``TensorCache``)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ....kernels import primitives
from ....kernels.cache import cache_key
from ... import dsl
from ...dsl.labels import dep_index
from ...features import POS_TAGS, batch_feature_arrays
from ...program import Program
from ...sequence import pad_ids
from ...tensors import mask_policy
from ..base import PatternSource
from ....core import Head

#: bytes of candidate patterns held at once per chunk (sets the chunk size)
CHUNK_BYTES = 192 << 20


class SplitArrays:
    """Padded ids, lengths and feature arrays of one split, sliced per chunk of sequences."""

    def __init__(self, store: PatternSource, indices: list[int], feature_names: Iterable[str]) -> None:
        self.store = store
        self.indices = [int(i) for i in indices]
        self.seqs = [store.sequences[i] for i in self.indices]
        self.ids, self.lengths = pad_ids(self.seqs)
        names = sorted(set(feature_names))
        if names:
            self.features = batch_feature_arrays(self.seqs, names)
        else:
            self.features = {}

    def __len__(self) -> int:
        return len(self.indices)

    def chunks(self, per_chunk: int) -> list[np.ndarray]:
        """Positions (into this split) grouped in chunks of at most ``per_chunk``, similar lengths together."""
        order = np.argsort(self.lengths, kind="stable")
        return [order[i: i + per_chunk] for i in range(0, len(order), max(1, per_chunk))]

    def arrays(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """ids [Bc, Nc], lengths [Bc], features [Bc, Nc] of a chunk (Nc = its longest sequence)."""
        lens = self.lengths[pos]
        width = int(lens.max())
        ids = np.ascontiguousarray(self.ids[pos, :width])
        feats = {k: np.ascontiguousarray(v[pos, :width]) for k, v in self.features.items()}
        return ids, lens, feats

    def real(self, pos: np.ndarray, heads: list[Head]) -> tuple[np.ndarray, np.ndarray]:
        """Real patterns [H, Bc, Nc, Nc] (float32) and lengths of a chunk."""
        pats, lens = self.store.batch([self.indices[p] for p in pos], heads)
        return np.ascontiguousarray(pats, dtype=np.float32), np.asarray(lens, dtype=np.int64)

    def components(self, programs: list[Program], pos: np.ndarray, causal: bool, cache: Any = None,
                   sums: np.ndarray | None = None) -> np.ndarray:
        """Row-normalized raw scores [P, Bc, Nc, Nc] of a chunk: empty rows stay empty (as inside a mix).

        ``sums`` ([P, Bc, Nc], optional) receives each row's raw total (what ``sum`` needs to undo the
        normalization). With a ``TensorCache``, each (program, sequence) matrix is looked up and stored under
        its own key (mask policy ``rownorm/...``, row totals under ``rowsum/...``).
        """
        ids, lens, feats = self.arrays(pos)
        width = ids.shape[1]
        out = np.zeros((len(programs), len(pos), width, width), dtype=np.float32)
        for k, prog in enumerate(programs):
            todo = np.arange(len(pos))
            keys: list[str] = []
            if cache is not None:
                policy = "rownorm/" + mask_policy(causal)
                keys = [cache_key(prog.hash, self.seqs[p].key, policy) for p in pos]
                skeys = [cache_key(prog.hash, self.seqs[p].key, "rowsum/" + mask_policy(causal)) for p in pos]
                missing = []
                for b, key in enumerate(keys):
                    hit = cache.get(key)
                    n = int(lens[b])
                    tot = cache.get(skeys[b]) if sums is not None and hit is not None else None
                    if hit is not None and hit.shape == (n, n) and (sums is None or (tot is not None
                                                                                      and tot.shape == (n,))):
                        out[k, b, :n, :n] = hit
                        if sums is not None:
                            sums[k, b, :n] = tot
                    else:
                        missing.append(b)
                todo = np.asarray(missing, dtype=np.int64)
                if todo.size == 0:
                    continue
            if todo.size == len(pos):
                prog.evaluate_arrays(ids, lens, feats, causal, normalize=False, out=out[k])
                if sums is not None:
                    sums[k] = out[k].sum(axis=-1, dtype=np.float64)
                primitives.row_normalize(out[k])
            else:
                sub = prog.evaluate_arrays(ids[todo], lens[todo], {name: v[todo] for name, v in feats.items()},
                                           causal, normalize=False)
                if sums is not None:
                    sums[k, todo] = sub.sum(axis=-1, dtype=np.float64)
                primitives.row_normalize(sub)
                out[k, todo] = sub
            if cache is not None:
                cache.put_many({keys[b]: out[k, b, : lens[b], : lens[b]] for b in todo})
                if sums is not None:
                    cache.put_many({skeys[b]: sums[k, b, : lens[b]] for b in todo})
        return out


def chunk_size(n_items: int, width: int, limit: int) -> int:
    """Sequences per chunk so that ``n_items`` patterns of ``width``^2 float32 stay under CHUNK_BYTES."""
    per_seq = max(1, n_items) * width * width * 4
    return int(max(1, min(limit, CHUNK_BYTES // per_seq)))


def features_for(programs: Iterable[Program], preds: Iterable[dsl.Pred]) -> set[str]:
    """Feature arrays the programs and the query predicates read."""
    need: set[str] = set()
    for p in programs:
        need |= set(p.features_needed)
    for pr in preds:
        if pr.kind == "flag":
            need.add(pr.value)
        elif pr.kind in ("pos", "dep"):
            need.add(pr.kind)
    return need


def pred_mask(pred: dsl.Pred, ids: np.ndarray, feats: dict[str, np.ndarray]) -> np.ndarray:
    """Boolean [Bc, Nc]: queries satisfying ``pred`` (same rule as the DSL's gate)."""
    if pred.kind == "flag":
        return feats[pred.value] > 0
    if pred.kind == "pos":
        return feats["pos"] == POS_TAGS.index(pred.value)
    if pred.kind == "dep":
        return feats["dep"] == dep_index(pred.value)
    return np.isin(ids, np.asarray(pred.value, dtype=np.int64))
