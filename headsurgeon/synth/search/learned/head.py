"""The discretized learned model of one head: match terms and positional terms, its DSL program, its hypothesis
text, and an independent torch evaluation of it."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ... import dsl
from ...program import Program
from ...sequence import Sequence, pad_ids
from .rows import key_order, positional_rows, select_rows, visible
from .space import FeatureSpace, feature_arrays


@dataclass
class MatchTerm:
    """A discretized match term: ``fallback(match(q=qf, k=kf, pairs, select), first())``."""

    q: int  # feature index (into FeatureSpace.names) read by the query
    k: int  # feature index read by the key
    table: np.ndarray  # bool [Vq + 1, Vk + 1] over local value indices ("other" row/column all False)
    select: str

    @property
    def n_pairs(self) -> int:
        """Matching (query value, key value) pairs."""
        return int(self.table.sum())

    def node(self, space: FeatureSpace) -> dsl.Node | None:
        """The DSL tree, or None when no pair is left (the term is then just ``first()``)."""
        qs, ks = np.nonzero(self.table)
        if qs.size == 0:
            return None
        pairs = [[space.dsl_value(self.q, int(a)), space.dsl_value(self.k, int(b))] for a, b in zip(qs, ks)]
        match = dsl.from_json({"match": {"q": space.names[self.q], "k": space.names[self.k], "pairs": pairs,
                                         "select": self.select}})
        return dsl.Fallback((match, dsl.Prim("first")))


def mixture_node(matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                  space: FeatureSpace) -> dsl.Node:
    """A weighted mixture as a DSL tree (a single term is not wrapped in a mix)."""
    terms: list[tuple[float, dsl.Node]] = []
    for w, term in matches:
        node = term.node(space)
        terms.append((w, node if node is not None else dsl.Prim("first")))
    terms += [(w, dsl.parse(text)) for w, text in positional]
    if not terms:
        return dsl.Prim("first")
    if len(terms) == 1:
        return terms[0][1]
    return dsl.Mix(tuple((float(w), node) for w, node in terms))


@dataclass
class LearnedHead:
    """One head's discretized learned model: weighted match terms and positional terms, and its DSL program.

    With ``gate`` (a flag name) the program is ``gate(FLAG, A, B)``: queries with the flag use the mixture
    (``matches``, ``positional``), the others (``other_matches``, ``other_positional``).
    """

    space: FeatureSpace
    causal: bool
    matches: list[tuple[float, MatchTerm]]
    positional: list[tuple[float, str]]
    gate: str | None = None
    other_matches: list[tuple[float, MatchTerm]] = field(default_factory=list)
    other_positional: list[tuple[float, str]] = field(default_factory=list)
    loss: float = float("nan")  # refit loss of the discretized model on the synth rows
    history: list[float] = field(default_factory=list, repr=False)

    def node(self) -> dsl.Node:
        """The program as a DSL tree."""
        a = mixture_node(self.matches, self.positional, self.space)
        if self.gate is None:
            return a
        return dsl.Gate(dsl.Pred("flag", self.gate), a, mixture_node(self.other_matches, self.other_positional,
                                                                       self.space))

    @property
    def program(self) -> Program:
        """The program as a :class:`Program`."""
        return Program.from_node(self.node())

    def match_programs(self) -> list[Program]:
        """Each non-empty match term on its own (``fallback(match(...), first())``)."""
        out: dict[str, Program] = {}
        for _, term in self.matches + self.other_matches:
            node = term.node(self.space)
            if node is not None:
                prog = Program.from_node(node)
                out.setdefault(prog.hash, prog)
        return list(out.values())

    def _describe_mixture(self, matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                          tokens: dict[int, str] | None, max_pairs: int) -> str:
        parts = []
        for w, term in matches:
            qn, kn = self.space.names[term.q], self.space.names[term.k]
            qs, ks = np.nonzero(term.table)
            if qs.size == 0:
                continue
            describe = self.space.describe
            shown = ", ".join(f"{describe(term.q, int(a), tokens)}->{describe(term.k, int(b), tokens)}"
                              for a, b in list(zip(qs, ks))[:max_pairs])
            more = f" +{qs.size - max_pairs} more" if qs.size > max_pairs else ""
            what = "the closest key" if term.select == "closest" else "every key"
            parts.append(f"{w:.2f}: {what} with query {qn} x key {kn} in {{{shown}{more}}} (else BOS)")
        pos = sorted(positional, key=lambda t: -t[0])[:4]
        if pos:
            parts.append("positional " + ", ".join(f"{text} {w:.2f}" for w, text in pos))
        return "; ".join(parts) if parts else "BOS only"

    def hypothesis(self, tokens: dict[int, str] | None = None, max_pairs: int = 4) -> str:
        """A short text describing the predicate(s) and the positional mix."""
        a = self._describe_mixture(self.matches, self.positional, tokens, max_pairs)
        if self.gate is None:
            return "learned predicate: " + a
        b = self._describe_mixture(self.other_matches, self.other_positional, tokens, max_pairs)
        return f"learned predicate: queries with {self.gate}: {a} | other queries: {b}"

    def torch_patterns(self, sequences: list[Sequence], arrays: dict[str, np.ndarray] | None = None) -> torch.Tensor:
        """The discretized model evaluated with torch (float64 [B, N, N]), independently of the DSL kernels."""
        ids, lengths = pad_ids(sequences)
        names = list(self.space.names) + ([self.gate] if self.gate else [])
        if arrays is None or any(n not in arrays for n in names):
            arrays = {**(arrays or {}), **feature_arrays(sequences, names)}
        slots = torch.from_numpy(self.space.encode(arrays))
        lens = torch.from_numpy(lengths)
        out = self._mixture_torch(self.matches, self.positional, slots, lens, ids.shape[1])
        if self.gate is not None:
            other = self._mixture_torch(self.other_matches, self.other_positional, slots, lens, ids.shape[1])
            flag = torch.from_numpy(arrays[self.gate] == 1)
            out = torch.where(flag[..., None], out, other)
        return out

    def _mixture_torch(self, matches: list[tuple[float, MatchTerm]], positional: list[tuple[float, str]],
                       slots: torch.Tensor, lens: torch.Tensor, n: int) -> torch.Tensor:
        vis = visible(lens, n, self.causal)
        perm = key_order(n)
        offs = self.space.offsets
        num = torch.zeros(lens.shape[0], n, n, dtype=torch.float64)
        den = torch.zeros(lens.shape[0], n, dtype=torch.float64)
        for w, term in matches:
            table = torch.from_numpy(term.table)
            qv = slots[term.q] - offs[term.q]
            kv = slots[term.k] - offs[term.k]
            m = table[qv[:, :, None], kv[:, None, :]] & vis
            num += w * select_rows(m.double(), term.select, perm, hard=True) * vis
            den += w * vis.any(-1).double()
        if positional:
            comps, nonempty = positional_rows([t for _, t in positional], lens, n, self.causal)
            ws = torch.tensor([w for w, _ in positional], dtype=torch.float64)
            num += torch.einsum("t,tbij->bij", ws, comps)
            den += torch.einsum("t,tbi->bi", ws, nonempty)
        out = num / den.clamp_min(1e-300)[..., None]
        inside = torch.arange(n)[None, :] < lens[:, None]
        out[..., 0] += ((den <= 0) & inside).double()
        return out * inside[..., None]
