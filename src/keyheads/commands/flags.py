"""A command's flags, generated from its settings model by pydantic-settings' CliSettingsSource.

pydantic-settings, because pydantic already defines and validates every setting: the flags, their
types, defaults and help come from the same model and `Field(description=...)`, the source adds
them to our own argparse subparser (so `keyheads` stays one parser), and a flag's value is checked
by the very validators that check a YAML key. kebab-case flags, `--no-X` for booleans, nested
sections as `--section.key` (the run config), and lists given as `a,b`, repeated or as JSON come
with it.

What it does not do is write help a person reads: its metavar is the Python type (`--top-k int`,
`--adapter list[str]`) and every help ends in `(default: null)` or `(default factory: list)`.
So its one public hook for adding a flag (`add_argument_method`) is ours: `_Flags.add` sees each
flag before argparse does and, from the field it stands for, gives it
- a metavar that says what the value is (`metavar`: the field's own `json_schema_extra={"metavar":
  ...}` if it has one, else from its name and type: `N`, `FILE`, `DIR`, `HEADS`, `NAME[,NAME...]`);
- its description with the real default once, in the syntax a flag or YAML key takes (`default`:
  `0.9,0.999`, `2e-5`, on/off for a boolean, nothing for null or an empty list, nothing where the
  description already says it);
- `--n` beside `-n` for a one-letter setting, as `--data.n` is spelt in the run's flags.
`HelpFormatter` shows a boolean as `--[no-]quiet` and wraps descriptions and epilogs at the
terminal's width, keeping their line breaks.

Also considered, and why not (each but typer, which transformers pulls in, a new dependency): tyro
generates flags from pydantic models too (`--section.key` as well), but its metavars are type names
again (`--top-k INT`; a per-field `tyro.conf.arg(metavar=...)` is the table per command we avoid),
and it builds and runs its own parser, where keyheads.cli builds ours and reports its errors.
jsonargparse reads pydantic models and YAML, but its help says `(type: float, default: 2.0)` and
its config files would be a second YAML loader beside RunSettings.from_yaml. typer (click)
builds options from function signatures, not from nested models. Plain argparse generated from the
models would give the same help as this module, at the price of re-implementing the value parsing
(lists, tuples, JSON, nested sections, booleans, null) that CliSettingsSource does and is tested
for; only the presentation was missing, and that is this module.
"""
from __future__ import annotations

import argparse
import itertools
import re
import textwrap
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import CliSettingsSource, SettingsError

from ..config.base import setting_error
from ..errors import SettingError

NULL = "null"  # None as a flag's value, as in YAML

# A field name (or its last word) that says more than its type: what the value is.
_WORDS = {
    "device": "DEVICE", "dtype": "DTYPE", "model": "MODEL", "baseline": "MODEL",
    "heads": "HEADS", "knockout": "HEADS", "mlp_layers": "LAYERS", "knockout_mlps": "LAYERS",
    "max_memory": "LIMITS", "memory": "SIZE", "operands": "RANGE", "train": "DATA", "case": "PROMPT",
    "benchmarks": "NAME", "templates": "ID",
}
_PATHS = ("out", "data", "effects", "adapter")  # and *_data, *_dir, *_folder, *_file, *_files


def _core(tp: Any) -> Any:
    """The type a value has once given: Annotated and None stripped (`Count | None` -> int)."""
    while True:
        if hasattr(tp, "__metadata__"):  # Annotated[T, ...]
            tp = tp.__origin__
        elif get_origin(tp) in (Union, types.UnionType):
            rest = [a for a in get_args(tp) if a is not type(None)]
            if len(rest) != 1:
                return tp
            tp = rest[0]
        else:
            return tp


def _path_kind(name: str, field: FieldInfo) -> str | None:
    """FILE or DIR for a setting that names a path; the description says which where the name does not."""
    if name.endswith(("_dir", "_folder")):
        return "DIR"
    if name in _PATHS or name.endswith(("_data", "_file", "_files")):
        return "DIR" if "folder" in (field.description or "") else "FILE"
    return None


def _word(name: str, tp: Any, field: FieldInfo, item: bool = False) -> str:
    """The metavar of one value of type `tp` of the setting `name` (`item`: one element of a list)."""
    tp = _core(tp)
    if tp is int:
        return "N"
    if tp is dict or get_origin(tp) is dict or _settings_class(tp):
        return "JSON"
    last = name.rsplit("_", 1)[-1]
    for key in (name, last):
        if key in _WORDS:
            return _WORDS[key]
    path = _path_kind(name, field)
    if path:
        return path
    if item and last.endswith("s"):
        last = last[:-1]
    return last.upper()


def metavar(name: str, field: FieldInfo) -> str | None:
    """What a flag's value is, for --help; None for a boolean or a choice, which show themselves."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "metavar" in extra:  # the settings classes' own word for a value
        return str(extra["metavar"])
    tp = _core(field.annotation)
    origin = get_origin(tp)
    if tp is bool or origin is Literal:
        return None
    if origin in (list, tuple, set, frozenset):
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:  # fixed length: adam_betas BETA1,BETA2
            one = _word(name, args[0], field, item=True)
            return ",".join(f"{one}{i}" for i in range(1, len(args) + 1))
        one = _word(name, args[0] if args else str, field, item=True)
        return one if one == "JSON" else f"{one}[,{one}...]"
    return _word(name, tp, field)


def show(value: Any) -> str:
    """A value as it is given on the command line (and in YAML): 2e-5, 0.9,0.999, null."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        text = repr(value).removesuffix(".0")
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2], text)
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(show(v) for v in value)
    return str(value)


def default(field: FieldInfo, value: Any) -> str:
    """The help's ending: (required), (default: VALUE), or nothing (null, an empty list, said already)."""
    if value is PydanticUndefined:
        return " (required)"
    if value is None or value == "" or isinstance(value, (list, tuple, set, dict)) and not value:
        return ""
    text = show(value)
    for written in {text, str(value)}:  # "(Trainer default 1.0; ...)" says it already
        if re.search(rf"\bdefault:? {re.escape(written)}(?![\w.])", field.description or ""):
            return ""
    return f" (default: {text})"


def _indent(line: str) -> str | None:
    """A line's leading whitespace; None for a blank line."""
    return line[:len(line) - len(line.lstrip())] if line.strip() else None


class _Toggle(argparse.BooleanOptionalAction):
    """A boolean flag, shown as --[no-]name."""

    def format_usage(self) -> str:
        return "--[no-]" + self.option_strings[0][2:]


class HelpFormatter(argparse.HelpFormatter):
    """--[no-]quiet; `-n, --n N`; descriptions and epilogs keep their line breaks and wrap at the width."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if isinstance(action, _Toggle):
            return action.format_usage()
        if action.option_strings and action.nargs != 0:
            return ", ".join(action.option_strings) + " " + self._format_args(
                action, self._get_default_metavar_for_optional(action))
        return super()._format_action_invocation(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Lines as written while they fit; a paragraph (lines of one indent) with a longer line is re-wrapped."""
        lines: list[str] = []
        for lead, group in itertools.groupby(text.splitlines(), key=_indent):
            paragraph = [line.strip() for line in group]
            if lead is None:  # blank lines
                lines += [""] * len(paragraph)
            elif max(len(indent + lead + line) for line in paragraph) <= width:
                lines += [indent + lead + line for line in paragraph]
            else:
                lines += textwrap.wrap(" ".join(paragraph), width, initial_indent=indent + lead,
                                       subsequent_indent=indent + lead, break_on_hyphens=False)
        return "\n".join(lines)


def _settings_class(tp: Any) -> bool:
    """A pydantic model or dataclass: a group of settings."""
    return isinstance(tp, type) and (issubclass(tp, BaseModel) or is_pydantic_dataclass(tp))


def _section(field: FieldInfo) -> bool:
    """A field that holds a group of settings (`--data.n`), not a value."""
    return _settings_class(_core(field.annotation))


def _fields(model: Any) -> dict[str, tuple[str, FieldInfo]]:
    """A model's fields by every name a flag may have for them (the alias, e.g. limit for n_samples)."""
    found = {}
    for name, field in (getattr(model, "model_fields", None) or model.__pydantic_fields__).items():
        found[name] = (name, field)
        if field.alias:
            found[field.alias] = (name, field)
    return found


class _Flags:
    """Gives each flag CliSettingsSource adds its metavar, help and long spelling (the module docstring)."""

    def __init__(self, model: Any):
        self.model = model

    def field(self, dest: str) -> tuple[str, FieldInfo, Any] | None:
        """The field behind a flag's dest (`top_k`, `finetune.lr`), and its default (a section's own default)."""
        model, value, found = self.model, PydanticUndefined, None
        for part in dest.split("."):
            if model is None or part not in _fields(model):
                return None
            name, field = _fields(model)[part]
            if value is PydanticUndefined or value is None:  # no enclosing default: the field's own
                value = field.get_default(call_default_factory=True) if not field.is_required() else PydanticUndefined
            else:
                value = getattr(value, name, PydanticUndefined)
            found = (name, field, value)
            model = _core(field.annotation) if _section(field) else None
        return found

    def flag(self, name: str, section: str) -> str | None:
        """The flag of a setting a description names (`top_k`, `finetune.mlps`, `--offload`): a setting of
        the same section first (in `run`, finetune's --offload is --finetune.offload), else of the command."""
        for dest in (section + name, name) if section else (name,):
            found = self.field(dest)
            if found and not _section(found[1]):
                parts = dest.split(".")
                return "--" + ".".join(parts[:-1] + [found[1].alias or found[0]]).replace("_", "-")
        return None

    def description(self, dest: str, field: FieldInfo) -> str:
        """The field's description as the command line reads it: null for None (as a flag and YAML take it),
        and a setting it names as its flag (`unless top_k is given` -> `unless --top-k is given`)."""
        section = dest.rpartition(".")[0] + "." if "." in dest else ""

        def as_flag(m: re.Match[str]) -> str:
            if not m[0].startswith("--") and "_" not in m[0] and "." not in m[0]:
                return m[0]  # a word of prose (`data`, `few-shot`), not a setting's name
            return self.flag(m[0].removeprefix("--").replace("-", "_"), section) or m[0]

        text = re.sub(r"\bNone\b", NULL, field.description or "")
        return re.sub(r"(?<![\w$/.`-])(?:--)?[a-z][a-z0-9]*(?:[._-][a-z0-9]+)*(?![\w/])", as_flag, text)

    def add(self, container: Any, *names: str, dest: str | None = None, help: str | None = None,
            action: Any = None, **kwargs: Any) -> Any:
        given = {"dest": dest, "help": help, "action": action}
        kwargs.update({k: v for k, v in given.items() if v is not None})
        found = self.field(dest) if dest is not None else None
        if dest is None or found is None or help == argparse.SUPPRESS:  # -h, a positional, a section's JSON form
            return container.add_argument(*names, **kwargs)
        name, field, value = found
        text = self.description(dest, field) + default(field, value)
        kwargs["help"] = text.replace("%", "%%")  # argparse formats help with %
        if action is argparse.BooleanOptionalAction:
            kwargs["action"] = _Toggle
        elif "metavar" in kwargs and metavar(name, field):
            kwargs["metavar"] = metavar(name, field)
        names += tuple("-" + n for n in names if re.fullmatch(r"-\w", n))  # -n and --n
        return container.add_argument(*names, **kwargs)


def add_settings(parser: argparse.ArgumentParser, model) -> None:
    """Add `model`'s fields to `parser` as flags; `settings(args)` then gives the checked model."""
    parser.formatter_class = HelpFormatter
    source: CliSettingsSource = CliSettingsSource(
        model, root_parser=parser, cli_prog_name=parser.prog, cli_kebab_case=True, cli_implicit_flags=True,
        cli_hide_none_type=True, cli_avoid_json=True, cli_parse_none_str=NULL, add_argument_method=_Flags(model).add)
    parser.set_defaults(_settings=(model, source))


def given(args: argparse.Namespace) -> dict:
    """The settings given on the command line (nested for sections), as pydantic-settings read them."""
    _, source = args._settings
    try:
        return source(parsed_args=args)()
    except SettingsError as err:  # a value the flag's type cannot be read from, e.g. unbalanced JSON
        raise SettingError(f"a flag's value cannot be read: {err}".replace("Parsing error encountered for ", "--")
                           .replace("_", "-")) from None


def settings(args: argparse.Namespace, **extra):
    """The command's settings model from its flags; errors name the flags, before any model loads."""
    model, _ = args._settings
    try:
        cfg = model.model_validate({**given(args), **extra})
    except ValidationError as err:
        raise setting_error(err, flags=True) from None
    if hasattr(cfg, "apply"):
        cfg.apply()
    return cfg
