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


# issue 47: a flag that takes one of a fixed set shows the set, not <str>
@pytest.mark.parametrize(("command", "flag", "choices"), [
    (["bench"], "--device", "<cpu|cuda>"),
    (["bench"], "--preset", "<tiny|default|full>"),
    (["validate"], "--device", "<cpu|cuda>"),
    (["tune"], "--device", "<cpu|cuda>"),
    (["tune"], "--runner", "<local|torchrun|slurm>"),
    (["tune"], "--launcher", "<megatron|torchtitan>"),
    (["export"], "--launcher", "<megatron|deepspeed|torchtitan>"),
    (["export"], "--to",
     "<megatron|nemo|deepspeed|torchtitan|accelerate|slurm|vllm|sglang|trtllm|dynamo|llm-d|k8s>"),
    (["search"], "--objective", "<time|cost|energy>"),
    (["serve"], "--objective", "<goodput|cost|energy>"),
    (["explain"], "--format", "<table|json>"),
])
def test_a_flag_of_fixed_choices_shows_them(command: list[str], flag: str, choices: str) -> None:
    text = autoplan(*command, "--help", env={"COLUMNS": "250"}).stdout
    line = next(x for x in text.splitlines() if re.match(rf"\W*{flag}\s", x))  # the option's own row
    assert choices in line, line
