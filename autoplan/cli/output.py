"""One output sink: data to stdout (a rich table or stable JSON), diagnostics to stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

from autoplan.units import GiB

_stdout = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
out = _stdout
err = Console(stderr=True, highlight=False, soft_wrap=True)
_data_to_stderr = False


def reset() -> None:
    """Each command starts with its data on stdout."""
    global out, _data_to_stderr
    out, _data_to_stderr = _stdout, False


def data_to_stderr() -> None:
    """A file goes to stdout (``--out -``): the table or JSON goes to stderr instead."""
    global out, _data_to_stderr
    out = Console(stderr=True, highlight=False, soft_wrap=False,
                  width=None if sys.stderr.isatty() else 200)
    _data_to_stderr = True


def emit_json(data: Any) -> None:
    stream = sys.stderr if _data_to_stderr else sys.stdout
    stream.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def interactive(fmt: str) -> bool:
    """Show progress only to a person: a terminal, not CI, not JSON."""
    return fmt != "json" and sys.stderr.isatty() and not os.environ.get("CI")


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f}"
