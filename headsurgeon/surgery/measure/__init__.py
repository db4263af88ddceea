"""Measuring what a swap costs: perplexity, KL, sweeps, downstream tasks, ablations, head finders, plots."""
