"""The headsurgeon CLI: --help everywhere, info, capture, ablate and eval on stories260K."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import CORPUS, STORIES, need
from headsurgeon.cli import build_parser, main


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert {"info", "capture", "ablate", "eval"} <= set(sub.choices)
    for name in sub.choices:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert "usage: headsurgeon" in capsys.readouterr().out


def model_args():
    need(STORIES / "stories260K.bin")
    return [f"llama2c:{STORIES / 'stories260K.bin'}", "--tokenizer", str(STORIES / "tok512.model")]


def test_info_json(capsys):
    assert main(["info", *model_args(), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_heads"] == 8 and info["n_kv_heads"] == 4 and info["pattern_hooks"][0] == "blocks.0.attn.hook_pattern"
    assert info["tokenizer_sample"]["tokens"][:2] == ["\u2581Once", "\u2581upon"]


@pytest.mark.e2e
def test_capture_then_store_loads(tmp_path, capsys):
    args = model_args()
    out = tmp_path / "store"
    assert main(["capture", args[0], str(need(CORPUS)), str(out), *args[1:], "--max-sequences", "6",
                 "--max-len", "32", "--mode", "topq"]) == 0
    from headsurgeon.surgery.patterns.store import AttentionStore

    store = AttentionStore.load(out)
    assert len(store) == 6 and store.mode == "topq"


@pytest.mark.e2e
def test_ablate_and_eval_json(tmp_path, capsys):
    from headsurgeon.synth.program import Program
    from headsurgeon.synth.programset import ProgramSet

    args = model_args()
    common = [str(need(CORPUS)), *args[1:], "--max-sequences", "30", "--max-len", "32", "--json"]
    assert main(["ablate", args[0], *common, "--heads", "L0H0,L1H1", "--kind", "zero"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["heads"] == "(none)" and rows[1]["heads"] == "L0H0,L1H1" and rows[1]["ppl"] != rows[0]["ppl"]
    ps = ProgramSet()
    ps.add("L0H0", Program.parse("first()"), "manual", {"test": {"iou": 0.9}})
    ps.add("L2H2", Program.parse("prev(1)"), "manual", {"test": {"iou": 0.4}})
    ps.save(tmp_path / "p.json")
    assert main(["eval", args[0], *common, "--programs", str(tmp_path / "p.json"), "--per-head",
                 "--sweep", str(tmp_path / "s.png")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["head"] for r in report["per_head"]} == {"L0H0", "L2H2"}
    assert report["sweep"][-1]["n_heads"] == 2 and (tmp_path / "s.png").exists()


def test_errors_are_one_line_messages(capsys):
    assert main(["info", "/nonexistent/model/dir"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_console_script_runs():
    r = subprocess.run([sys.executable, "-m", "headsurgeon.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "capture" in r.stdout


def test_help_loads_no_model_or_kernel_library():
    """Every subcommand's --help is built from the configs alone: torch, numba, transformers and scipy stay unloaded
    (the search and scale-out packages load their modules on first use, headsurgeon/core/lazy.py)."""
    code = ("import sys\nfrom headsurgeon.cli import build_parser, main\n"
            "sub = next(a for a in build_parser()._actions if a.dest == 'command')\n"
            "for argv in [['--help']] + [[name, '--help'] for name in sub.choices]:\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'numba', 'transformers', 'scipy', 'transformer_lens') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"
