"""cli/ holds parsing and rendering only (issue 53, item 3): one module a command, none
over 400 lines, and no validation message raised there: the option rules live in the
library (autoplan.api and the request modules), where a script through the Python API
meets the same ones. The exceptions are click's own hooks, which must raise click's error
for a usage message (listed below with the reason)."""

from __future__ import annotations

import re
from pathlib import Path

import autoplan.cli

CLI = Path(autoplan.cli.__file__).parent
MOST_LINES = 400

# a usage error raised where click itself asks for one: a flag's value that does not parse
ALLOWED = {
    ("app.py", "typer.BadParameter"): "TyperOption.consume_value: a number flag's value with '_' "
                                      "or non-ASCII digits, refused as click parses it",
    ("options.py", "typer.BadParameter"): "--dtype's parser and --objective's callback: click "
                                          "callbacks, whose usage errors name the flag",
}
RAISED = re.compile(r"raise\s+InputError\b|InputError\.single\(|InputError\(|typer\.BadParameter\(|Problem\(")


def _modules() -> list[Path]:
    return sorted(CLI.rglob("*.py"))


def test_no_module_in_cli_is_over_400_lines() -> None:
    long = {str(p.relative_to(CLI)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MOST_LINES}
    assert long == {}


def test_every_command_has_its_own_module() -> None:
    from autoplan.cli.main import app

    modules = {c.callback.__module__ for c in app.registered_commands if c.callback}
    modules |= {c.callback.__module__ for g in app.registered_groups if g.typer_instance
                for c in g.typer_instance.registered_commands if c.callback}
    assert all(m.startswith("autoplan.cli.commands.") for m in modules), modules
    per_module = {}
    for c in app.registered_commands:
        per_module.setdefault(c.callback.__module__, []).append(c.callback.__name__)
    assert {m: names for m, names in per_module.items() if len(names) > 1} == {}


def test_no_validation_message_is_raised_from_cli() -> None:
    found: dict[tuple[str, str], int] = {}
    for path in _modules():
        for line in path.read_text(encoding="utf-8").splitlines():
            code = line.split("#", 1)[0]
            for match in RAISED.finditer(code):
                word = match.group(0).rstrip("(").replace("raise ", "").strip()
                word = "typer.BadParameter" if "BadParameter" in word else word
                key = (str(path.relative_to(CLI)), word)
                found[key] = found.get(key, 0) + 1
    assert set(found) <= set(ALLOWED), {k: n for k, n in found.items() if k not in ALLOWED}
    assert found.keys() == ALLOWED.keys()  # each exception listed is still needed


def test_the_scan_finds_a_validation_message_raised(tmp_path: Path) -> None:
    """The pattern the scan above relies on catches each way of raising one."""
    for line in ('raise InputError.single("--top", "", "bad")', "raise InputError(problems)",
                 'exc = typer.BadParameter("x")', 'Problem("f", "", "why")'):
        assert RAISED.search(line), line
    assert not RAISED.search("from autoplan.errors import InputError")
