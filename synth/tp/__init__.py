"""Learning Transformer Programs (Friedman, Wettig & Chen 2023)."""
