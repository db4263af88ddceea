"""Stage settings as dataclasses whose fields carry their own command-line flag and help, and the one generator
that turns those fields into argparse flags and parsed flags back into a config.

A setting is declared once (headsurgeon/surgery/configs.py, headsurgeon/synth/search/config.py, headsurgeon/scaleout/config.py,
headsurgeon/pipeline.py ExplainConfig): its default, its help and its flag. The library's functions take their
defaults from the field, and every subcommand builds its flags from it (headsurgeon/cli/__init__.py, headsurgeon/cli/measure.py), so
a default exists in one place. It sits in the bottom layer, next to headsurgeon/core/argtypes.py, so every package's
command line shares it; it needs the standard library only.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
from typing import Any, Iterable, Iterator, Mapping

from . import InputError

__all__ = ["AUTO", "setting", "nested", "add_flags", "from_flags", "flags", "shortcut_paths", "with_shortcuts"]

#: ``setting(flag=AUTO)``: the flag is ``--`` and the field's (prefixed) name with dashes, e.g. ``--max-len``
AUTO = "auto"
_META = "headsurgeon"


def setting(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = AUTO,
            default_factory: Any = dataclasses.MISSING, **argparse_options: Any) -> Any:
    """A dataclass field with its help and command-line flag (``flag=None``: Python only); ``argparse_options``
    (``type``, ``choices``, ``action``, ``nargs``, ``metavar``, ``const``) go to ``add_argument`` as given."""
    meta = {_META: {"help": help, "flag": flag, "argparse": argparse_options}}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def nested(cls: type, *, optional: bool = False, prefix: str = "", help: str = "") -> Any:
    """A field holding another stage's config: its flags join the parent's (``prefix`` before their names).

    ``optional``: the field defaults to None and the nested config is built only when one of its flags is given
    (the LLM agent's ``AgentConfig``, whose defaults read the environment); such a field is one keyword shortcut.
    """
    meta = {_META: {"nested": cls, "optional": optional, "prefix": prefix, "help": help}}
    if optional:
        return dataclasses.field(default=None, metadata=meta)
    return dataclasses.field(default_factory=cls, metadata=meta)


def _meta(f: dataclasses.Field) -> dict[str, Any]:
    return f.metadata.get(_META, {})


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _check(cls: Any) -> None:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise InputError(f"expected a config dataclass, got {cls!r}")


def _walk(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, str]]:
    """(dest, field, flag) for every field of ``cls`` with a flag, nested configs included."""
    for f in dataclasses.fields(cls):
        m = _meta(f)
        if "nested" in m:
            yield from _walk(m["nested"], prefix + m["prefix"])
        elif m.get("flag"):
            dest = prefix + f.name
            yield dest, f, ("--" + dest.replace("_", "-")) if m["flag"] == AUTO else m["flag"]


def flags(cls: type) -> dict[str, str]:
    """``{flag: dest}`` of every setting of ``cls`` that has a command-line flag, nested configs included."""
    _check(cls)
    return {flag: dest for dest, _, flag in _walk(cls)}


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
              only: Iterable[str] | None = None) -> None:
    """Add the flags of ``cls``'s settings (all, or the dests in ``only``) with their defaults and help."""
    _check(cls)
    wanted = None if only is None else set(only)
    found = set()
    for dest, f, flag in _walk(cls):
        if wanted is not None and dest not in wanted:
            continue
        found.add(dest)
        m = _meta(f)
        options = dict(m["argparse"])
        # a default_factory (e.g. read from the environment) runs in the config, not when the flags are parsed
        default = None if f.default is dataclasses.MISSING else f.default
        options.setdefault("default", None if options.get("action") == "append" else default)
        if isinstance(options.get("default"), tuple):
            options["default"] = list(options["default"])  # argparse shows and parses lists
        parser.add_argument(flag, dest=dest, help=m["help"], **options)
    if wanted is not None and wanted - found:
        raise InputError(f"{cls.__name__} has no flags for {sorted(wanted - found)}; "
                         f"known: {sorted(flags(cls).values())}")


def from_flags(cls: type, args: argparse.Namespace | Mapping[str, Any], prefix: str = "", **overrides: Any) -> Any:
    """The config ``cls`` built from parsed flags (fields whose flag was not added keep their defaults).

    A list from the command line becomes a tuple where the default is one; ``overrides`` replace fields by name.
    """
    _check(cls)
    values = vars(args) if isinstance(args, argparse.Namespace) else dict(args)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        m = _meta(f)
        if f.name in overrides:
            kwargs[f.name] = overrides[f.name]
        elif "nested" in m:
            sub_prefix = prefix + m["prefix"]
            if m["optional"]:
                given = {d[len(sub_prefix):]: values[d] for d, _, _ in _walk(m["nested"], sub_prefix)
                         if values.get(d) is not None}
                if given:
                    kwargs[f.name] = m["nested"](**given)
            else:
                kwargs[f.name] = from_flags(m["nested"], values, sub_prefix)
        elif m.get("flag") and prefix + f.name in values:
            value = values[prefix + f.name]
            if value is None and _default(f) is not None:
                continue  # an append flag never given: the field's default
            if isinstance(value, list) and isinstance(_default(f), tuple):
                value = tuple(value)
            kwargs[f.name] = value
    return cls(**kwargs)


def shortcut_paths(cls: type) -> dict[str, tuple[str, ...]]:
    """``{name: path}``: every leaf setting of ``cls`` by its own name (an optional nested config is one leaf)."""
    _check(cls)
    out: dict[str, tuple[str, ...]] = {}

    def walk(c: type, path: tuple[str, ...]) -> None:
        for f in dataclasses.fields(c):
            m = _meta(f)
            if "nested" in m and not m["optional"]:
                walk(m["nested"], path + (f.name,))
            else:
                if f.name in out:
                    raise InputError(f"{cls.__name__}: the setting name {f.name!r} appears twice "
                                     f"({'.'.join(out[f.name])} and {'.'.join(path + (f.name,))})")
                out[f.name] = path + (f.name,)

    walk(cls, ())
    return out


def with_shortcuts(cls: type, config: Any, shortcuts: Mapping[str, Any], call: str) -> Any:
    """``config`` (or ``cls()``) with the keyword ``shortcuts`` set by their leaf names; a shortcut beside a
    config, a config of another type or an unknown name is an InputError naming the fix."""
    paths = shortcut_paths(cls)
    unknown = [k for k in shortcuts if k not in paths]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, paths, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InputError(f"{call} got unknown setting(s) {', '.join(hints)}; the settings are "
                         f"{', '.join(sorted(paths))}")
    if config is not None:
        if not isinstance(config, cls):
            raise InputError(f"{call}: config must be a {cls.__name__}, got {type(config).__name__}; pass "
                             f"config={cls.__name__}(...) or the settings as keywords")
        if shortcuts:
            where = ", ".join(f"{k} is {cls.__name__}.{'.'.join(paths[k])}" for k in sorted(shortcuts))
            raise InputError(f"{call} got config= and keyword settings beside it ({where}): pass one or the "
                             "other; set them in the config (dataclasses.replace) or drop config=")
        return config
    groups: dict[tuple[str, ...], dict[str, Any]] = {}
    for name, value in shortcuts.items():
        path = paths[name]
        groups.setdefault(path[:-1], {})[path[-1]] = value
    return _build(cls, (), groups)


def _build(cls: type, path: tuple[str, ...], groups: dict[tuple[str, ...], dict[str, Any]]) -> Any:
    """``cls`` with the grouped shortcut values at ``path`` and below."""
    kwargs = dict(groups.get(path, {}))
    for f in dataclasses.fields(cls):
        m = _meta(f)
        if "nested" in m and not m["optional"] and any(p[:len(path) + 1] == path + (f.name,) for p in groups):
            kwargs[f.name] = _build(m["nested"], path + (f.name,), groups)
    return cls(**kwargs)
