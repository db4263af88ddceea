"""The text form: a lexer and recursive-descent parser (``parse``); the printer is headsurgeon/synth/dsl/printer.py.

``parse(to_text(t)) == t`` for every valid tree. The reader enforces the bounds of headsurgeon/synth/dsl/bounds.py as
it goes (literal sizes, list lengths, nesting, node count), so hostile text stops where it goes wrong;
primitive names and parameters come from the spec (headsurgeon/synth/dsl/spec.py). With a ``Vocabulary`` the text may
name tokens by their strings wherever ids go (headsurgeon/synth/dsl/tokens.py); double-quoted strings take JSON escapes.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ..errors import excerpt
from .bounds import (KINDS, MAX_CLASSES, MAX_DEPTH, MAX_IDS, MAX_LIST_DEPTH, MAX_LITERAL_CHARS, MAX_NODES, _Budget,
                     _check_text_size, _DEPTH_MESSAGE, _err, _make_pred)
from .build import _checked, _measure, make_mix, make_prim, make_sharpen, make_sum
from .nodes import Fallback, Gate, Mul, Node, Pred, Prim, is_node
from .printer import to_text
from .spec import PRIMITIVE_SPECS
from .tokens import Quoted, Tok, plain, resolve, token_ids
from ...core.vocabulary import TokenVocabulary

__all__ = ["parse", "to_text"]

_TOKEN_RE = re.compile(
    r"""(?:
        (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
      | (?P<str>"(?:[^"\\\n]|\\.)*"|'[^'\\]*')
      | (?P<op>[()\[\],=*+-])
    )""",
    re.VERBOSE,
)
_SPACE_RE = re.compile(r"\s*")
_LITERAL_NOUNS = {"num": "number", "name": "name", "str": "string"}


class _Lexer:
    """Tokens of DSL text, read on demand (so an error stops the work where it is found)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.ahead: list[tuple[str, Any, int]] = []

    def _scan(self) -> tuple[str, Any, int]:
        """The next token after ``pos`` (literals of at most MAX_LITERAL_CHARS characters)."""
        text = self.text
        space = _SPACE_RE.match(text, self.pos)
        assert space is not None  # \s* matches at every position, if only the empty string
        pos = space.end()
        if pos >= len(text):
            self.pos = pos
            return ("eof", None, len(text))
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise _err(f"unexpected character {text[pos]!r} at column {pos + 1} in {excerpt(text)}")
        kind = m.lastgroup
        assert kind is not None  # every alternative of _TOKEN_RE is a named group
        raw = m.group(kind)
        if kind != "op" and len(raw) > MAX_LITERAL_CHARS:
            raise _err(f"the {_LITERAL_NOUNS[kind]} at column {pos + 1} has {len(raw)} characters; at most "
                       f"{MAX_LITERAL_CHARS} are allowed (MAX_LITERAL_CHARS): write it shorter")
        if kind == "num":
            val: Any = int(raw) if raw.isdigit() else float(raw)
        elif kind == "str" and raw.startswith('"'):
            try:
                val = json.loads(raw, strict=False)
            except ValueError:
                raise _err(f"the string at column {pos + 1} has a bad escape; use JSON escapes such as \\\" "
                           "or \\u2581") from None
        elif kind == "str":
            val = raw[1:-1]
        else:
            val = raw
        self.pos = m.end()
        return (kind, val, pos)

    def peek(self, ahead: int = 0) -> tuple[str, Any, int]:
        while len(self.ahead) <= ahead:
            self.ahead.append(self._scan())
        return self.ahead[ahead]

    def next(self) -> tuple[str, Any, int]:
        tok = self.peek()
        self.ahead.pop(0)
        return tok

    def expect(self, op: str) -> None:
        kind, val, col = self.next()
        if kind != "op" or val != op:
            shown = "end of input" if kind == "eof" else repr(val)
            raise _err(f"expected {op!r} at column {col + 1}, found {shown} in {excerpt(self.text)}")

    def at_op(self, op: str, ahead: int = 0) -> bool:
        kind, val, _ = self.peek(ahead)
        return kind == "op" and val == op



class _Parser:
    def __init__(self, text: str, vocab: TokenVocabulary | None = None) -> None:
        self.lx = _Lexer(text)
        self.vocab = vocab
        self.depth = 0
        self.budget = _Budget()

    def parse(self) -> Node:
        node = self.expr()
        kind, val, col = self.lx.peek()
        if kind != "eof":
            raise _err(f"unexpected {val!r} at column {col + 1} after a complete expression in {excerpt(self.lx.text)}")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _err(_DEPTH_MESSAGE)
        terms = [self.term()]
        while self.lx.at_op("+"):
            self.lx.next()
            terms.append(self.term())
        self.depth -= 1
        if len(terms) == 1 and terms[0][0] is None:
            return terms[0][1]
        self.budget.tick()
        return make_mix([(1.0 if w is None else w, node) for w, node in terms])

    def term(self) -> tuple[float | None, Node]:
        kind, val, col = self.lx.peek()
        if kind == "num":
            self.lx.next()
            if not self.lx.at_op("*"):
                raise _err(f"a number at column {col + 1} must be a weight written as {val}*expression")
            self.lx.next()
            return float(val), self.factor()
        node = self.factor()
        if self.lx.at_op("*"):
            self.lx.next()
            kind2, val2, col2 = self.lx.next()
            if kind2 != "num":
                raise _err(f"expected a weight after '*' at column {col2 + 1}; write w*expression")
            return float(val2), node
        return None, node

    def factor(self) -> Node:
        kind, val, col = self.lx.next()
        if kind == "op" and val == "(":
            node = self.expr()
            self.lx.expect(")")
            return node
        if kind != "name":
            shown = "end of input" if kind == "eof" else repr(val)
            raise _err(f"expected a primitive or combinator at column {col + 1}, found {shown}")
        if not self.lx.at_op("("):
            raise _err(f"{val!r} at column {col + 1} must be called with parentheses, e.g. {val}()")
        if val == "tok":
            raise _err(f"tok(..) at column {col + 1} names a token predicate, not an expression; use it as an "
                       'argument, e.g. recent(tok(".")) or gate(tok("Lily"), first(), prev(1))')
        self.lx.next()
        self.budget.tick()
        if val == "sum":
            return self.sum_terms(col)
        args = self.arglist(val)
        return self.build(val, args, col)

    def sum_terms(self, col: int) -> Node:
        """The terms of ``sum(w1*A, B, ..)`` whose '(' was just read (a missing weight is 1)."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _err(_DEPTH_MESSAGE)
        terms: list[tuple[float, Node]] = []
        while not (not terms and self.lx.at_op(")")):
            w, node = self.term()
            terms.append((1.0 if w is None else w, node))
            if len(terms) > _MAX_ARGS:
                raise _err(f"sum() at column {col + 1} has more than {_MAX_ARGS} terms (MAX_NODES)")
            if self.lx.at_op("+"):
                raise _err(f"sum() at column {col + 1}: separate its terms with commas, e.g. sum(2*prev(1), "
                           "first()); a mix inside a sum goes in parentheses")
            if not self.lx.at_op(","):
                break
            self.lx.next()
        self.lx.expect(")")
        self.depth -= 1
        if not terms:
            raise _err(f"sum() at column {col + 1} needs at least one term, e.g. sum(2*prev(1), first())")
        return make_sum(terms)

    def tok(self, col: int) -> Tok:
        """The token strings (or ids) of ``tok("a", ..)`` whose name was just read."""
        self.lx.expect("(")
        items: list[Any] = []
        while not self.lx.at_op(")"):
            kind, val, vcol = self.lx.next()
            if kind not in ("str", "num", "name") or (kind == "num" and not isinstance(val, int)):
                raise _err(f'tok(..) at column {col + 1} takes token strings, e.g. tok("Lily"); found {val!r}')
            items.append(Quoted(val) if isinstance(val, str) else val)
            if len(items) > MAX_IDS:
                raise _err(f"tok(..) at column {col + 1} names more than {MAX_IDS} tokens (MAX_IDS)")
            if not self.lx.at_op(","):
                break
            self.lx.next()
        self.lx.expect(")")
        if not items:
            raise _err(f'tok() at column {col + 1} needs a token, e.g. tok("Lily")')
        return Tok(tuple(items))

    def arglist(self, name: str) -> list[tuple[str | None, Any]]:
        """Arguments of ``name(...)`` as (keyword or None, value); values are nodes or literals."""
        args: list[tuple[str | None, Any]] = []
        if self.lx.at_op(")"):
            self.lx.next()
            return args
        while True:
            kind, val, col = self.lx.peek()
            if kind == "name" and val == "tok" and self.lx.at_op("(", 1):
                self.lx.next()
                args.append((None, self.tok(col)))
            elif kind == "name" and self.lx.at_op("=", 1):
                self.lx.next()
                self.lx.next()
                args.append((val, self.literal(limit=_list_limit(name, val), what=f"{name}({val}=...)")))
            elif kind == "name" and self.lx.at_op("(", 1):
                args.append((None, self.expr()))
            elif kind == "num" and self.lx.at_op("*", 1):
                args.append((None, self.expr()))
            elif kind == "op" and val == "(":
                args.append((None, self.expr()))
            else:
                lit = self.literal(limit=_list_limit(name, len(args)), what=f"argument {len(args) + 1} of {name}()")
                if isinstance(lit, (int, float)) and self.lx.at_op("+"):
                    raise _err(f"unexpected '+' after {lit} at column {col + 1}")
                args.append((None, lit))
            if len(args) > _MAX_ARGS:
                raise _err(f"a call at column {col + 1} has more than {_MAX_ARGS} arguments (MAX_NODES)")
            if self.lx.at_op(","):
                self.lx.next()
                continue
            self.lx.expect(")")
            return args

    def literal(self, depth: int = 0, limit: tuple[int, str] = (MAX_IDS, "MAX_IDS"), what: str = "a list") -> Any:
        """A number, name, string or [list] (of at most ``limit`` items at the outer level)."""
        kind, val, col = self.lx.next()
        if kind == "op" and val == "-":
            kind, val, col = self.lx.next()
            if kind != "num":
                raise _err(f"expected a number after '-' at column {col + 1}")
            return -val
        if kind == "str":
            return Quoted(val)
        if kind in ("num", "name"):
            return val
        if kind == "op" and val == "[":
            return self.list_literal(depth + 1, col, limit, what)
        shown = "end of input" if kind == "eof" else repr(val)
        raise _err(f"expected a value (number, name or [list]) at column {col + 1}, found {shown}")

    def list_literal(self, depth: int, col: int, limit: tuple[int, str], what: str) -> list[Any]:
        """The items of a [list] whose '[' was just read: at most MAX_LIST_DEPTH deep and ``limit`` long."""
        if depth > MAX_LIST_DEPTH:
            raise _err(f"the list at column {col + 1} nests deeper than {MAX_LIST_DEPTH} levels (MAX_LIST_DEPTH); "
                       "DSL parameters need at most 3, e.g. by=[[2, [3, 17]]]")
        items: list[Any] = []
        if self.lx.at_op("]"):
            self.lx.next()
            return items
        while True:
            if len(items) >= limit[0]:
                raise _err(f"{what} lists more than {limit[0]} items (the list at column {col + 1}); at most "
                           f"{limit[0]} are allowed ({limit[1]}): keep the ones that matter, or split the program")
            items.append(self.literal(depth, what=f"an item of {what}"))
            if self.lx.at_op(","):
                self.lx.next()
                continue
            self.lx.expect("]")
            return items

    def pred(self, value: Any, key: str | None, where: str) -> Pred:
        """A predicate from text: a flag, pos=, dep=, ids= / tokens= (token strings resolved) or tok(..)."""
        if isinstance(value, Tok) and key is None:
            return _make_pred(token_ids(value, self.vocab, f"{where} tok(..)"), "ids", where)
        if key in ("ids", "tokens"):
            return _make_pred(token_ids(value, self.vocab, f"{where} {key}="), "ids", where)
        return _make_pred(plain(value), key, where)

    def prim(self, name: str, where: str, positional: list[Any], keywords: dict[str, Any]) -> Prim:
        """``make_prim`` with ``tokens=`` read as the ids parameter and token strings resolved to ids."""
        params = PRIMITIVE_SPECS[name].params if name in PRIMITIVE_SPECS else ()
        kinds = {p.name: p.kind for p in params}
        ids_param = next((p.name for p in params if p.kind == "ids"), None)
        if "tokens" in keywords and ids_param is not None:
            if ids_param in keywords:
                raise _err(f"{where}: give {ids_param}=[..] or tokens=[..], not both")
            keywords = {(ids_param if k == "tokens" else k): v for k, v in keywords.items()}
        others = {p.name: v for p, v in zip(params, positional)} | keywords
        positional = [resolve(p.kind, v, self.vocab, f"{name}({p.name}=...)", others)
                      for p, v in zip(params, positional)] + positional[len(params):]
        keywords = {k: plain(resolve(kinds.get(k, ""), v, self.vocab, f"{name}({k}=...)", others))
                    for k, v in keywords.items()}
        return make_prim(name, [plain(v) for v in positional], keywords)

    def sharpen_by(self, by: Any) -> Any:
        """``by=[[t, [tokens..]], ..]`` with token strings resolved."""
        if not isinstance(by, (list, tuple)):
            return by
        return [[c[0], token_ids(c[1], self.vocab, "sharpen(A, t, by=...) class")]
                if isinstance(c, (list, tuple)) and len(c) == 2 else c for c in by]

    def build(self, name: str, args: list[tuple[str | None, Any]], col: int) -> Node:
        where = f"{name}() at column {col + 1}"
        nodes = [v for k, v in args if k is None and is_node(v)]
        if name in ("fallback", "mul"):
            if any(k is not None or not is_node(v) for k, v in args):
                raise _err(f"{where} takes only expressions as arguments")
            if len(nodes) < 2:
                raise _err(f"{where} needs at least 2 expressions; got {len(nodes)}")
            return Fallback(tuple(nodes)) if name == "fallback" else Mul(tuple(nodes))
        if name == "gate":
            if len(args) != 3:
                raise _err(f"{where} takes 3 arguments gate(PRED, A, B); got {len(args)}")
            (pk, pv), (k1, a), (k2, b) = args
            if is_node(pv) or k1 is not None or k2 is not None or not is_node(a) or not is_node(b):
                raise _err(f"{where} must be written gate(PRED, A, B) with PRED a flag, pos=TAG, dep=LABEL, "
                           'ids=[...], tokens=[".."] or tok("..")')
            return Gate(self.pred(pv, pk, where), a, b)
        if name == "sharpen":
            pos = [v for k, v in args if k is None]
            kw = {k: v for k, v in args if k is not None}
            if set(kw) - {"t", "by"} or len(args) - ("by" in kw) != 2 or not pos or not is_node(pos[0]):
                raise _err(f"{where} must be written sharpen(A, t) with A an expression and t > 0 "
                           "(optionally sharpen(A, t, by=[[t1, [ids..]], ..]))")
            t = kw.get("t", pos[1] if len(pos) > 1 else None)
            if is_node(t):
                raise _err(f"{where}: the exponent t must be a number")
            return make_sharpen(pos[0], t, self.sharpen_by(kw.get("by")))
        if name == "mix":
            raise _err(f"{where}: write a mix as w1*A + w2*B")
        if nodes:
            raise _err(f"{where}: primitive {name} does not take expressions as arguments")
        spec = PRIMITIVE_SPECS.get(name)
        if spec is not None and spec.takes_pred:
            if len(args) != 1:
                raise _err(f"{where} takes one predicate, e.g. {name}(punct) or {name}(pos=NOUN); "
                           f"got {len(args)} arguments")
            k, v = args[0]
            return _checked(Prim(name, ((spec.params[0].name, self.pred(v, k, where)),)))
        positional = [v for k, v in args if k is None]
        keywords: dict[str, Any] = {}
        for k, v in args:
            if k is not None:
                if k in keywords:
                    raise _err(f"{where} got parameter {k!r} twice")
                keywords[k] = v
        if any(k is None for k, _ in args[len(positional):]):
            raise _err(f"{where}: positional arguments must come before keyword arguments")
        return self.prim(name, where, positional, keywords)


_MAX_ARGS = MAX_NODES


def _list_limit(name: str, param: str | int) -> tuple[int, str]:
    """The most items (and the bound's name) of a list for parameter ``param`` (keyword or position) of ``name``."""
    if name == "sharpen":
        return (MAX_CLASSES, "MAX_CLASSES")
    spec = PRIMITIVE_SPECS.get(name)
    params = spec.params if spec is not None else ()
    if isinstance(param, int):
        kind = params[param].kind if param < len(params) else ""
    else:
        kind = next((p.kind for p in params if p.name == param), "")
    return KINDS[kind].list_limit if kind in KINDS else (MAX_IDS, "MAX_IDS")



def parse(text: str, vocab: TokenVocabulary | None = None) -> Node:
    """Parse DSL text (e.g. ``0.7*prev(1) + 0.3*first()``) into a validated tree.

    ``vocab`` (a ``Vocabulary``) resolves token strings (``tokens=["▁the"]``, ``tok("Lily")``) to ids; text
    that names tokens by string without one is a ProgramValidationError.
    """
    if not isinstance(text, str):
        raise _err(f"DSL text must be a string; got {type(text).__name__}")
    _check_text_size(text, "DSL text")
    if not text.strip():
        raise _err("empty DSL program; write an expression such as prev(1)")
    node = _Parser(text, vocab).parse()
    _measure(node, check=False)
    return _checked(node)
