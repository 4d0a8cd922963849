"""Help reads as the commands behave: flags take no value, the summary names only
commands that exist, a short option means one thing everywhere."""

from __future__ import annotations

import re

import pytest

from autoplan.cli.main import app
from tests.helpers import autoplan

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands
                  if c.callback is not None)


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=lambda c: " ".join(c) or "top")
def test_flags_are_not_shown_as_taking_a_value(command: list[str]) -> None:
    r = autoplan(*command, "--help")
    assert r.returncode == 0 and "<bool>" not in r.stdout


def test_the_summary_names_only_commands_that_exist() -> None:
    r = autoplan("--help")
    summary = r.stdout.split("Options")[0]
    named = set(re.findall(r"\b(search|evaluate|explain|export|check|bench|validate|list|diff)\b",
                           summary))
    assert named and named <= set(COMMANDS)


def test_a_short_option_means_one_long_option_across_commands() -> None:
    meaning: dict[str, str] = {}
    for command in COMMANDS:
        text = autoplan(command, "--help").stdout
        for long, short in re.findall(r"(--[a-z-]+)\s+(-[a-zA-Z])\s", text):
            assert meaning.setdefault(short, long) == long, (command, short, long, meaning[short])
    assert {"-o", "-f", "-m", "-c", "-t"} <= set(meaning)
