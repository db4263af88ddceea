"""Everything that touches a live model: loading, capture, program heads, ablations, evaluation."""
