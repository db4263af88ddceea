"""Decompile a ``DiscreteProgram`` into a standalone, readable Python module (no imports at all).

The module defines ``run(tokens) -> list[str]`` (one label per input token; ``tokens`` starts with BOS),
``LABELS``, the RASP-style helpers ``select_closest`` / ``aggregate`` / ``select`` / ``aggregate_sum``,
one ``predicate_{l}_{h}`` per head written as an if-chain over query values, one function per MLP written
as a lookup (if-chains grouped by output, the most common output as the fallback; a numerical MLP whose
inputs range too widely for a table is written as its float64 ReLU network), and the classifier weights
per variable value. It reproduces ``DiscreteProgram.predict`` exactly: the same tie-breaks, and the
logits are summed in float64 in the same order.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from .discrete import CatHead, DiscreteProgram, MLPTable, NumHead, numeric_mlp

MAX_TABLE = 4096
"""Numerical MLPs with more input combinations than this are written as their network, not a table."""

_HELPERS = '''

def closeness(i, j):
    """Rank of key j for query i: nearest first, left before right at equal distance, the query itself last."""
    if i == j:
        return float("inf")
    return 2 * abs(i - j) - (1 if j < i else 0)


def select_closest(keys, queries, predicate):
    """For each query i: the closest key j (j <= i when CAUSAL) with predicate(query, key); 0 (BOS) if none."""
    selected = []
    for i, q in enumerate(queries):
        visible = range(i + 1) if CAUSAL else range(len(keys))
        matches = [j for j in visible if predicate(q, keys[j])]
        selected.append(min(matches, key=lambda j: closeness(i, j)) if matches else 0)
    return selected


def aggregate(selected, values):
    """The value at each query's selected key."""
    return [values[j] for j in selected]


def select(keys, queries, predicate):
    """For each query i: every key j (j <= i when CAUSAL) with predicate(query, key)."""
    selected = []
    for i, q in enumerate(queries):
        visible = range(i + 1) if CAUSAL else range(len(keys))
        selected.append([j for j in visible if predicate(q, keys[j])])
    return selected


def aggregate_sum(selected, values):
    """The sum of the values at each query's selected keys (a count when every value is 1)."""
    return [sum(values[j] for j in keys) for keys in selected]


def relu_network(weights, a, b):
    """A numerical MLP in float64, unit by unit: the index of the largest output (first on ties)."""
    w_a, w_b, b_in, w_out, b_out = weights
    out = list(b_out)
    for j in range(len(w_a)):
        h = w_a[j] * a + w_b[j] * b + b_in[j]
        h = h if h > 0.0 else 0.0
        for c in range(len(out)):
            out[c] = out[c] + h * w_out[j][c]
    best = 0
    for c in range(1, len(out)):
        if out[c] > out[best]:
            best = c
    return best


def classify(categorical, numerical):
    """Per position: logits = sum of the weight rows of its variable values; the label of the first maximum."""
    out = []
    for i in range(len(categorical[0][1])):
        logits = [0.0] * len(LABELS)
        for name, values in categorical:
            row = CLASSIFIER[name][values[i]]
            for c in range(len(LABELS)):
                logits[c] = logits[c] + row[c]
        for name, values in numerical:
            row = NUM_CLASSIFIER[name]
            for c in range(len(LABELS)):
                logits[c] = logits[c] + values[i] * row[c]
        best = None
        for c in range(len(LABELS)):
            if c in MASKED_LABELS:
                continue
            if best is None or logits[c] > logits[best]:
                best = c
        out.append(LABELS[best])
    return out
'''


def _arg(var: str) -> str:
    """Readable singular argument name for a variable: ``tokens`` -> ``token``, ``attn_0_1_outputs`` -> ``attn_0_1_output``."""
    return var[:-1] if var.endswith("s") else var


def _lit(value) -> str:
    return repr(value)


def _set(values) -> str:
    return "{" + ", ".join(_lit(v) for v in values) + "}"


def _predicate(prog: DiscreteProgram, head: CatHead | NumHead, fname: str) -> list[str]:
    qa, ka = _arg(head.q), _arg(head.k)
    if qa == ka:
        qa, ka = f"q_{qa}", f"k_{ka}"
    q_labels = prog.value_labels[head.q]
    k_labels = prog.value_labels[head.k]
    groups: dict[object, list] = defaultdict(list)
    never: list = []
    for a, target in enumerate(head.pred):
        if q_labels[a] is None:
            continue
        if k_labels[target] is None:
            never.append(q_labels[a])
        else:
            groups[k_labels[target]].append(q_labels[a])
    lines = [f"def {fname}({qa}, {ka}):"]
    for i, (key_value, qs) in enumerate(groups.items()):
        lines.append(f"    {'if' if i == 0 else 'elif'} {qa} in {_set(qs)}:")
        lines.append(f"        return {ka} == {_lit(key_value)}")
    if never:
        lines.append(f"    # query values {_set(never)} accept a key value that never occurs")
    lines.append("    return False")
    return lines


def _num_range(prog: DiscreteProgram, var: str) -> list[int]:
    return [1] if var == "ones" else list(range(prog.num_bounds[var] + 1))


def _mlp_network(mt: MLPTable, args: list[str]) -> list[str]:
    w = mt.network
    const = f"{mt.name.upper()}_WEIGHTS"
    rows = ", ".join("[" + ", ".join(repr(float(x)) for x in row) + "]" for row in w["w_out"])
    lines = [
        f"{const} = (",
        f"    {[float(x) for x in w['w_a']]!r},",
        f"    {[float(x) for x in w['w_b']]!r},",
        f"    {[float(x) for x in w['b_in']]!r},",
        f"    [{rows}],",
        f"    {[float(x) for x in w['b_out']]!r},",
        ")",
        "",
        "",
        f"def {mt.name}({', '.join(args)}):",
        "    # inputs range too widely for a table: the trained ReLU network, exactly",
        f"    return relu_network({const}, {args[0]}, {args[-1]})",
    ]
    return lines


def _mlp(prog: DiscreteProgram, mt: MLPTable) -> list[str]:
    same = mt.a == mt.b
    if same:
        args = [_arg(mt.a)]
    else:
        args = [f"{_arg(mt.a)}_a", f"{_arg(mt.b)}_b"] if _arg(mt.a) == _arg(mt.b) else [_arg(mt.a), _arg(mt.b)]
    entries: list[tuple[Any, Any]] = []  # (key literal, output)
    if mt.numeric:
        ra, rb = _num_range(prog, mt.a), _num_range(prog, mt.b)
        if (len(ra) if same else len(ra) * len(rb)) > MAX_TABLE:
            return _mlp_network(mt, args)
        if same:
            outs = numeric_mlp(mt.network, np.array(ra), np.array(ra)).tolist()
            entries = list(zip(ra, outs))
        else:
            ga, gb = np.meshgrid(ra, rb, indexing="ij")
            outs = numeric_mlp(mt.network, ga, gb).tolist()
            entries = [((va, vb), outs[i][j]) for i, va in enumerate(ra) for j, vb in enumerate(rb)]
    else:
        a_vals = [(i, lab) for i, lab in enumerate(prog.value_labels[mt.a]) if lab is not None]
        b_vals = [(i, lab) for i, lab in enumerate(prog.value_labels[mt.b]) if lab is not None]
        if same:
            entries = [(lab, mt.lookup[i][i]) for i, lab in a_vals]
        else:
            entries = [((la, lb), mt.lookup[i][j]) for i, la in a_vals for j, lb in b_vals]
    counts = Counter(out for _, out in entries)
    default = counts.most_common(1)[0][0] if counts else 0
    by_out: dict[int, list] = defaultdict(list)
    for key, out in entries:
        if out != default:
            by_out[out].append(key)
    lines = [f"def {mt.name}({', '.join(args)}):"]
    key_expr = args[0] if same else f"({', '.join(args)})"
    if by_out:
        lines.append(f"    key = {key_expr}")
    for i, out in enumerate(sorted(by_out)):
        lines.append(f"    {'if' if i == 0 else 'elif'} key in {_set(by_out[out])}:")
        lines.append(f"        return {out}")
    lines.append(f"    return {default}")
    return lines


def _classifier(prog: DiscreteProgram) -> list[str]:
    lines = ["CLASSIFIER = {"]
    for var in prog.cat_vars:
        lines.append(f"    {var!r}: {{")
        for i, lab in enumerate(prog.value_labels[var]):
            if lab is None:
                continue
            row = ", ".join(repr(float(w)) for w in prog.w_cat[var][i])
            lines.append(f"        {_lit(lab)}: [{row}],")
        lines.append("    },")
    lines.append("}")
    lines.append("NUM_CLASSIFIER = {")
    for var in prog.num_vars:
        row = ", ".join(repr(float(w)) for w in prog.w_num[var])
        lines.append(f"    {var!r}: [{row}],")
    lines.append("}")
    return lines


def decompile(prog: DiscreteProgram) -> str:
    """Python source of a standalone module that computes ``prog`` (see the module docstring)."""
    out: list[str] = [
        f'"""Transformer Program {prog.name!r}, decompiled by headsurgeon.tp (standalone; imports nothing).',
        "",
        f"run(tokens) takes the token strings, starting with {prog.vocab[1]!r} (BOS), at most {prog.n_ctx} of them,",
        "and returns one label per token (the label at BOS and other unscored positions is arbitrary).",
        f"Vocabulary: {prog.vocab[1:]!r}",
        '"""',
        "",
        f"LABELS = {prog.labels!r}",
        f"MASKED_LABELS = {set(prog.masked_labels)!r}",
        f"CAUSAL = {prog.causal!r}",
        f"N_CTX = {prog.n_ctx!r}",
    ]
    out += _HELPERS.rstrip("\n").split("\n")
    body: list[str] = []
    for l, layer in enumerate(prog.layers):
        out += ["", "", f"# {'=' * 30} layer {l} {'=' * 30}"]
        for h in layer["cat_heads"]:
            out += ["", ""] + _predicate(prog, h, f"predicate_{l}_{h.head}")
            body.append(
                f"    {h.name}_outputs = aggregate(select_closest({h.k}, {h.q}, predicate_{l}_{h.head}), {h.v})"
            )
        for h in layer["num_heads"]:
            out += ["", ""] + _predicate(prog, h, f"num_predicate_{l}_{h.head}")
            body.append(
                f"    {h.name}_outputs = aggregate_sum(select({h.k}, {h.q}, num_predicate_{l}_{h.head}), {h.v})"
            )
        for mt in layer["cat_mlps"] + layer["num_mlps"]:
            out += ["", ""] + _mlp(prog, mt)
            if mt.a == mt.b:
                body.append(f"    {mt.name}_outputs = [{mt.name}(a) for a in {mt.a}]")
            else:
                body.append(f"    {mt.name}_outputs = [{mt.name}(a, b) for a, b in zip({mt.a}, {mt.b})]")
    out += ["", ""] + _classifier(prog)
    out += [
        "",
        "",
        "def run(tokens):",
        '    """One label per token of ``tokens`` (a list of token strings starting with BOS)."""',
        "    if len(tokens) > N_CTX:",
        '        raise InputError(f"at most {N_CTX} tokens, got {len(tokens)}")',
        "    positions = list(range(len(tokens)))",
        "    ones = [1] * len(tokens)",
        *body,
        "    categorical = [",
        *[f"        ({v!r}, {v})," for v in prog.cat_vars],
        "    ]",
        "    numerical = [",
        *[f"        ({v!r}, {v})," for v in prog.num_vars],
        "    ]",
        "    return classify(categorical, numerical)",
        "",
    ]
    return "\n".join(out)


def load_module(source: str, name: str = "tp_program") -> dict:
    """Execute decompiled source in a fresh namespace and return it (``ns['run'](tokens)``)."""
    ns: dict = {"__name__": name}
    exec(compile(source, f"<{name}>", "exec"), ns)
    return ns
