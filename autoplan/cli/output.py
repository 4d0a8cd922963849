"""One output sink: data to stdout (a rich table or stable JSON), diagnostics to stderr."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console

from autoplan.units import GiB

out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def interactive(fmt: str) -> bool:
    """Show progress only to a person: a terminal, not CI, not JSON."""
    return fmt != "json" and sys.stderr.isatty() and not os.environ.get("CI")


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f}"
