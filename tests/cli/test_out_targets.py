"""What `--out`, `--plot`, `--timeline` and `--describe` do with what is already at the
path (autoplan/cli/files.py): a regular file is replaced whole, a link is followed, a
FIFO or character device is written through, `-` is stdout, and a directory, socket or
block device is refused with exit 2 before any work. Never a temporary file left over."""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import BEST, autoplan, autoplan_subprocess

SEARCH = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "-b", "64", "-s", "4096",
          "--top", "2")
WHATIF = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8,16", "-b", "64", "-s", "4096",
          "--top", "2", "--train-tokens", "1e11")


def _plan_doc(text: str) -> dict:
    doc = yaml.safe_load(text)
    assert doc["autoplan"] and doc["layout"]["dp"] >= 1
    return doc


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "plan.yaml"
    target.write_text("old")
    target.chmod(0o640)
    r = autoplan(*SEARCH, "--out", target)
    assert r.returncode == 0, r.stderr
    _plan_doc(target.read_text())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["plan.yaml"]


def test_a_link_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_text("old")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    r = autoplan(*SEARCH, "--out", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    _plan_doc(real.read_text())


def test_a_dangling_link_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.yaml"
    link.symlink_to(tmp_path / "new.yaml")
    r = autoplan(*SEARCH, "--out", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    _plan_doc((tmp_path / "new.yaml").read_text())


@pytest.mark.parametrize("flag", ["--out", "--plot"])
def test_a_fifo_is_written_through_to_its_reader(tmp_path: Path, flag: str) -> None:
    fifo = tmp_path / "pipe.svg"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    r = autoplan(*WHATIF, flag, fifo)
    reader.join(timeout=30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, not renamed over
    text = got[0].decode()
    if flag == "--out":
        _plan_doc(text)
    else:
        assert text.startswith("<svg") or text.startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["pipe.svg"]


def test_a_link_to_dev_null_writes_through_and_leaves_dev_null_alone(tmp_path: Path) -> None:
    link = tmp_path / "null.yaml"
    link.symlink_to("/dev/null")
    before = os.stat("/dev/null")
    r = autoplan(*SEARCH, "--out", link)
    assert r.returncode == 0, r.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_mode == before.st_mode
    assert link.is_symlink() and [p.name for p in tmp_path.iterdir()] == ["null.yaml"]


def test_dev_stdout_and_dash_write_the_plan_to_stdout_and_the_table_to_stderr() -> None:
    for target in ("/dev/stdout", "-"):
        r = autoplan_subprocess(*SEARCH, "--out", target)
        assert r.returncode == 0, r.stderr
        if target == "-":  # the table moves out of the way of the file
            _plan_doc(r.stdout)
            assert "tokens/s" in r.stderr
        else:  # the device is the same stdout the table goes to: the plan comes first
            assert r.stdout.startswith("autoplan:") and "tokens/s" in r.stdout


def test_dash_with_json_keeps_the_json_on_stderr() -> None:
    r = autoplan(*SEARCH, "--out", "-", "-f", "json")
    assert r.returncode == 0, r.stderr
    _plan_doc(r.stdout)
    assert '"plans"' in r.stderr


def test_out_and_plot_cannot_both_be_stdout() -> None:
    r = autoplan(*WHATIF, "--out", "-", "--plot", "-")
    assert r.returncode == 2 and "--plot" in r.stderr and "stdout" in r.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_device_that_refuses_the_write_is_bad_input_without_a_traceback() -> None:
    r = autoplan(*SEARCH, "--out", "/dev/full")
    assert r.returncode == 2, r.stderr
    assert "/dev/full: cannot write: No space left on device" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("kind", ["directory", "socket"])
@pytest.mark.parametrize("command", ["search", "whatif-plot", "check", "explain", "bench"])
def test_what_cannot_be_written_is_refused_before_any_work(
        tmp_path: Path, kind: str, command: str) -> None:
    target = tmp_path / "target.svg"
    server = None
    if kind == "directory":
        target.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
    args = {
        "search": (*SEARCH, "--out", target),
        "whatif-plot": (*WHATIF, "--plot", target),
        "check": ("check", BEST, "--max-regression", "5", "--out", target),
        "explain": ("explain", BEST, "--timeline", target),
        "bench": ("bench", "--device", "cpu", "--out", target),
    }[command]
    start = time.perf_counter()
    try:
        r = autoplan(*args)
    finally:
        if server is not None:
            server.close()
    assert time.perf_counter() - start < 1.0  # before any search, simulation or measurement
    assert r.returncode == 2, r.stderr
    assert f"{target}: cannot write" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_export_to_dash_prints_and_scripts_in_a_directory_are_executable(tmp_path: Path) -> None:
    r = autoplan("export", BEST, "--to", "megatron", "--out", "-")
    assert r.returncode == 0, r.stderr
    assert "torchrun" in r.stdout or "pretrain_gpt.py" in r.stdout
    r = autoplan("export", BEST, "--to", "slurm", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    scripts = [p for p in tmp_path.iterdir() if p.suffix in (".sh", ".sbatch")]
    assert scripts and all(p.stat().st_mode & 0o100 for p in scripts)


def test_a_png_timeline_without_matplotlib_fails_before_printing(tmp_path: Path) -> None:
    try:
        import matplotlib  # noqa: F401
        pytest.skip("matplotlib is installed")
    except ImportError:
        pass
    r = autoplan("explain", BEST, "--timeline", tmp_path / "t.png")
    assert r.returncode == 2 and "PNG needs matplotlib" in r.stderr
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


# issue 34, item 8: an output over the command's own input, or two outputs on one file
def test_an_output_never_replaces_the_commands_input_or_another_output(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(BEST.read_text())
    before = plan.read_text()
    for args, flag, needle in [
        (("export", plan, "--to", "megatron", "--out", plan), "--out", "is this command's input"),
        (("check", plan, "--out", plan), "--out", "is this command's input"),
        (("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096",
          "--train-tokens", "1e12", "--plot", tmp_path / "x.svg", "--out", tmp_path / "x.svg"),
         "--plot", "--out already writes"),
    ]:
        r = autoplan(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert f"{flag}: " in r.stderr and needle in r.stderr, r.stderr
    assert plan.read_text() == before
    assert not (tmp_path / "x.svg").exists()


# issue 53, item 3: the output checks moved to the library (autoplan.api.outputs), whose
# messages are plain text: a path with brackets was named markup-escaped ("a\[b]/x.svg")
def test_a_refused_output_is_named_as_given_even_with_brackets(tmp_path: Path) -> None:
    folder = tmp_path / "a[b]"
    folder.mkdir()
    target = folder / "x.svg"
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "-b", "8", "-s", "4096",
                 "--train-tokens", "1e12", "--plot", target, "--out", target)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"autoplan: error: --plot: --out already writes {target}: "
                                "give each output its own file")
