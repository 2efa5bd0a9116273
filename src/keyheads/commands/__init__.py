"""CLI subcommands, one module each, registered by keyheads.cli."""
