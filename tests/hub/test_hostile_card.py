"""Model cards built from someone else's programs.json (headsurgeon/hub/card.py, SECURITY.md).

Every text a card takes from programs or the manifest (program text, gloss, source, hypothesis, head and
model names, metric names and values, file names) carries payloads here: a ``<script>`` tag, a
``javascript:`` link, image syntax, backticks that try to close a code span, a pipe that tries to open a
table cell and bare URLs that GFM would autolink. The card is rendered to HTML with markdown-it (installed
with rich) and checked for live tags and links, and its raw text is checked as well.
"""
from __future__ import annotations

import re

import pytest

from headsurgeon.hub.card import render_card
from headsurgeon.hub.checkpoint import save_hybrid
from headsurgeon.surgery.swap.replace import replace_heads
from headsurgeon.synth.program import Program
from headsurgeon.synth.programset import ProgramSet
from support.hostile_card import PAYLOADS, assert_inert, hostile_manifest


@pytest.mark.parametrize("payload", PAYLOADS)
def test_card_fields_from_programs_are_inert(payload):
    card = render_card(hostile_manifest(payload), "hf://acme/ok")
    assert_inert(card)
    front = card.split("\n---\n", 1)[0]
    assert all(line.startswith(("---", "library_name", "tags", "- ", "base_model: \"")) for line in
               front.splitlines()), front  # a newline in a name cannot add YAML keys


def test_every_table_row_keeps_its_cells():
    card = render_card(hostile_manifest("a | b | c"), "x")
    rows = [line for line in card.splitlines() if line.startswith("| ") and "L0H2" in line]
    assert rows and all(len(re.findall(r"(?<!\\)\|", row)) == 10 for row in rows)


def test_hostile_location_cannot_leave_the_code_block():
    card = render_card(hostile_manifest("x"), 'evil"); import os; os.system("id")  #\n```\n<script>')
    snippet = card.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert snippet.count("\n") == 2 and 'import os; os.system' in snippet.splitlines()[1]
    compile(snippet, "card", "exec")  # the location is one Python string literal


def test_plain_values_stay_readable():
    card = render_card(hostile_manifest("x"), "x")
    assert "| delta_ppl | 0.25 |" in card


def test_save_hybrid_card_from_a_hostile_programset(stories, tmp_path):
    ps = ProgramSet()
    payload = PAYLOADS[1] + " " + PAYLOADS[0]
    ps.add((0, 1), Program.parse("prev(1)"), source=payload, hypothesis=payload,
           scores={"test": {"iou": 0.9, "jsd": 0.1}})
    hybrid = replace_heads(stories, ps)
    hybrid.restore()
    folder = save_hybrid(hybrid, tmp_path / "ck", programs=ps, metrics={payload: payload})
    card = (folder / "README.md").read_text()
    assert "javascript" in card  # the payload is shown ...
    assert_inert(card)  # ... but never live
