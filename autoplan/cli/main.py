"""`autoplan`: thin commands that parse, call the library and render."""

from __future__ import annotations

import contextlib
import copy
import os
import sys

import typer

from autoplan.cli import output
from autoplan.cli.app import app

# the commands, each registering itself on ``app`` as it is imported
from autoplan.cli.commands import (  # noqa: E402,F401,I001
    bench,
    calibrate,
    check,
    diff,
    evaluate,
    explain,
    export,
    hardware,
    models,
    profiles,
    runs,
    search,
    serve,
    tune,
    validate,
)
from autoplan.errors import AutoplanError


def _one_paragraph_lines(app: typer.Typer) -> None:
    """Each command's help from its docstring with every paragraph on one line: typer keeps
    a docstring's line breaks, which the command list then shows mid-sentence."""
    import inspect

    for info in app.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)




_one_paragraph_lines(app)


def _usage_errors() -> tuple[type[Exception], ...]:
    """Click's usage-error base classes: recent typer vendors click as ``typer._click``,
    whose exceptions derive from ``typer.TyperException``, not ``click.ClickException``."""
    found: list[type[Exception]] = []
    with contextlib.suppress(ImportError):
        import click

        found.append(click.exceptions.ClickException)
    vendored = getattr(typer, "TyperException", None)
    if isinstance(vendored, type) and issubclass(vendored, Exception):
        found.append(vendored)
    return tuple(found)


_TYPER_WORDING = (  # typer's validation messages, reworded as autoplan's read
    ("a valid number, unable to parse string as a number", "a number"),
    ("a valid integer, unable to parse string as an integer", "a whole number"),
    ("a valid integer, got a number with a fractional part", "a whole number"),
    ("greater than or equal to ", "a value >= "), ("less than or equal to ", "a value <= "),
    ("greater than ", "a value > "), ("less than ", "a value < "),
)


def _given(opts: list[str]) -> str | None:
    """The value given on the command line for the option named by ``opts``, if any: the
    last one given, as click keeps the last of a repeated option and refuses that one
    (``--top 3 ... --top -5`` refuses -5). Spelled ``--top 5``, ``--top=5``, ``-k 5`` or
    ``-k5``; nothing after ``--`` is an option."""
    argv = sys.argv[1:]
    if "--" in argv:
        argv = argv[:argv.index("--")]
    found = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        for opt in opts:
            if arg == opt and i + 1 < len(argv):
                found = argv[i + 1]
                i += 1  # the value is not read as an option
                break
            if opt.startswith("--") and arg.startswith(opt + "="):
                found = arg[len(opt) + 1:]
                break
            if len(opt) == 2 and opt[0] == "-" and opt[1] != "-" and arg.startswith(opt) and len(arg) > 2:
                found = arg[2:]
                break
        i += 1
    return found


def _usage_message(exc: Exception) -> list[str]:
    """A usage error (a flag's value that does not parse, a missing argument, an unknown
    option) in the one format every error has, ``FLAG: what was expected, got VALUE``,
    then where the command's help is."""
    from autoplan.descriptors.strict import shown

    param = getattr(exc, "param", None)
    message = str(getattr(exc, "message", "") or "").strip().rstrip(".")
    opts = [str(o) for o in (getattr(param, "opts", None) or [])]
    kind = type(exc).__name__
    if message.startswith("Input should be "):
        message = message[len("Input should be "):]
        for theirs, ours in _TYPER_WORDING:
            message = message.replace(theirs, ours)
        message = "expected " + message
    elif message.startswith("Value error, ") and " is not one of " in message:
        choices = message.split(" is not one of ", 1)[1].replace("'", "")
        message = f"expected one of {choices}"
    elif message[:1].isupper() and not message[1:2].isupper():
        message = message[0].lower() + message[1:]
    if kind == "MissingParameter":
        head = (f"{max(opts, key=len)}: required" if opts and opts[0].startswith("-")
                else f"{getattr(param, 'metavar', None) or (opts or ['an argument'])[0]}: missing argument")
    elif kind == "NoSuchOption":
        close = list(getattr(exc, "possibilities", None) or [])
        head = (f"{getattr(exc, 'option_name', '')}: no such option"
                + (f"; did you mean {' or '.join(close[:2])}?" if close else ""))
    elif kind == "BadOptionUsage" and getattr(exc, "option_name", None):
        head = f"{exc.option_name}: expected a value"  # type: ignore[attr-defined]
    elif opts:
        value = _given(opts)
        head = f"{max(opts, key=len)}: {message}" + (f", got {shown(value)}" if value is not None else "")
        if hint := getattr(exc, "autoplan_hint", None):  # what the value means elsewhere
            head += f": {hint}"
    else:
        head = message or kind
    # the subcommands' names from the context (click names the program itself after how
    # Python was started: python -m ...)
    names: list[str] = []
    ctx = getattr(exc, "ctx", None)
    while ctx is not None and getattr(ctx, "parent", None) is not None:
        names.append(str(ctx.info_name))
        ctx = ctx.parent
    command = " ".join(["autoplan", *reversed(names)]) if names else None
    if not command:
        known = {_command_name(c) for c in app.registered_commands} | {
            c.callback.__name__ for c in app.registered_commands if c.callback}
        given = sys.argv[1] if len(sys.argv) > 1 else ""
        command = f"autoplan {given}" if given in known else "autoplan"
    return [head, f"see '{command} --help'"]


def _command_name(command: typer.models.CommandInfo) -> str | None:
    """The name a registered command is typed by: its own, or its function's as typer
    names it (``typer.main.get_command_name``: lower case, dashes for underscores)."""
    if command.name:
        return command.name
    return typer.main.get_command_name(command.callback.__name__) if command.callback else None


def _only_the_command(args: list[str]) -> typer.Typer:
    """``app`` holding only the command (or command group) ``args`` name, with the root
    options: typer builds a click command from every registered function's signature, about
    60 ms for all 16 of a process that runs one (measured with cProfile). Without such a name
    (``--help``, a typo the error message suggests a command for), the whole app."""
    name = next((a for a in args if not a.startswith("-")), None)
    if name is None:
        return app
    commands = [c for c in app.registered_commands if _command_name(c) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if not commands and not groups:
        return app
    only = copy.copy(app)
    only.registered_commands, only.registered_groups = commands, groups
    return only


def main() -> None:
    """Entry point: one error handler turns a known error into one message and its exit code."""
    try:
        # returns typer.Exit's code instead of raising it
        code = _only_the_command(sys.argv[1:])(standalone_mode=False)
    except AutoplanError as exc:
        if os.environ.get("AUTOPLAN_DEBUG"):
            raise
        for line in str(exc).splitlines():
            output.err.print(f"autoplan: error: {line}", markup=False)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        output.err.print("autoplan: aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors and the like
        if isinstance(exc, _usage_errors()):
            for line in _usage_message(exc):
                output.err.print(f"autoplan: error: {line}", markup=False)
            sys.exit(2)
        raise
    sys.exit(code if isinstance(code, int) else 0)


def run() -> None:
    """The ``autoplan`` program: :func:`main`, then the process ends with its exit code
    without the interpreter's teardown. A search leaves its memoized costs (autoplan.caches)
    for the next question rather than freeing them as it ends; a process that has answered
    its one question would free them object by object at exit: a second of the README's
    pooled search (3.2 s to 4.4 s, measured). Output is flushed first; an uncaught
    exception still ends as Python ends it (its traceback, exit 1)."""
    try:
        main()
        code: int = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            print(exc.code, file=sys.stderr)
            code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more reaches it
            pass
    os._exit(code)


if __name__ == "__main__":
    run()
