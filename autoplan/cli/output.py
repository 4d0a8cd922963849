"""One output sink: data to stdout (a rich table or stable JSON), diagnostics to stderr."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from autoplan.text import json_text, printable
from autoplan.units import GiB


def _shown(obj: Any) -> Any:
    """``obj`` with every string it prints made :func:`printable`: a path or a value read
    from a file may hold an escape sequence that would retitle or clear the terminal."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, Text):
        shown = printable(obj.plain)
        return obj if shown == obj.plain else Text(shown, style=obj.style, justify=obj.justify)
    if isinstance(obj, Table):
        obj.title, obj.caption = _shown(obj.title), _shown(obj.caption)
        for column in obj.columns:
            column.header = _shown(column.header)
            column._cells[:] = [_shown(c) for c in column._cells]
        return obj
    if isinstance(obj, Group):
        obj._renderables = tuple(_shown(r) for r in obj._renderables)
    return obj


# piped output is read by programs and people's pagers, not wrapped by a terminal: a line
# is never broken (a summary line of 230 characters stays one line; a table keeps its width)
PIPED_WIDTH = 100_000


class _Console(Console):
    """A console that shows control characters in what it prints as escapes."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: D102
        super().print(*(_shown(o) for o in objects), **kwargs)


_stdout = _Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else PIPED_WIDTH)
out: Console = _stdout
err: Console = _Console(stderr=True, highlight=False, soft_wrap=True)
_data_to_stderr = False


_quiet = False


def reset() -> None:
    """Each command starts with its data on stdout, progress shown."""
    global out, _data_to_stderr, _quiet
    out, _data_to_stderr, _quiet = _stdout, False, False


def quiet() -> None:
    """``--quiet``: no progress, neither spinner nor lines."""
    global _quiet
    _quiet = True


def _nothing(_: str) -> None:
    return None


@contextlib.contextmanager
def working(fmt: str, message: str, *, lines: bool = False) -> Iterator[Callable[[str], None]]:
    """Progress while a command works; yields where to tell what has finished. A spinner
    on a terminal (not in CI, not for JSON); with ``lines`` (the searches that take
    seconds), plain lines on stderr elsewhere (a pipe, a CI log); nothing when quiet."""
    if _quiet:
        yield _nothing
    elif interactive(fmt):
        from rich.markup import escape

        with err.status(escape(message)) as status:
            yield lambda line: status.update(escape(f"{message} {line}"))
    elif lines:
        err.print(f"autoplan: {message}", markup=False)
        yield lambda line: err.print(f"autoplan: {line}", markup=False)
    else:
        yield _nothing


def data_to_stderr() -> None:
    """A file goes to stdout (``--out -``): the table or JSON goes to stderr instead."""
    global out, _data_to_stderr
    out = _Console(stderr=True, highlight=False, soft_wrap=False,
                  width=None if sys.stderr.isatty() else PIPED_WIDTH)
    _data_to_stderr = True


def emit_json(data: Any) -> None:
    stream = sys.stderr if _data_to_stderr else sys.stdout
    stream.write(json_text(data))


def interactive(fmt: str) -> bool:
    """Show progress only to a person: a terminal, not CI, not JSON."""
    return fmt != "json" and sys.stderr.isatty() and not os.environ.get("CI")


def gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f}"
