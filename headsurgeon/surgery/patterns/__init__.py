"""Capturing attention patterns (and value norms) over a corpus into a resumable, bounded store."""
