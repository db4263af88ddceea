"""Text corpus → documents → token windows (:class:`Sequence`) with the model's BOS convention, and splits.

Splits are made by document, never by window, so that ``synth`` / ``select`` / ``test`` never share text; their
fractions count predicted tokens, not windows or documents, since every cost is averaged over predicted tokens.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from ..core.fileio import split_documents
from ..synth.errors import excerpt
from ..synth.sequence import Sequence
from ..synth.splits import StoreSplits
from ..core import HeadsurgeonError, NotFoundError, SPLITS, Split
from .configs import CorpusConfig

if TYPE_CHECKING:  # surgery/models/handle.py imports torch, which this module does without
    from .models.handle import ModelHandle


class CorpusError(HeadsurgeonError, ValueError):
    """The corpus is empty or unusable; the message says what to change."""


def _check_count(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """Refuse a window setting that is not a whole number >= ``minimum`` with a CorpusError naming it."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise CorpusError(f"{name} must be a whole number >= {minimum}, got {excerpt(value)}")


def _looks_like_path(source: Any) -> bool:
    """A string meant as a file name rather than as the corpus text itself (read_documents' rule)."""
    return isinstance(source, str) and "\n" not in source and len(source) < 4096 and (
        "/" in source or source.endswith(".txt") or Path(source).expanduser().exists())


def check_corpus_source(source: Any, separator: str | None = None) -> None:
    """What can be checked of a corpus before a model loads: a named file exists and is a file, the separator is
    not empty. Raises CorpusError naming the problem and the fix."""
    if separator is not None and (not isinstance(separator, str) or not separator):
        raise CorpusError(f"the document separator must be a non-empty string, got {separator!r}; leave it out to "
                          "split documents on blank lines")
    if isinstance(source, Path) or _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise CorpusError(f"corpus file not found: {source}")
        if not path.is_file():
            raise CorpusError(f"the corpus {source} is not a regular file; pass a UTF-8 text file")


def read_documents(source: str | Path | Iterable[str], separator: str | None = None) -> list[str]:
    """Documents from a text file (or a list of strings), split on blank lines or on ``separator``.

    Empty documents are dropped. A list of strings is taken as documents (each may still contain
    ``separator`` if one is given).
    """
    check_corpus_source(source, separator)
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and len(source) < 4096
                                    and Path(source).expanduser().is_file()):
        path = Path(source).expanduser()
        text = path.read_text(encoding="utf-8", errors="replace")
        chunks = [text]
        origin = str(path)
    elif isinstance(source, str):
        if len(source) < 4096 and ("/" in source or source.endswith(".txt")) and "\n" not in source:
            raise CorpusError(f"corpus file not found: {source}")
        chunks = [source]
        origin = "the given text"
    else:
        chunks = [str(c) for c in source]
        origin = "the given list"
        if separator is None:
            given = [c.strip() for c in chunks if c and c.strip()]
            if not given:
                raise CorpusError(f"{origin} holds no text: every document is empty")
            return given
    docs: list[str] = []
    for chunk in chunks:
        if separator:
            docs.extend(p.strip() for p in chunk.split(separator))
        else:
            docs.extend(split_documents(chunk))  # blank lines; CRLF and CR line ends read as LF
    docs = [d for d in docs if d]
    if not docs:
        raise CorpusError(f"{origin} holds no text: add documents separated by blank lines (or pass separator=)")
    return docs


def _check_tokenizer(tokenizer: Any, handle: ModelHandle | None) -> None:
    """Refuse a tokenizer that cannot make windows worth capturing (no tokenizer, or fewer than 2 tokens)."""
    if tokenizer is None or not callable(tokenizer):
        raise CorpusError("the model has no tokenizer to make token windows with: pass tokenizer= (a transformers "
                          "tokenizer, a sentencepiece .model or a llama2.c tokenizer.bin)")
    try:
        size = len(tokenizer)
    except TypeError:
        return  # a tokenizer without a length: the windows' ids are still checked against the model
    if size < 2:
        owner = f" for {handle.name}" if handle is not None else ""
        raise CorpusError(f"the tokenizer{owner} has {size} token(s) in its vocabulary, so every window would be "
                          "the same token: pass the model's own tokenizer (tokenizer=)")


def _tokenize(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def make_sequences(
    model_or_tokenizer: Any,
    documents: Iterable[str],
    max_len: int = CorpusConfig.max_len,
    prepend_bos: bool | None = None,
    max_sequences: int | None = None,
    min_len: int = 4,
) -> list[Sequence]:
    """Tokenize documents into windows of at most ``max_len`` tokens (BOS included when the model uses one).

    A long document yields consecutive windows; windows shorter than ``min_len`` tokens are dropped; ``max_sequences``
    (default: no cap) stops after that many windows.
    Each Sequence's ``text`` is the document span its tokens cover and ``offsets`` index that span.
    """
    handle = model_or_tokenizer if hasattr(model_or_tokenizer, "tokenizer") and hasattr(model_or_tokenizer, "n_ctx") else None
    tokenizer = handle.tokenizer if handle is not None else model_or_tokenizer
    _check_count("max_len", max_len, 2)
    _check_count("max_sequences", max_sequences, 1, optional=True)
    _check_count("min_len", min_len, 1)
    if handle is not None and max_len > handle.n_ctx:
        raise CorpusError(f"max_len={max_len} exceeds the model's context of {handle.n_ctx} tokens; lower max_len")
    _check_tokenizer(tokenizer, handle)
    if prepend_bos is None:
        prepend_bos = handle.prepend_bos if handle is not None else getattr(tokenizer, "bos_token_id", None) is not None
    bos_id = None
    if prepend_bos:
        bos_id = handle.bos_id if handle is not None else getattr(tokenizer, "bos_token_id", None)
        if bos_id is None:
            raise CorpusError("prepend_bos=True but the tokenizer defines no BOS token; pass prepend_bos=False")
    bos_token = tokenizer.convert_ids_to_tokens([bos_id])[0] if bos_id is not None else None
    body = max_len - (1 if bos_id is not None else 0)
    out: list[Sequence] = []
    n_docs = 0
    for doc_index, doc in enumerate(documents):
        if not doc or not doc.strip():
            continue
        n_docs += 1
        ids, offsets = _tokenize(tokenizer, doc)
        for start in range(0, len(ids), body):
            w_ids, w_off = ids[start: start + body], offsets[start: start + body]
            if len(w_ids) + (bos_id is not None) < min_len:
                continue
            lo = min(a for a, b in w_off)
            hi = max(b for a, b in w_off)
            text = doc[lo:hi]
            offs = [(max(a - lo, 0), max(b - lo, 0)) for a, b in w_off]
            if handle is not None and max(w_ids) >= handle.vocab_size:
                raise CorpusError(f"the tokenizer gave token id {max(w_ids)}, but {handle.name} has only "
                                  f"{handle.vocab_size} embeddings: pass the model's own tokenizer (tokenizer=)")
            tokens = tokenizer.convert_ids_to_tokens(w_ids)
            if bos_id is not None:
                w_ids, offs, tokens = [bos_id] + w_ids, [(0, 0)] + offs, [bos_token] + tokens
            out.append(Sequence(ids=np.array(w_ids), tokens=list(tokens), text=text, offsets=np.array(offs),
                                doc=doc_index, has_bos=bos_id is not None))
            if max_sequences is not None and len(out) >= max_sequences:
                return out
    if not out:
        raise CorpusError(
            f"no token windows from {n_docs} non-empty documents (each needs at least {min_len} tokens); "
            "give more text or lower min_len"
        )
    return out


#: the fewest test windows a bootstrap interval over windows can be drawn from (headsurgeon/surgery/measure/divergence.py MIN_WINDOWS)
MIN_TEST_WINDOWS = 2


def predicted_tokens(sequences: Iterable[Sequence]) -> int:
    """The tokens a window's forward predicts (all but its first), summed: what every cost is averaged over."""
    return int(sum(max(s.n - 1, 0) for s in sequences))


@dataclass
class Splits:
    """Sequences split by document into ``synth`` (fit/prompt), ``select`` (choose) and ``test`` (report)."""

    synth: list[Sequence]
    select: list[Sequence]
    test: list[Sequence]

    def __getitem__(self, name: Split) -> list[Sequence]:
        if name not in SPLITS:
            raise NotFoundError(f"unknown split {name!r}; use one of {SPLITS}")
        return getattr(self, name)

    def sizes(self) -> dict[str, int]:
        return {name: len(self[name]) for name in SPLITS}

    def tokens(self) -> dict[str, int]:
        """Predicted tokens per split: the unit the split fractions count and every cost is averaged over."""
        return {name: predicted_tokens(self[name]) for name in SPLITS}

    def require(self, *names: Split, minimum: int = MIN_TEST_WINDOWS) -> None:
        """Refuse (CorpusError) a split of ``names`` with fewer than ``minimum`` windows, naming the fix, instead of
        reporting a degenerate bootstrap interval over one window later."""
        for name in names:
            if len(self[name]) < minimum:
                need = (f"too few for a bootstrap interval over windows (at least {minimum})" if minimum >= 2
                        else "and it needs at least one")
                raise CorpusError(
                    f"the {name} split holds {len(self[name])} window(s) ({self.tokens()[name]} predicted tokens; all "
                    f"splits: {self.sizes()} windows), {need}: give more text (more documents), or raise "
                    "--max-sequences, or lower --max-len so the same text makes more windows")

    @property
    def all(self) -> list[Sequence]:
        """synth, then select, then test: the order ``indices`` refers to (capture this list)."""
        return self.synth + self.select + self.test

    @property
    def indices(self) -> StoreSplits:
        """Positions of each split in :attr:`all`, as the StoreSplits searchers, selection and the report take
        (headsurgeon/synth/splits.py; ``indices["test"]`` is a list)."""
        a, b = len(self.synth), len(self.synth) + len(self.select)
        return StoreSplits(range(a), range(a, b), range(b, b + len(self.test)))


def _cut(cumulative: np.ndarray, share: float) -> int:
    """How many documents (in split order) go before the boundary at ``share`` of the predicted tokens: those whose
    middle token falls before it, so each split's share is off by at most half a document."""
    total = cumulative[-1]
    middles = cumulative - np.diff(np.concatenate([[0.0], cumulative])) / 2
    return int(np.searchsorted(middles, share * total, side="left"))


def split_sequences(
    sequences: list[Sequence], fractions: tuple[float, float, float] = (0.6, 0.2, 0.2), seed: int = 0
) -> Splits:
    """Deterministic split by document whose ``fractions`` count predicted tokens (whole windows, never a document in
    two splits); every split with a positive fraction gets at least one document when there are three."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise CorpusError(f"fractions must be three non-negative numbers summing to 1, got {excerpt(fractions)}")
    docs = sorted({s.doc for s in sequences})
    if not docs:
        raise CorpusError("cannot split an empty list of sequences")
    weight = dict.fromkeys(docs, 0)
    for s in sequences:
        weight[s.doc] += max(s.n - 1, 0)
    order = [docs[i] for i in np.random.default_rng(seed).permutation(len(docs))]
    cumulative = np.cumsum([float(max(weight[d], 1)) for d in order])
    n = len(docs)
    n_synth = _cut(cumulative, fractions[0])
    n_select = _cut(cumulative, fractions[0] + fractions[1]) - n_synth
    if n >= 3:
        n_synth = min(max(n_synth, 1 if fractions[0] > 0 else 0), n - 2)
        n_select = min(max(n_select, 1 if fractions[1] > 0 else 0), n - n_synth - 1)
    which = {}
    for rank, d in enumerate(order):
        which[d] = "synth" if rank < n_synth else ("select" if rank < n_synth + n_select else "test")
    parts: dict[str, list[Sequence]] = {name: [] for name in SPLITS}
    for s in sequences:
        parts[which[s.doc]].append(s)
    return Splits(**parts)


def load_corpus(
    model: Any, source: str | Path | Iterable[str], max_len: int = CorpusConfig.max_len,
    separator: str | None = CorpusConfig.separator, max_sequences: int | None = CorpusConfig.max_sequences,
    fractions: tuple[float, float, float] = CorpusConfig.fractions, seed: int = CorpusConfig.seed, *,
    config: CorpusConfig | None = None,
) -> Splits:
    """Read, tokenize and split a corpus in one call (the defaults are headsurgeon/surgery/configs.py ``CorpusConfig``'s);
    ``config``: those settings as one CorpusConfig instead of the keywords."""
    if config is not None:
        given = {name: value for name, value in (("max_len", max_len), ("separator", separator),
                                                 ("max_sequences", max_sequences), ("fractions", fractions),
                                                 ("seed", seed)) if value != getattr(CorpusConfig, name)}
        if given:
            raise CorpusError(f"load_corpus got config= and {', '.join(given)} beside it: pass one or the other "
                              "(set them in the CorpusConfig with dataclasses.replace)")
        max_len, separator, max_sequences = config.max_len, config.separator, config.max_sequences
        fractions, seed = config.fractions, config.seed
    docs = read_documents(source, separator)
    return split_sequences(make_sequences(model, docs, max_len=max_len, max_sequences=max_sequences), fractions, seed)
