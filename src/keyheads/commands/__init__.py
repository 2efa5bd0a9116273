"""CLI subcommands, one module each, registered by keyheads.cli.

A command module imports its stage's code inside the command's function, not at its top: building the parser
imports every command module (for its flags), and with torch and transformers there every `keyheads --help`, or
a flag's error, would wait seconds for them (tests/test_imports.py)."""
