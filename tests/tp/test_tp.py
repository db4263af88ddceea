"""Learning Transformer Programs (headsurgeon/tp): task data, training, discretization, decompilation, CLI, export.

Everything trains tiny configurations (hist with one layer, a 2,000-sample dataset, a few hundred
steps) so the file runs in well under a minute of CPU; the paper-scale runs live in benchmarks/tp.py.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from headsurgeon.tp import tasks as T
from headsurgeon.tp.decompile import decompile, load_module
from headsurgeon.tp.discrete import DiscreteProgram, closeness_np, discretize
from headsurgeon.tp.model import ModelConfig, TransformerProgram, closeness, position_bias
from headsurgeon.tp.train import (
    PAPER_ACCURACY,
    TASK_CONFIGS,
    TrainConfig,
    accuracy,
    default_configs,
    tau_schedule,
    train,
)


# ------------------------------------------------------------------------------------------ data
def _ref_dyck(sent: list[str]) -> list[str]:
    """Independent Dyck reference: reduce matched pairs by string rewriting; T if nothing is left, P if
    only openers are left, F otherwise (a prefix stays invalid once a closer is left unmatched)."""
    out = []
    for i in range(1, len(sent) + 1):
        s = "".join(sent[:i])
        while "()" in s or "{}" in s:
            s = s.replace("()", "").replace("{}", "")
        out.append("T" if not s else ("P" if re.fullmatch(r"[({]*", s) else "F"))
    return out


def _ref_labels(task: str, sent: list[str]) -> list[str]:
    """The label of every position computed from the task definition, independently of tasks.py."""
    body = sent[1:-1] if task in ("reverse", "sort") else sent[1:]
    counts = Counter(body)
    if task == "reverse":
        return ["<pad>", *body[::-1], "<pad>"]
    if task == "sort":
        return ["<pad>", *sorted(body, key=int), "<pad>"]
    if task == "hist":
        return ["<pad>", *(str(counts[c]) for c in body)]
    if task == "double_hist":
        return ["<pad>", *(str(sum(1 for d in counts if counts[d] == counts[c])) for c in body)]
    if task == "most_freq":
        order = sorted(counts, key=lambda c: (-counts[c], body.index(c)))
        return ["<pad>", *order, *(["<s>"] * (len(body) - len(order)))]
    if task in ("dyck1", "dyck2"):
        return ["<pad>", *_ref_dyck(body)]
    if task == "induction":
        labels = ["<pad>"]
        for i, c in enumerate(sent[1:], start=1):
            if c.isalpha():
                prev = [j for j in range(1, i) if sent[j] == c]
                labels.append(sent[prev[0] + 1] if prev else "<unk>")
            else:
                labels.append("<pad>")
        return labels
    raise AssertionError(task)


@pytest.mark.parametrize("task", T.TASKS)
def test_task_conventions_and_labels(task):
    data = T.make_task(task, size=600, seed=3)
    n_sym = {"reverse": 5, "sort": 5, "hist": 6, "double_hist": 6, "most_freq": 6}.get(task)
    for split in ("train", "val", "test"):
        for sent, tags in data.raw[split]:
            assert sent[0] == "<s>" and len(sent) == len(tags) <= data.max_len
            assert tags == _ref_labels(task, sent), (sent, tags)
            if task in ("reverse", "sort"):
                assert sent[-1] == "</s>" and 1 <= len(sent) - 2 <= 6
            elif n_sym is not None:
                assert 1 <= len(sent) - 1 <= 7
            if task in ("dyck1", "dyck2"):
                assert len(sent) == 16
                assert set(sent[1:]) <= set("()" if task == "dyck1" else "(){}")
    symbols = {c for s, _ in data.raw["train"] for c in s[1:] if c not in ("</s>",)}
    if n_sym is not None:
        assert symbols == {str(i) for i in range(n_sym)}
    # the padded arrays encode exactly the raw samples
    for split in ("train", "test"):
        arr = getattr(data, split)
        for row, (sent, tags) in zip(arr.x, data.raw[split]):
            assert data.decode(row) == sent
    assert data.causal == (task in ("dyck1", "dyck2", "induction"))


def test_dyck_has_all_three_labels_and_reference_agrees_on_edge_cases():
    assert _ref_dyck(list("(){")) == T.dyck_labels(list("(){")) == ["P", "T", "P"]
    assert T.dyck_labels(list("({)}")) == ["P", "P", "F", "F"] == _ref_dyck(list("({)}"))
    assert T.dyck_labels(list(")(")) == ["F", "F"]
    data = T.make_task("dyck2", size=2000, seed=0)
    counts = Counter(t for _, tags in data.raw["train"] for t in tags[1:])
    assert set(counts) == {"P", "T", "F"} and min(counts.values()) > 100


def test_split_sizes_uniqueness_and_reproducibility():
    a = T.make_task("hist", seed=0)
    assert (len(a.train), len(a.val), len(a.test)) == (16_200, 1_800, 2_000)
    keys = [tuple(s) for split in ("train", "val", "test") for s, _ in a.raw[split]]
    assert len(set(keys)) == len(keys) == 20_000
    b = T.make_task("hist", size=2000, seed=0)
    c = T.make_task("hist", size=2000, seed=1)
    assert np.array_equal(T.make_task("hist", size=2000, seed=0).train.x, b.train.x)
    assert np.array_equal(T.make_task("hist", size=2000, seed=0).test.y, b.test.y)
    assert not np.array_equal(b.train.x, c.train.x)
    assert T.split_sizes(20_000) == (16_200, 1_800, 2_000)
    # reverse has only 5 + 25 + ... + 5**6 = 19,530 distinct inputs: with a bounded number of draws the
    # dataset comes out smaller, still unique and split in the same proportions
    r = T.make_task("reverse", size=20_000, seed=0, oversample=1)
    n = len(r.train) + len(r.val) + len(r.test)
    assert 5_000 < n < 19_530 and (len(r.train), len(r.val), len(r.test)) == T.split_sizes(n)
    assert len({tuple(s) for split in ("train", "val", "test") for s, _ in r.raw[split]}) == n


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        T.make_task("nope")


# ------------------------------------------------------------------------------------------ model pieces
def test_closeness_order_and_bias_agree():
    for n in (1, 5, 8, 16):
        rank = closeness(n).numpy()
        assert np.array_equal(rank, closeness_np(n))
        bias = position_bias(n).numpy()
        for i in range(n):
            order_rank = sorted(range(n), key=lambda j: rank[i, j])
            order_bias = sorted(range(n), key=lambda j: -bias[i, j])
            assert order_rank == order_bias
            assert len(set(rank[i])) == n  # no ties
            if n > 1:
                assert order_rank[-1] == i  # the query itself ranks last
                assert order_rank[0] == (i - 1 if i > 0 else i + 1)  # left neighbour first
        assert bias.min() >= -2.0 and bias.max() < 0.0


def test_tau_schedule_is_geometric():
    taus = [tau_schedule(s, 101, 3.0, 0.01) for s in range(101)]
    assert taus[0] == pytest.approx(3.0) and taus[-1] == pytest.approx(0.01)
    ratios = np.array(taus[1:]) / np.array(taus[:-1])
    assert np.allclose(ratios, ratios[0])


def test_model_config_errors_and_shapes():
    with pytest.raises(ValueError, match="does not fit d_var"):
        ModelConfig(n_tokens=9, n_labels=3, n_ctx=8, d_var=8)
    cfg = ModelConfig(n_tokens=8, n_labels=5, n_ctx=8, d_var=8, n_layers=2, n_heads_cat=2, n_heads_num=1,
                      n_cat_mlps=1, n_num_mlps=1)
    assert cfg.cat_var_names()[:2] == ["tokens", "positions"] and len(cfg.cat_var_names()) == 2 + 2 * 4
    model = TransformerProgram(cfg)
    ids = torch.tensor([[1, 3, 4, 0, 0], [1, 2, 2, 2, 5]])
    soft = model(ids, tau=1.0)
    hard = model(ids, hard=True)
    assert soft.shape == hard.shape == (2, 5, 5)
    assert torch.isfinite(soft[..., 1:]).all() and (hard[..., 0] < -1e29).all()  # PAD label masked
    loss = soft.log_softmax(-1)[..., 1].mean()
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert model.layers[1].num_attn.v.logits.shape == (1, 2)  # V gate over ones + layer-0 head
    counting = TransformerProgram(ModelConfig(**{**cfg.to_dict(), "num_value_gate": False}))
    assert all(layer.num_attn.v is None for layer in counting.layers)
    with pytest.raises(ValueError, match="exceeds n_ctx"):
        model(torch.ones(1, 9, dtype=torch.long))


def test_default_configs_follow_table1():
    shape, tc = default_configs("sort")
    assert shape == {k: v for k, v in TASK_CONFIGS["sort"].items() if k != "source"}
    assert (tc.lr, tc.batch_size, tc.epochs) == (5e-2, 512, 250)
    assert (tc.tau_init, tc.tau_end) == (3.0, 0.01)
    # Table 1 heads / MLPs columns are categorical + numerical
    table1 = {"reverse": (3, 8, 2), "hist": (1, 4, 2), "double_hist": (3, 8, 2), "sort": (3, 8, 4),
              "most_freq": (3, 8, 4), "dyck1": (3, 8, 2), "dyck2": (3, 4, 4)}
    for task, (layers, heads, mlps) in table1.items():
        c = TASK_CONFIGS[task]
        assert (c["n_layers"], c["n_heads_cat"] + c["n_heads_num"], c["n_cat_mlps"] + c["n_num_mlps"]) == (
            layers, heads, mlps)
        assert task in PAPER_ACCURACY
        # one model for every task: shapes differ, the mechanism does not; each shape names its source
        assert set(c) == {"n_layers", "n_heads_cat", "n_heads_num", "n_cat_mlps", "n_num_mlps", "source"}
        assert f"programs/rasp/{task}/{task}.py" in c["source"] and "recipe:" in c["source"]
        assert ModelConfig(8, 8, 8, 8, **default_configs(task)[0]).num_value_gate
    with pytest.raises(ValueError, match="unknown config fields"):
        default_configs("hist", n_heads=3)


# ------------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def tiny_hist():
    """hist, one layer (its Table 1 shape), 2,000 samples, batch 128, 12 epochs: ~200 steps."""
    torch.set_num_threads(1)
    data = T.make_task("hist", size=2000, seed=0)
    tc = TrainConfig(task="hist", seed=0, dataset_size=2000, epochs=12, batch_size=128, eval_every=0)
    return train(data, tc, progress=False)


def test_tiny_hist_learns(tiny_hist):
    m = tiny_hist.metrics
    y = tiny_hist.data.test.y
    majority = Counter(y[y != 0].tolist()).most_common(1)[0][1] / (y != 0).sum()
    assert majority < 0.5
    assert m["test_acc"] > 0.85, m
    prog = discretize(tiny_hist.model, tiny_hist.data.vocab, tiny_hist.data.labels)
    assert m["test_acc"] == pytest.approx(accuracy(prog.predict(tiny_hist.data.test.x), y))
    assert m["torch_program_agreement"] > 0.999
    assert 0 < m["train_cpu_seconds"] and 0 < m["train_seconds"]


def test_discretized_numpy_program_equals_hard_torch_model(tiny_hist):
    data = tiny_hist.data
    prog = discretize(tiny_hist.model, data.vocab, data.labels, "hist")
    for split in (data.test, data.val):
        real = split.x != 0
        p_np = prog.predict(split.x)
        p_t = tiny_hist.model.predict(torch.from_numpy(split.x)).numpy()
        # same discrete choices; only float32 (torch) vs float64 (numeric MLPs in numpy) ties may differ
        assert (p_np[real] == p_t[real]).mean() > 0.999
    again = DiscreteProgram.from_json(json.loads(json.dumps(prog.to_json())))
    assert np.array_equal(again.predict(data.test.x), prog.predict(data.test.x))


def test_decompiled_program_reproduces_the_discretized_model_exactly(tiny_hist):
    data = tiny_hist.data
    prog = discretize(tiny_hist.model, data.vocab, data.labels, "hist")
    source = decompile(prog)
    tree = ast.parse(source)
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], "must import nothing"
    assert "torch" not in source and "numpy" not in source
    assert "def predicate_0_0(" in source and "select_closest(" in source and "CLASSIFIER = {" in source
    run = load_module(source)["run"]
    expected = prog.predict(data.test.x)
    for row, pred in zip(data.test.x, expected):
        tokens = data.decode(row)
        assert run(tokens) == [data.labels[i] for i in pred[: len(tokens)]], tokens
    # and its accuracy is the model's
    got = [[data.label_index[l] for l in run(data.decode(row))] for row in data.test.x]
    y = data.test.y
    correct = sum(g == t for row, yr in zip(got, y) for g, t in zip(row, yr[: len(row)]) if t != 0)
    assert correct / (y != 0).sum() == pytest.approx(tiny_hist.metrics["test_acc"])


@pytest.mark.smoke
def test_decompile_round_trip_on_a_causal_multilayer_model():
    """dyck1 with the full 3-layer shape (untrained-ish: 1 epoch): heads read derived variables, MLPs of
    both kinds, causal select; the decompiled program must still agree everywhere."""
    torch.set_num_threads(1)
    data = T.make_task("dyck1", size=300, seed=1)
    r = train(data, TrainConfig(task="dyck1", epochs=1, batch_size=128, eval_every=0), progress=False)
    prog = discretize(r.model, data.vocab, data.labels, "dyck1")
    run = load_module(decompile(prog))["run"]
    pred = prog.predict(data.test.x)
    for row, p in zip(data.test.x, pred):
        tokens = data.decode(row)
        assert run(tokens) == [data.labels[i] for i in p[: len(tokens)]]
    pytest.importorskip("headsurgeon.synth.program")
    from headsurgeon.tp.export import export_heads, head_patterns, to_sequences

    programs = export_heads(prog, include_numerical=True)
    assert any(name.startswith("attn_0_") for name in programs)  # layer 0 reads tokens/positions only
    expected = head_patterns(prog, data.test.x)
    seqs = to_sequences(data.test.x, data.vocab)
    for name, program in programs.items():
        assert np.array_equal(program.evaluate(seqs, causal=True), expected[name]), name


def test_numerical_mlp_network_form_is_exact():
    """A numerical MLP reading sums of counts (ranges too wide for a table) is decompiled as its float64
    network; predictions still agree exactly, and numerical heads sum their value variable."""
    torch.set_num_threads(1)
    data = T.make_task("hist", size=300, seed=2)
    r = train(data, TrainConfig(task="hist", epochs=1, batch_size=128, eval_every=0), progress=False,
              n_layers=2, n_heads_num=2, n_num_mlps=1)
    prog = discretize(r.model, data.vocab, data.labels, "hist")
    mt = prog.layers[1]["num_mlps"][0]
    head, other = prog.layers[1]["num_heads"]
    head.v, other.v = "num_attn_0_0_outputs", "num_attn_0_1_outputs"  # sums of counts: bounds n_ctx**2
    for h in (head, other):
        prog.num_bounds[f"{h.name}_outputs"] = prog.n_ctx * prog.num_bounds[h.v]
    mt.a, mt.b = f"{head.name}_outputs", f"{other.name}_outputs"  # 65 x 65 input pairs: no table
    source = decompile(prog)
    assert f"return relu_network({mt.name.upper()}_WEIGHTS" in source
    run = load_module(source)["run"]
    trace: dict = {}
    pred = prog.predict(data.test.x, trace=trace)
    for b, (row, p) in enumerate(zip(data.test.x, pred)):
        tokens = data.decode(row)
        assert run(tokens) == [data.labels[i] for i in p[: len(tokens)]]
        # independent check of the summing head: sum of layer-0 counts over the matching keys
        q, k, vals = trace[head.q][b], trace[head.k][b], trace[head.v][b]
        n = len(tokens)
        want = [sum(vals[j] for j in range(n) if head.pred[q[i]] == k[j]) for i in range(n)]
        assert trace[f"{head.name}_outputs"][b][:n].tolist() == want


def test_export_forms_compact_and_exact_chain(tiny_hist):
    """Both export forms: same-feature heads without a fixed point use DSL closest; others the chain that
    ranks the query itself last; a head with no possible key value is none()."""
    pytest.importorskip("headsurgeon.synth.program")
    from headsurgeon.tp.discrete import CatHead
    from headsurgeon.tp.export import head_patterns, head_program, to_sequences

    data = tiny_hist.data
    prog = discretize(tiny_hist.model, data.vocab, data.labels, "hist")
    k = prog.d_var
    heads = [
        CatHead(0, 0, "positions", "positions", "tokens", [(a + 1) % k for a in range(k)]),  # next position
        CatHead(0, 1, "tokens", "tokens", "tokens", list(range(k))),  # same token: self can match
    ]
    prog.layers[0]["cat_heads"] = heads
    x = data.test.x[:200]
    seqs = to_sequences(x, data.vocab)
    expected = head_patterns(prog, x)
    compact = head_program(prog, heads[0])
    chain = head_program(prog, heads[1])
    assert compact.text.startswith("match(") and "closest" in compact.text
    assert chain.text.startswith("fallback(") and "self()" in chain.text
    for name, p in (("attn_0_0", compact), ("attn_0_1", chain)):
        assert np.array_equal(p.evaluate(seqs, causal=False), expected[name]), name
    # the same-token head must pick another occurrence when there is one, else itself
    row = np.array([[1, 2, 3, 2, 0]])
    sel = head_patterns(prog, row)["attn_0_1"][0].argmax(-1)
    assert sel[:4].tolist() == [0, 3, 2, 1]
    assert str(head_program(prog, CatHead(0, 0, "positions", "tokens", "tokens", [0] * k))) == "none()"


# ------------------------------------------------------------------------------------------ run dirs & CLI
def _parser() -> argparse.ArgumentParser:
    from headsurgeon.cli.tp import register

    parser = argparse.ArgumentParser(prog="headsurgeon")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_safetensors_run_directory_round_trip(tiny_hist, tmp_path):
    from safetensors.torch import load_file

    from headsurgeon.tp.rundir import load_program, load_run, save_run

    out = save_run(tiny_hist, tmp_path / "run")
    names = sorted(p.name for p in out.iterdir())
    assert names == ["config.json", "metrics.json", "model.safetensors", "program.json", "program.py"]
    assert not any(p.suffix in (".pt", ".pth", ".pkl", ".bin") for p in out.iterdir())
    state = load_file(str(out / "model.safetensors"))
    ref = tiny_hist.model.state_dict()
    assert state.keys() == ref.keys() and all(torch.equal(state[k], ref[k]) for k in ref)
    run = load_run(out)
    x = torch.from_numpy(tiny_hist.data.test.x)
    assert torch.equal(run.model.predict(x), tiny_hist.model.predict(x))
    assert np.array_equal(load_program(out).predict(x.numpy()), run.discretize().predict(x.numpy()))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test_acc"] == tiny_hist.metrics["test_acc"] and len(metrics["history"]) == 12
    with pytest.raises(FileNotFoundError, match="run directory"):
        load_run(tmp_path / "nothing")


def test_cli_train_decompile_eval_and_help(tmp_path, capsys):
    parser = _parser()
    run_dir = tmp_path / "cli_run"
    args = parser.parse_args(["tp", "train", "hist", "--out", str(run_dir), "--epochs", "2", "--dataset-size", "400",
                              "--batch-size", "128", "--seed", "1", "--no-progress", "--threads", "1"])
    assert args.func(args) == 0
    assert "hist: test acc" in capsys.readouterr().out
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["task"] == "hist" and cfg["train"]["epochs"] == 2 and cfg["train"]["seed"] == 1
    assert cfg["model"]["n_layers"] == 1 and cfg["model"]["n_heads_cat"] == 2  # Table 1 default for hist
    (run_dir / "program.py").unlink()
    args = parser.parse_args(["tp", "decompile", str(run_dir)])
    assert args.func(args) == 0
    assert (run_dir / "program.py").exists() and "wrote" in capsys.readouterr().out
    ns = load_module((run_dir / "program.py").read_text())
    assert len(ns["run"](["<s>", "1", "1", "2"])) == 4
    args = parser.parse_args(["tp", "eval", str(run_dir), "--split", "val"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["split"] == "val"
    args = parser.parse_args(["tp", "failures", str(run_dir), "--split", "val", "--top", "2"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    wrong, n = re.match(r"(\d+) wrong of (\d+) scored", text).groups()
    assert int(wrong) / int(n) == pytest.approx(1 - out["acc"])  # the program's own errors, all grouped
    assert len([ln for ln in text.splitlines() if "wrong  counts=" in ln]) <= 2
    args = parser.parse_args(["tp", "train", "sort", "--layers", "1", "--heads-num", "0", "--epochs", "1",
                              "--dataset-size", "200", "--out", str(tmp_path / "s"), "--no-progress"])
    assert args.func(args) == 0
    assert json.loads((tmp_path / "s" / "config.json").read_text())["model"]["n_heads_num"] == 0
    for argv in (["tp", "--help"], ["tp", "train", "--help"], ["tp", "decompile", "--help"]):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 0
    assert "RUN_DIR" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["tp", "train", "not-a-task"])


# ------------------------------------------------------------------------------------------ export
def test_exported_dsl_programs_reproduce_head_attention(tiny_hist):
    pytest.importorskip("headsurgeon.synth.program")
    from headsurgeon.tp.export import export_heads, head_patterns, skipped_heads, to_sequences

    data = tiny_hist.data
    prog = discretize(tiny_hist.model, data.vocab, data.labels, "hist")
    programs = export_heads(prog, include_numerical=True)
    assert set(programs) | set(skipped_heads(prog, include_numerical=True)) == {
        h.name for h in prog.cat_heads() + prog.num_heads()}
    assert set(export_heads(prog)) <= {h.name for h in prog.cat_heads()}
    x = data.test.x[:300]
    seqs = to_sequences(x, data.vocab)
    assert [s.tokens for s in seqs[:5]] == [data.decode(r) for r in x[:5]]
    expected = head_patterns(prog, x)
    for name, program in programs.items():
        got = program.evaluate(seqs, causal=prog.causal)
        n = got.shape[1]
        assert np.array_equal(got, expected[name][:, :n, :n]), name
