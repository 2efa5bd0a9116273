"""Every setting of every command, defined once.

- keyheads.config.sections: what a command shares with `keyheads run` (a section of the run config);
- keyheads.config.commands: one model per command: its section, its files and the machine;
- keyheads.config.run: the run config, which composes the sections.

The method settings (PatchSettings, KnockoutRun, AttentionRun, MLPRun, EvalSettings, PairSettings,
FinetuneSettings) are pydantic dataclasses beside the code that uses them; the sections and commands
take their fields, descriptions and validators from them (`section_of`), never declaring them again.

The flags are generated with pydantic-settings (its CliSettingsSource, given each subcommand's
argparse parser as root_parser; keyheads.commands.flags). Chosen over jsonargparse and tyro because
pydantic already types and validates every setting here: one library, one validation style (field
validators, which call keyheads.machine for the machine-dependent checks), the same rules for a flag
and a YAML key, kebab-case flags, `--no-X` booleans and `--section.key` for nested sections out of the
box, and our own subcommand parser stays in charge.
"""
