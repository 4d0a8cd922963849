"""Writing shell scripts that cannot be broken by what a plan contains.

Every value a plan carries (a model name with quotes, spaces or ``$(...)``) goes
through ``shlex.quote``; text that lands in a comment loses its line breaks, so it
cannot end the comment and start a command.

Pure text, on the base floor beside :mod:`autoplan.text`: the launchers' exports
(``autoplan/export/``) and the serving engines' launch files (``autoplan/export/engines/``)
write their scripts with it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from autoplan.text import one_line

Arg = tuple[str, ...]  # one flag and its values: ("--num-layers", "32") or ("--swiglu",)


def quote(value: object) -> str:
    return shlex.quote(str(value))


def comment(text: str) -> str:
    """One comment line: what could end the line or drive a terminal becomes a space
    (``strict.one_line``). Loaded names hold none (``Fields.name``); paths and plans built
    in code may."""
    return "# " + one_line(text)


def slug(text: str) -> str:
    """A name safe as a path component or a Slurm job name: [A-Za-z0-9._-] only."""
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return out or "run"


def bash_array(name: str, args: Sequence[Arg], indent: str = "    ") -> str:
    """``NAME=( ... )`` with one flag (and its values) per line, every word quoted."""
    if not args:
        return f"{name}=()"
    lines = [f"{name}=("]
    lines += [indent + " ".join(quote(word) for word in arg) for arg in args]
    lines.append(")")
    return "\n".join(lines)


def continued(words: Sequence[str], indent: str = "    ") -> str:
    """Words already quoted (or deliberate expansions) as one command over several lines."""
    return (" \\\n" + indent).join(words)


def launch_tail(run_name: str, words: Sequence[str]) -> list[str]:
    """A launch script's last lines: the run's name, said on stderr, then the command
    (``words``, already quoted)."""
    return [f"RUN_NAME={quote(run_name)}", "", 'echo "autoplan: launching $RUN_NAME" >&2',
            continued(words), ""]
