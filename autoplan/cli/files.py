"""Where the commands write what they were asked to (``--out``, ``--plot``, ``--timeline``,
``--describe``): ``-`` is standard output, written here; anything else is written, and
refused before any work when it cannot be, by :mod:`autoplan.api.outputs` (the whole file
or nothing, never something that is not a file replaced). An output given with a trailing
slash names a directory, which this module remembers as the command line is parsed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.markup import escape

from autoplan.api import outputs

STDOUT = "-"
# outputs given with a trailing slash (``--out newdir/``): pathlib drops it, but it says
# "a directory"; filled by :func:`out_path` as the command line is parsed
_named_as_directory: set[Path] = set()


def out_path(raw: str) -> Path:
    """An output path option's value as given: a trailing slash is remembered (a
    directory), not dropped as ``Path`` drops it."""
    path = Path(raw)
    if raw.endswith("/") and raw != STDOUT:
        _named_as_directory.add(path)
    return path


def named_as_directory(path: Path) -> bool:
    """True for an output given with a trailing slash."""
    return path in _named_as_directory


def reset() -> None:
    """Each command starts with no output named."""
    _named_as_directory.clear()


is_stdout = outputs.is_stdout


def name(path: Path) -> str:
    """The path as console markup names it (``-``: stdout), escaped."""
    return "stdout" if is_stdout(path) else escape(str(path))

check_apart = outputs.check_apart
is_png = outputs.is_png


def check_target(path: Path) -> None:
    """Refuse, before any work, a path :func:`write_text` would refuse
    (:func:`autoplan.api.outputs.check_target`)."""
    outputs.check_target(path, named_as_directory(path))


def check_image(flag: str, path: Path) -> None:
    """An image output (``--plot``, ``--timeline``), refused before any work
    (:func:`autoplan.api.outputs.check_image`)."""
    outputs.check_image(flag, path, named_as_directory(path))


def check_plot(plot: Path) -> None:
    """``--plot``: an image file, not stdout (:func:`autoplan.api.outputs.check_plot`)."""
    outputs.check_plot(plot, named_as_directory(plot))


def write_text(path: Path, text: str, executable: bool = False) -> None:
    """Write ``text`` to ``path`` as the module doc says; ``executable``: a new file gets
    the execute bits its read bits allow (a script run as ./name)."""
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_bytes(path, text.encode("utf-8"), executable)


def write_bytes(path: Path, data: bytes, executable: bool = False) -> None:
    if is_stdout(path):
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    outputs.write_file(path, data, executable, named_as_directory(path))
