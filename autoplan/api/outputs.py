"""Output targets: the files a command (or a script through :mod:`autoplan.api`) writes,
refused before any work when they cannot be written, and written whole or not at all.

* ``-``: standard output (the caller writes it; these functions only name it).
* A regular file, or a path where nothing is yet: written to a temporary file beside it
  and renamed into place (a reader never sees half a file; a failed write leaves what
  was there).
* A symbolic link: followed to its target, which is then written as above (the link
  stays a link).
* A FIFO or a character device (``/dev/stdout``, ``/dev/null``, a terminal): opened and
  written through, as a shell's ``>`` would; a rename would replace the node itself.
* Anything else (a directory, a socket, a block device) is refused (exit 2), and
  :func:`check_target` refuses it before any work is done.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autoplan.errors import AutoplanError, InputError

STDOUT = "-"


def is_stdout(path: Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def name(path: Path) -> str:
    """The path as a message names it (``-``: stdout), as given: messages are plain text,
    not console markup."""
    return "stdout" if is_stdout(path) else str(path)


def _refuse(path: Path, why: str) -> InputError:
    return InputError.single(str(path), "", f"cannot write: {why}")


def target_kind(path: Path, as_directory: bool = False) -> tuple[str, Path]:
    """('stdout' | 'file' | 'stream', where to write) for ``path``, or an InputError;
    ``as_directory``: the path was given with a trailing slash (a directory)."""
    if is_stdout(path):
        return "stdout", path
    if as_directory:
        raise _refuse(path, f"{path}/ names a directory (a trailing '/'): give a file name")
    path = path.expanduser()
    try:
        mode = os.stat(path).st_mode  # through links
    except FileNotFoundError:
        # nothing there yet, or a link to nothing: the file is created where it points
        return "file", Path(os.path.realpath(path))
    except OSError as exc:
        raise _refuse(path, exc.strerror or str(exc)) from None
    if stat.S_ISREG(mode):
        return "file", Path(os.path.realpath(path))
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return "stream", path
    if stat.S_ISDIR(mode):
        raise _refuse(path, "a directory (give a file name)")
    if stat.S_ISBLK(mode):
        raise _refuse(path, "a block device (a disk is never written over)")
    raise _refuse(path, "not a regular file, FIFO or character device")


def check_target(path: Path, as_directory: bool = False) -> None:
    """Refuse, before any work, a path :func:`write_file` would refuse. A FIFO is not
    opened here: that waits for its reader."""
    kind, where = target_kind(path, as_directory)
    if kind == "file" and not where.parent.is_dir() and where.parent.exists():
        raise _refuse(path, f"{where.parent} is not a directory")


def check_apart(targets: Sequence[tuple[str, Path | None]],
                inputs: Sequence[Path | None] = ()) -> None:
    """Refuse, before any work, two outputs of one command naming the same file, or an
    output naming one of the command's own input files (``export p.yaml --out p.yaml``
    would replace the plan with a script). Standard output is checked elsewhere."""
    def same(a: Path, b: Path) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:  # one does not exist yet: compare where they would be
            return os.path.realpath(a.expanduser()) == os.path.realpath(b.expanduser())

    given = [(flag, path) for flag, path in targets if path is not None and not is_stdout(path)]
    for i, (flag, path) in enumerate(given):
        for other_flag, other in given[:i]:
            if same(path, other):
                raise InputError.single(flag, "", f"{other_flag} already writes {name(path)}: "
                                                  "give each output its own file")
        for source in inputs:
            if source is not None and not is_stdout(source) and same(path, source):
                raise InputError.single(flag, "", f"{name(path)} is this command's input: "
                                                  "write the output to another file")


def not_stdout(flag: str, path: Path | None, why: str) -> None:
    """Refuse ``-`` (standard output) for an output that must be a file or folder:
    ``FLAG: why``."""
    if is_stdout(path):
        raise InputError.single(flag, "", why)


def one_stdout(flag: str, path: Path | None, other_flag: str, other: Path | None) -> None:
    """Refuse two outputs both written to standard output."""
    if is_stdout(path) and is_stdout(other):
        raise InputError.single(flag, "", f"{other_flag} already writes to stdout ('-')")


def check_folder(flag: str, path: Path, why_not_stdout: str) -> None:
    """An output folder (made if need be), refused before any work: not stdout, not a
    file that exists."""
    not_stdout(flag, path, why_not_stdout)
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise InputError.single(flag, "", f"{name(path)} is not a directory")


def write_file(path: Path, data: bytes, executable: bool = False, as_directory: bool = False) -> None:
    """Write ``data`` to a file or stream ``path`` as the module doc says (not ``-``: the
    caller writes standard output); ``executable``: a new file gets the execute bits its
    read bits allow (a script run as ./name)."""
    kind, where = target_kind(path, as_directory)
    if kind == "stdout":
        raise ValueError("standard output is the caller's to write")
    if kind == "stream":
        try:
            with open(where, "wb") as fh:
                fh.write(data)
        except OSError as exc:
            raise _refuse(path, exc.strerror or str(exc)) from None
        return
    tmp: str | None = None
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where.parent, prefix=f".{where.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes the file 0600: give it the mode of the file it replaces, or the
        # one a plain open() would
        try:
            mode = stat.S_IMODE(os.stat(where).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        if executable:
            mode |= (mode & 0o444) >> 2
        os.chmod(tmp, mode)
        os.replace(tmp, where)
        tmp = None
    except OSError as exc:
        raise _refuse(path, exc.strerror or str(exc)) from None
    finally:
        if tmp is not None:  # the rename did not happen: leave nothing behind
            with contextlib.suppress(OSError):
                os.unlink(tmp)



def check_plot(plot: Path, as_directory: bool = False) -> None:
    """``--plot``: an image file (``check_image``), not stdout."""
    if is_stdout(plot):
        raise InputError.single("--plot", "", "expected a file, got '-'")
    check_image("--plot", plot, as_directory)


def is_png(path: Path) -> bool:
    return path.suffix.lower() == ".png"


def check_image(flag: str, path: Path, as_directory: bool = False) -> None:
    """An image output (``--plot``, ``--timeline``), refused before any work: a .svg (or
    ``-``, SVG to stdout, where the command allows it), or a .png with matplotlib (the png
    extra) installed; a path the command can write."""
    if not is_stdout(path) and path.suffix.lower() not in (".svg", ".png"):
        raise InputError.single(flag, "", f"expected a .svg or .png file, got {path}")
    if is_png(path):
        from autoplan.api.png import require_png

        try:
            require_png()
        except AutoplanError as exc:
            raise InputError.single(flag, "", str(exc)) from None
    check_target(path, as_directory)
