"""Hybrid checkpoints: save a HybridModel to a directory (or Hub repo layout) and load it back bit-for-bit.

Layout::

    manifest.json          format + version, base model reference or "embedded", config facts,
                           head -> program map (alpha, file, kind, hash), metrics, library versions,
                           sha256 + size of every other file
    programs/<id>.json     DSL programs (safe by construction: loaded freely)
    programs/<id>.py       Python programs (loaded only when trusted; never executed on load)
    model.safetensors      only when the weights differ from the base (e.g. after healing fine-tuning),
    config.json, tokenizer files   ... together with the config and tokenizer so it reloads without the base
    README.md              model card (metrics table + the three lines that load it)

A program file's suffix is its backend's (``headsurgeon.synth.backends``). Saves are atomic (folder.py);
loading treats the folder as untrusted (files.py, SECURITY.md). No pickle anywhere: weights are
safetensors, everything else is JSON or text. Modules, bottom up: errors, layout, location, files,
manifest, weights, base_models, embedded, programs, folder, save, load.
"""
from __future__ import annotations

from .errors import (BaseModelError, CheckpointError, FormatVersionError, IntegrityError, NotACheckpointError,
                     UntrustedProgramError)
from .layout import FORMAT, FORMAT_VERSION
from .load import load_hybrid
from .manifest import read_manifest
from .save import save_hybrid
from .weights import hf_state_dict, weights_fingerprint

__all__ = [
    "save_hybrid", "load_hybrid", "read_manifest", "CheckpointError", "NotACheckpointError", "IntegrityError",
    "FormatVersionError", "BaseModelError", "UntrustedProgramError", "FORMAT", "FORMAT_VERSION",
    "hf_state_dict", "weights_fingerprint",
]
