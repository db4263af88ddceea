"""Numba kernels that turn programs into attention tensors, normalization, and the tensor cache."""
