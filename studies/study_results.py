"""How a study script shows what it computed: a markdown section on stdout.

The repository's study results are not written by these scripts: they are the committed records under records/,
and `python -m studies.pages` renders every page from them. A script's section is for reading a run folder."""
from __future__ import annotations


def show_section(title: str, body: str) -> None:
    """Print `## title` and `body`."""
    print(f"## {title}\n\n{body}")
