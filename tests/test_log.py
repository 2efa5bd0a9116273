"""The keyheads logger: quiet unless the command asks; --quiet leaves warnings only."""
import argparse
import logging

import pytest

from keyheads import log
from keyheads.cli import main


@pytest.fixture(autouse=True)
def restore_level():
    level = log.logger.level
    yield
    log.logger.setLevel(level)


def test_configure_shows_notes_on_stderr_and_quiet_only_warnings(capsys):
    log.configure()
    log.logger.info("a note %d", 1)
    assert capsys.readouterr().err == "[keyheads] a note 1\n"
    log.configure(quiet=True)
    log.configure(quiet=True)  # the handler is added once
    log.logger.info("hidden")
    log.logger.warning("careful")
    assert capsys.readouterr().err == "[keyheads] careful\n"


def test_the_command_sets_the_level_from_quiet(monkeypatch):
    seen = []

    def parsed(self, argv=None, namespace=None):  # a command that records the level it runs under
        return argparse.Namespace(command="x", quiet="--quiet" in argv, func=lambda args: seen.append(log.logger.level))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    assert main(["x", "--quiet"]) == 0 and main(["x"]) == 0
    assert seen == [logging.WARNING, logging.INFO]
