"""A base model or a hybrid as an lm-evaluation-harness ``LM`` (lm-eval's TemplateLM does the request logic).

headsurgeon/harness.py registers it with lm-eval as the model ``headsurgeon`` (adding ``checkpoint=DIR``, which
needs the hub layer) and runs lm-eval's own command line; headsurgeon/surgery/measure/downstream.py uses it directly.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ...core import InputError

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.models.utils import Collator
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("downstream evaluation needs lm-evaluation-harness: pip install 'headsurgeon[eval]' "
                      f"(or pip install lm-eval); importing it failed: {e}") from e

from tqdm.auto import tqdm

from ...synth.programset import ProgramMap, ProgramSet
from ...synth.trust import LM_EVAL_FLAG, trust_value, TrustPrograms
from .scorable import require_lm_head
from ..models.loading import load_model
from ..swap.hybrid import HybridModel
from ..swap.replace import replace_heads

__all__ = ["HeadsurgeonLM", "model_flag"]


def model_flag(value: Any) -> bool | frozenset[str]:
    """``trust_programs`` from lm-eval's model args: True/False, "true"/"false", or program hashes (headsurgeon/synth/trust.py)."""
    return trust_value(value)


class HeadsurgeonLM(TemplateLM):
    """A headsurgeon ModelHandle or HybridModel scored through lm-eval's TemplateLM (causal models only)."""

    def __init__(self, model: Any = "tiny-stories", tokenizer: Any = None,
                 programs: ProgramSet | ProgramMap | str | Path | None = None,
                 which: str = "replacement", trust_programs: TrustPrograms = False,
                 device: str | None = None, batch_size: Any = 16, max_batch_size: Any = None,
                 max_length: Any = None, max_gen_toks: Any = 256, seed: Any = 0, **unused: Any) -> None:
        super().__init__()
        if isinstance(model, HybridModel):
            self.handle, self.model = model.handle, model
        else:
            if device and str(device).startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"  # lm-eval's command line defaults to cuda
            self.handle = load_model(model if model is not None else "tiny-stories", tokenizer=tokenizer,
                                     device=device or "cpu")
            self.model = self.handle
        require_lm_head(self.handle)
        if programs is not None:
            if isinstance(self.model, HybridModel):
                raise InputError("pass either a HybridModel or programs, not both")
            if isinstance(programs, (str, Path)):
                programs = ProgramSet.load(programs)
            if isinstance(programs, ProgramSet):  # the one trust gate (headsurgeon/synth/trust.py), every slot of every head
                programs = programs.trusted(model_flag(trust_programs), flag=LM_EVAL_FLAG)
            self.model = replace_heads(self.handle, programs, which=which)
        self.tokenizer = self.handle.tokenizer
        self.batch_size = 16 if str(batch_size).startswith("auto") else int(batch_size)
        self._max_length = int(max_length) if max_length is not None else int(self.handle.n_ctx)
        self.max_gen_toks = int(max_gen_toks)
        self._generator = torch.Generator().manual_seed(int(seed))

    # ------------------------------------------------------------ what TemplateLM needs
    @property
    def eot_token_id(self) -> int:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return int(eos if eos is not None else self.handle.bos_id if self.handle.bos_id is not None else 0)

    @property
    def prefix_token_id(self) -> int:
        return int(self.handle.bos_id) if self.handle.bos_id is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return self.handle.device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.handle.name).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``; BOS first when the model expects one, unless ``add_special_tokens=False``."""
        ids = list(self.tokenizer.encode(string, add_special_tokens=False))
        bos = self.handle.bos_id
        if add_special_tokens is not False and self.handle.prepend_bos and bos is not None and ids[:1] != [bos]:
            ids = [bos] + ids
        return ids

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor:
        """log-softmax [B, N, vocab] for right-padded rows (programs see each row's real tokens only)."""
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, r in enumerate(rows):
            ids[b, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[b, : len(r)] = 1
        with torch.no_grad():
            logits = self.model(ids, attention_mask=mask)
        return F.log_softmax(logits.float(), dim=-1).cpu()

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False,
                              override_bs: int | None = None, **kwargs: Any) -> list[tuple[float, bool]]:
        """(log P(continuation | context), greedy?) per request; contexts are cut on the left to the window."""
        def order(req: tuple[Any, list[int], list[int]]) -> tuple[int, tuple[int, ...]]:
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        collator = Collator(requests, sort_fn=order, group_by=None)
        results: list[tuple[float, bool]] = []
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="headsurgeon loglikelihood")
        for chunk in collator.get_batched(n=override_bs or self.batch_size):
            rows, conts = [], []
            for _, context, continuation in chunk:
                if not continuation:
                    raise InputError("lm-eval asked for the likelihood of an empty continuation")
                if len(continuation) > self.max_length:
                    raise InputError(f"a continuation of {len(continuation)} tokens does not fit the model's "
                                     f"{self.max_length}-token window")
                rows.append((context + continuation)[-(self.max_length + 1):][:-1])
                conts.append(continuation)
            logprobs = self._logprobs(rows)
            for b, ((key, _, _), row, cont) in enumerate(zip(chunk, rows, conts)):
                lp = logprobs[b, len(row) - len(cont): len(row)]
                target = torch.tensor(cont, dtype=torch.long)
                answer = (float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all()))
                results.append(answer)
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
            bar.update(len(chunk))
        bar.close()
        return collator.get_original(results)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each text, in disjoint windows of the model's context (lm-eval's rolling windows)."""
        windows, owners = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            pieces = map(make_disjoint_window, get_rolling_token_windows(
                token_list=self.tok_encode(string, add_special_tokens=False), prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length, context_len=1))
            for context, continuation in pieces:
                windows.append((None, context, continuation))
                owners.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owners, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled) continuations, batched and right-padded, full recompute per token, cut at ``until``."""
        collator = Collator([req.args for req in requests], sort_fn=lambda x: (-len(self.tok_encode(x[0])), x[0]),
                            group_fn=lambda x: x[1], group_by="gen_kwargs")
        results: list[str] = []
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="headsurgeon generate_until")
        for chunk in collator.get_batched(n=self.batch_size):
            kwargs = dict(chunk[0][1] or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            if not kwargs.pop("do_sample", temperature > 0):
                temperature = 0.0
            keep = max(1, self.max_length - max_new)
            for (context, _), text in zip(chunk, self._generate([self.tok_encode(c)[-keep:] for c, _ in chunk],
                                                                  until, max_new, temperature)):
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, chunk[0][1]), text)
            bar.update(len(chunk))
        bar.close()
        return collator.get_original(results)

    def _generate(self, prompts: list[list[int]], until: list[str], max_new: int, temperature: float) -> list[str]:
        """Token-by-token continuation of each prompt until a stop string, EOS or ``max_new`` tokens."""
        new: list[list[int]] = [[] for _ in prompts]
        texts = [""] * len(prompts)
        active = list(range(len(prompts)))
        for _ in range(max_new):
            if not active:
                break
            rows = [(prompts[i] + new[i])[-self.max_length:] for i in active]
            logprobs = self._logprobs(rows)
            last = torch.stack([logprobs[b, len(r) - 1] for b, r in enumerate(rows)])
            if temperature > 0:
                picks = torch.multinomial(torch.softmax(last / temperature, -1), 1, generator=self._generator)[:, 0]
            else:
                picks = last.argmax(-1)
            still = []
            for i, tok in zip(active, picks.tolist()):
                if tok == self.eot_token_id:
                    continue
                new[i].append(tok)
                texts[i] = self.tok_decode(new[i])
                if any(s and s in texts[i] for s in until):
                    continue
                still.append(i)
            active = still
        return [min((t.split(s)[0] for s in until if s), key=len, default=t) for t in texts]

