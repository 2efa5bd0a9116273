"""Command-line flags generated from a settings dataclass, so each setting is defined once.

The dataclass's field names, types and defaults give the flags; the "Attributes:" section of its
docstring gives their help.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing


def field_docs(cls) -> dict[str, str]:
    """name -> help text, from a Google-style "Attributes:" docstring (continuation lines joined)."""
    doc = (cls.__doc__ or "").split("Attributes:", 1)[-1]
    docs, current = {}, None
    for line in doc.splitlines():
        m = re.match(r"\s{4,8}([\w, ]+):\s*(.*)", line)
        if m and not line.startswith(" " * 12):
            current = [n.strip() for n in m.group(1).split(",")]
            for name in current:
                docs[name] = m.group(2)
        elif current and line.strip():
            for name in current:
                docs[name] += " " + line.strip()
    return docs


def _parser_for(tp):
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        return _parser_for(args[0])
    if origin in (tuple, list):
        inner = _parser_for(args[0])
        return lambda text: origin(inner(x.strip()) for x in text.split(",") if x.strip())
    if origin is typing.Literal:  # the dataclass's own validation names the allowed values
        return str
    return tp


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), group_title: str = "") -> None:
    group = parser.add_argument_group(group_title or cls.__name__)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        # argparse %-formats help texts: a literal "-5%" in a docstring must reach it as "-5%%"
        help_text = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%")
        if hints[f.name] is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=f.name, type=_parser_for(hints[f.name]), default=None, help=help_text,
                               metavar=f.name.upper())


def dataclass_from_args(cls, args: argparse.Namespace, **overrides):
    """The dataclass with every flag the user gave; its own validation names what is wrong."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if getattr(args, f.name, None) is not None}
    return cls(**{**given, **overrides})
