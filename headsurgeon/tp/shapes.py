"""The paper's Table 1 model shape per task, where each comes from, and the accuracy the paper reports: plain data,
so the command line can print it without loading torch."""
from __future__ import annotations

__all__ = ["PAPER_ACCURACY", "TASK_CONFIGS"]

_RECIPE = (
    "recipe: princeton-nlp/TransformerPrograms scripts/rasp.sh (vocab_size 8, max_length 8, d_var 8, lr 5e-2, "
    "batch 512, 250 epochs, tau 3.0->0.01 geomspace, d_mlp 64, mlp_vars_in 2, count_only, selector_width 0, "
    "seed 0, unique 1)"
)
_DYCK_RECIPE = _RECIPE.replace("scripts/rasp.sh (vocab_size 8, max_length 8, d_var 8",
                               "scripts/dyck.sh (max_length 16, d_var 16")


def _shape(task: str, layers: int, heads: tuple[int, int], mlps: tuple[int, int], recipe: str = _RECIPE) -> dict:
    """A Table 1 shape with its provenance: the authors' published program for the task and the run recipe."""
    return dict(
        n_layers=layers, n_heads_cat=heads[0], n_heads_num=heads[1], n_cat_mlps=mlps[0], n_num_mlps=mlps[1],
        source=f"shape: princeton-nlp/TransformerPrograms programs/rasp/{task}/{task}.py ({layers} layers, "
        f"{heads[0]}+{heads[1]} heads, {mlps[0]}+{mlps[1]} MLPs per layer); {recipe}",
    )


TASK_CONFIGS: dict[str, dict] = {
    # One model for every task: numerical heads sum a gated numerical variable (headsurgeon/tp/model.py,
    # NumAttention); only the shape differs per task. ``source`` says where each shape and recipe comes from.
    "reverse": _shape("reverse", 3, (4, 4), (1, 1)),
    "hist": _shape("hist", 1, (2, 2), (1, 1)),
    "double_hist": _shape("double_hist", 3, (4, 4), (1, 1)),
    "sort": _shape("sort", 3, (4, 4), (2, 2)),
    "most_freq": _shape("most_freq", 3, (4, 4), (2, 2)),
    "dyck1": _shape("dyck1", 3, (4, 4), (1, 1), _DYCK_RECIPE),
    "dyck2": _shape("dyck2", 3, (2, 2), (2, 2), _DYCK_RECIPE),
    "induction": dict(n_layers=2, n_heads_cat=1, n_heads_num=0, n_cat_mlps=0, n_num_mlps=0,
                      source="shape: this repository's choice (not in the paper's Table 1)"),
}
"""Per-task default model shapes."""

PAPER_ACCURACY: dict[str, float] = {
    "reverse": 99.79,
    "hist": 100.0,
    "double_hist": 98.40,
    "sort": 99.83,
    "most_freq": 75.69,
    "dyck1": 99.30,
    "dyck2": 99.09,
}
"""Test accuracy (%) of the paper's Table 1."""
