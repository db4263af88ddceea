"""Figures keep their whole title: the eval report's sweep title was clipped by tight_layout alone."""
from __future__ import annotations

import numpy as np

from headsurgeon.surgery.measure.plots import pyplot, save_figure


def test_a_long_suptitle_is_inside_the_saved_figure(tmp_path):
    from PIL import Image

    fig, ax = pyplot().subplots(figsize=(3, 2), dpi=100)
    ax.plot([0, 1], [0, 1])
    fig.suptitle("SmolLM2-135M-Instruct: heads swapped for programs, on 24 test windows, a title longer than the axes")
    image = np.asarray(Image.open(save_figure(fig, tmp_path / "sweep.png")).convert("L"))
    assert image.shape[1] > 300, "the figure was not widened to hold its title"
    assert (image[:, :8] > 250).all() and (image[:, -8:] > 250).all(), "the title touches the figure's edge"
