"""Hybrid checkpoints, trust policy, Hugging Face Hub, and the embedded default model."""
