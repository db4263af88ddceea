"""WordNet noun/verb flags per token, from NLTK's locally installed corpus (never downloaded here).

The reader is loaded once per process and each (word, part of speech) lookup is memoized; a missing or
incomplete corpus raises FeatureDependencyError with offline install steps.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from .errors import FeatureDependencyError
from .words import Layout

__all__ = ["load_wordnet", "wordnet_flags"]

_WORDNET: Any = None
_WN_MEMO: dict[tuple[str, str], bool] = {}


def _wordnet_missing_message(searched: Iterable[str]) -> str:
    return (
        "NLTK's WordNet corpus is not installed (nltk.data.find('corpora/wordnet') found nothing in "
        f"{list(searched)}); is_noun_wordnet / is_verb_wordnet need it. Offline: install Debian's "
        "`wordnet-base` and `wordnet-sense-index` packages (NLTK needs index.sense too) and COPY (not symlink: NLTK 3.10 rejects links "
        "that leave nltk_data) the files of /usr/share/wordnet into ~/nltk_data/corpora/wordnet/ "
        "(or any folder on NLTK_DATA, under corpora/wordnet). With network access: "
        "`python -m nltk.downloader wordnet`."
    )


def load_wordnet() -> Any:
    """Return an NLTK WordNet reader over the locally installed corpus, else raise FeatureDependencyError."""
    global _WORDNET
    if _WORDNET is not None:
        return _WORDNET
    import warnings

    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    try:
        root = nltk.data.find("corpora/wordnet")  # also finds corpora/wordnet.zip
    except LookupError:
        raise FeatureDependencyError(_wordnet_missing_message(nltk.data.path)) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "multilingual functions are not available": we need none
            reader = WordNetCorpusReader(root, None)
    except (LookupError, OSError, ValueError) as exc:
        raise FeatureDependencyError(
            f"NLTK's WordNet corpus at {root} is incomplete or unreadable ({exc}). "
            + _wordnet_missing_message(nltk.data.path)
        ) from None
    _WORDNET = reader
    return reader


def _wn_has(wn: Any, word: str, pos: str) -> bool:
    key = (word, pos)
    hit = _WN_MEMO.get(key)
    if hit is None:
        hit = bool(wn.synsets(word, pos=pos))
        _WN_MEMO[key] = hit
    return hit


def wordnet_flags(text: str, layout: Layout, n: int) -> dict[str, np.ndarray]:
    """``is_noun_wordnet`` / ``is_verb_wordnet`` of ``n`` tokens: their word (lower-cased) has such a synset."""
    wn = load_wordnet()
    noun = np.zeros(n, dtype=bool)
    verb = np.zeros(n, dtype=bool)
    for i in range(n):
        if layout.special[i]:
            continue
        w = text[layout.word_span[i][0] : layout.word_span[i][1]].lower().replace("’", "'")
        if not any(c.isalpha() for c in w):
            continue
        noun[i] = _wn_has(wn, w, "n")
        verb[i] = _wn_has(wn, w, "v")
    return dict(is_noun_wordnet=noun, is_verb_wordnet=verb)
