"""Every setting of every command, defined once.

- each step's settings type is declared in full in its own module (data/settings.py, patching/settings.py,
  analysis/settings.py, finetune/settings.py, evaluation/settings.py; the head choice in keyheads.selection),
  as a keyheads.section.Section;
- keyheads.config.commands: one model per command, declared by inheriting its step's type beside its files
  and the machine (keyheads.config.base's mixins);
- keyheads.config.run: the run config, which holds the same step types as its sections.

No settings class is made at run time, so mypy checks every field from YAML to the step.

The flags are generated with pydantic-settings (its CliSettingsSource, given each subcommand's
argparse parser as root_parser; keyheads.commands.flags). Chosen over jsonargparse and tyro because
pydantic already types and validates every setting here: one library, one validation style (field
validators, which call keyheads.machine for the machine-dependent checks), the same rules for a flag
and a YAML key, kebab-case flags, `--no-X` booleans and `--section.key` for nested sections out of the
box, and our own subcommand parser stays in charge.
"""
