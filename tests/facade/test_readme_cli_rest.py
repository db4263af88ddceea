"""Every command line of README.md's CLI section that is not in tests/facade/test_readme_cli.py's explain chain runs in
order in a scratch checkout, as written (slow) and on 12 windows of 24 tokens (by default; support/readme_text.py's
SIZES): the demo, info, heads, score, capture, ablate and the Transformer Programs lines."""
from __future__ import annotations

import pytest

from support.readme_text import SIZES, chain, cli_lines, run_lines, scratch, sized

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("small", SIZES)
def test_the_other_command_lines_run_as_written(tmp_path, small):
    variables, lines = cli_lines()
    explain_chain = chain(lines, "headsurgeon explain")
    rest = [line for line in lines if line not in explain_chain]
    assert rest and len(rest) + len(explain_chain) == len(lines)
    work = scratch(tmp_path)
    run_lines(sized(rest, small), variables, work)
    demo = work / "hs-out" / "demo"  # the demo exits 1 unless the reloaded hybrid's logits are identical
    for name in ("report.html", "programs.json", "sweep.png", "hybrid/manifest.json", "hybrid/README.md"):
        assert (demo / name).exists(), name
    from headsurgeon.hub.checkpoint import load_hybrid

    again = load_hybrid(demo / "hybrid")
    assert again.replaced and again.handle.n_layers * again.handle.n_heads == 16  # tiny-stories: 4 x 4 heads
    again.restore()
