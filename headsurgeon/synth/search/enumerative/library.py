"""The primitive library of the enumerative search: DSL primitives with parameter grids, and the query predicates
tried as gates, both drawn from the synth sequences (frequent tokens, token classes)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from ... import dsl
from ...features import batch_feature_arrays
from ...program import Program
from ...sequence import Sequence, pad_ids

#: flags that exist without spaCy (rule-based features)
BASIC_FLAGS = ("punct", "sent_end", "newline", "cap", "word_start")
#: POS tags tried in recent(pos=TAG) and as query gates
POS_TAGS_TRIED = ("NOUN", "VERB", "ADJ", "DET", "PRON", "PROPN", "ADP", "AUX", "ADV", "CCONJ", "PUNCT")
#: dependency labels tried as query gates (``dep=LABEL``)
DEP_LABELS_TRIED = ("nsubj", "dobj", "det", "prep", "pobj", "ROOT")


def frequent_tokens(seqs: list[Sequence], count: int, skip_first: bool = True, min_sequences: int = 1) -> list[int]:
    """The ``count`` most frequent token ids of the sequences (BOS excluded; each in at least
    ``min_sequences`` sequences), ties by id."""
    c: Counter[int] = Counter()
    spread: Counter[int] = Counter()
    for s in seqs:
        ids = s.ids[1:] if (skip_first and s.has_bos) else s.ids
        c.update(int(t) for t in ids)
        spread.update({int(t) for t in ids})
    ranked = sorted((kv for kv in c.items() if spread[kv[0]] >= min_sequences), key=lambda kv: (-kv[1], kv[0]))
    return [t for t, _ in ranked[:count]]


def _flag_token_ids(seqs: list[Sequence], feats: dict[str, np.ndarray], flag: str, lengths: np.ndarray,
                    ids: np.ndarray, min_share: float = 0.5) -> list[int]:
    """Token ids that carry ``flag`` in at least ``min_share`` of their occurrences (a token class)."""
    arr = feats.get(flag)
    if arr is None:
        return []
    inside = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    tok = ids[inside]
    fl = arr[inside] > 0
    if tok.size == 0:
        return []
    hits = np.bincount(tok, weights=fl.astype(np.float64), minlength=int(tok.max()) + 1)
    total = np.bincount(tok, minlength=int(tok.max()) + 1)
    keep = np.flatnonzero((total > 0) & (hits >= min_share * np.maximum(total, 1)) & (hits > 0))
    return [int(t) for t in keep]


def primitive_library(sequences: list[Sequence], causal: bool = True, *, key_tokens: int = 16,
                      max_prev: int = 8, spacy: bool = True) -> list[Program]:
    """The primitives with their parameter grids that the search scores on every head.

    ``key_tokens``: how many of the sequences' most frequent tokens get a ``key_in_set`` of their own
    (token classes such as punctuation or sentence ends get one each too). ``spacy=False`` leaves out
    everything that needs spaCy (POS tags, dependency heads).
    """
    seqs = list(sequences)
    texts: list[str] = ["self()", "first()", "uniform()"]
    texts += [f"prev({k})" for k in range(1, max_prev + 1)]
    if not causal:
        texts += [f"next({k})" for k in range(1, max_prev + 1)]
        texts += ["window(-2, 2)", "window(-4, 4)", "window(-8, -1)"]
    texts += [f"window({a}, {b})" for a, b in ((0, 1), (0, 2), (1, 2), (1, 3), (2, 4), (1, 5), (3, 8),
                                                (5, 12), (9, 16), (13, 32), (17, 48), (33, 128))]
    texts += [f"decay({r})" for r in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)]
    texts += ["same_token()", "same_token_recent()", "induction()", "ngram_induction(2)", "sentence_start()",
              "word_start()", "same_word()"]
    texts += [f"recent({f})" for f in BASIC_FLAGS]
    if spacy:
        texts += ["dep_head()", "dep_children()", "same_lemma()"]
        texts += [f"recent(pos={t})" for t in POS_TAGS_TRIED]
    if seqs:
        ids, lengths = pad_ids(seqs)
        feats = batch_feature_arrays(seqs, [f for f in ("punct", "sent_end", "newline", "cap")])
        for flag in ("punct", "sent_end", "newline", "cap"):
            group = _flag_token_ids(seqs, feats, flag, lengths, ids)
            if group:
                texts.append(f"key_in_set(ids=[{', '.join(map(str, group))}])")
        for t in frequent_tokens(seqs, key_tokens):
            texts.append(f"key_in_set(ids=[{t}])")
    out: list[Program] = []
    seen: set[str] = set()
    for text in texts:
        p = Program.parse(text)
        if p.hash not in seen:
            seen.add(p.hash)
            out.append(p)
    return out


def query_predicates(sequences: list[Sequence], *, spacy: bool = True, key_tokens: int = 6) -> list[dsl.Pred]:
    """Query predicates tried as gates: the flags, POS tags (with spaCy) and the most frequent tokens."""
    preds = [dsl.Pred("flag", f) for f in BASIC_FLAGS + ("quote",)]
    if spacy:
        preds += [dsl.Pred("pos", t) for t in POS_TAGS_TRIED if t != "PUNCT"]
        preds += [dsl.Pred("dep", t) for t in DEP_LABELS_TRIED]
    preds += [dsl.Pred("ids", (t,)) for t in frequent_tokens(list(sequences), key_tokens)]
    return preds
