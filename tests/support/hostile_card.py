"""Payloads that try to make a model card run or link something, a manifest that carries them in every field a
card shows, and the check that a rendered card keeps them inert (tests/hub/test_hostile_card.py,
tests/surgery/test_heal.py; SECURITY.md)."""
from __future__ import annotations

import re

import pytest

PAYLOADS = [
    "<script>alert('evil.example')</script>",
    "[click](javascript:alert('evil.example'))",
    "![pixel](https://evil.example/p.png)",
    "`` ` <img src=x onerror=alert('evil.example')> ` ``",
    "a | <b>evil.example</b> | c",
    "see www.evil.example or https://evil.example/x or mail@evil.example",
    "<a href='https://evil.example'>x</a>\n# heading\n```\nfence",
    "&lt;script&gt; &#106;avascript:evil.example",
]


def hostile_manifest(payload: str) -> dict:
    head = {"layer": 0, "head": 1, "alpha": 1.0, "program": f"programs/{payload}.json", "kind": "dsl",
            "hash": "ab" * 32, "text": payload, "gloss": payload, "source": payload, "hypothesis": payload,
            "size": 3, "chars": 7, "scores": {"test": {"iou": 0.5, "jsd": payload}}}
    return {
        "format": "headsurgeon.hybrid", "format_version": 1, "library": {"headsurgeon": payload},
        "base": {"kind": "hf", "name_or_path": payload, "revision": payload},
        "config": {"name": payload, "n_layers": 2, "n_heads": 4, "architecture": payload, "attention": payload,
                   "d_model": 32},
        "weights": {"sha256": payload},
        "heads": {payload: head, "L0H2": dict(head, kind="python")},
        "metrics": {payload: payload, "delta_ppl": 0.25, "nested": {payload: 1.0}},
        "files": {f"programs/{payload}.json": {"size": 10, "sha256": "0" * 64}},
    }


def live_html(card: str) -> str:
    """The card rendered as GitHub-flavoured Markdown with raw HTML allowed, minus the text of code spans."""
    markdown_it = pytest.importorskip("markdown_it")
    body = card.split("\n---\n", 1)[-1]  # the YAML front matter is not Markdown
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(body)
    return re.sub(r"<code>.*?</code>", "<code></code>", html, flags=re.DOTALL)


def assert_inert(card: str) -> None:
    html = live_html(card)
    assert not re.search(r"<(script|a|img|b)\b", html, re.IGNORECASE), html
    assert "javascript" not in html.lower() and "evil.example" not in html, html  # only ever inside code
    # the raw text: every payload fragment sits inside a code span (so no GFM autolink or tag can form)
    outside = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", card.split("\n---\n", 1)[-1])
    assert "evil.example" not in outside and "<" not in outside.replace("<br>", ""), outside
