"""A command's flags, generated from its settings model by pydantic-settings' CliSettingsSource.

pydantic-settings, because pydantic already defines and validates every setting: the flags, their
types, defaults and help come from the same model and `Field(description=...)`, the source adds
them to our own argparse subparser (so `keyheads` stays one parser), and a flag's value is checked
by the very validators that check a YAML key. kebab-case flags, `--no-X` for booleans, and nested
sections as `--section.key` (the run config) come with it.
"""
from __future__ import annotations

import argparse

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource, SettingsError

from ..config.base import setting_error
from ..errors import SettingError


def add_settings(parser: argparse.ArgumentParser, model) -> None:
    """Add `model`'s fields to `parser` as flags; `settings(args)` then gives the checked model."""
    source: CliSettingsSource = CliSettingsSource(
        model, root_parser=parser, cli_prog_name=parser.prog, cli_kebab_case=True, cli_implicit_flags=True,
        cli_hide_none_type=True, cli_avoid_json=True, cli_parse_none_str="null")  # null as in YAML
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
