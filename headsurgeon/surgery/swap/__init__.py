"""Swapping heads: program heads in a hybrid model, their pattern sources, fused attention, healing, refits."""
