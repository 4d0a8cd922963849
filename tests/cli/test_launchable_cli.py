"""`autoplan search` answers with plans people can launch: the README's first command prints
plans each with a launcher, and its first plan exports; `--launcher` keeps one launcher's,
`--space any` the launcher-free search, `--export DIR` writes the best plan's launch files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import autoplan

# the README's first command
README_SEARCH = ("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "256",
                 "--global-batch", "1024", "--seq-len", "8192")
SMALL = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "16", "-b", "64", "-s", "4096")


@pytest.fixture(scope="module")
def readme(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    folder = tmp_path_factory.mktemp("launch")
    return autoplan(*README_SEARCH, "--format", "json", "--export", folder), folder


def test_the_readme_command_ranks_only_plans_a_launcher_runs(
        readme: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    result, _ = readme
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert len(plans) == 10
    assert all(p["launchers"] for p in plans)
    assert all(p["space"] == "launchable" for p in plans)


def test_the_readme_commands_first_plan_exports_to_its_first_launcher(
        readme: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path) -> None:
    result, folder = readme
    first = json.loads(result.stdout)["plans"][0]
    saved = tmp_path / "plan.yaml"
    saved.write_text(yaml.safe_dump(first))
    out = autoplan("export", saved, "--to", first["launchers"][0], "--out", f"{tmp_path}/launch/")
    assert out.returncode == 0, out.stderr
    # search --export wrote the same files in one step, and the plan beside them
    written = sorted(p.name for p in folder.iterdir())
    assert written == sorted(["plan.yaml", *(p.name for p in (tmp_path / "launch").iterdir())])
    for path in (tmp_path / "launch").iterdir():
        assert (folder / path.name).read_text() == path.read_text()
    assert yaml.safe_load((folder / "plan.yaml").read_text())["layout"] == first["layout"]


def test_launcher_keeps_the_plans_of_one_launcher_in_its_own_space() -> None:
    result = autoplan(*SMALL, "--launcher", "torchtitan", "--format", "json", "--top", "5")
    assert result.returncode == 0, result.stderr
    plans = json.loads(result.stdout)["plans"]
    assert plans and all("torchtitan" in p["launchers"] for p in plans)
    assert all(p["space"] == "torchtitan" for p in plans)


def test_space_any_is_the_launcher_free_search_and_says_so() -> None:
    result = autoplan(*SMALL, "--space", "any", "--top", "3")
    assert result.returncode == 0, result.stderr
    assert "space any: launcher-free" in " ".join(result.stdout.split())
    assert "runs on (export --to):" in result.stdout


def test_the_default_table_names_each_plans_launchers() -> None:
    result = autoplan(*SMALL, "--top", "3")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "space launchable" in text and "megatron, nemo" in text
    assert "runs on (export --to):" not in result.stdout


@pytest.mark.parametrize(("args", "says"), [
    (("--launcher", "megatron", "--space", "any"), "--launcher: --space names the space already"),
    (("--launcher", "slurmish"), "--launcher: unknown launcher 'slurmish'"),
    (("--export", "-"), "--export: writes a folder of launch files, not stdout"),
])
def test_launcher_and_export_misuse_exits_2_naming_the_flag(args: tuple[str, ...], says: str) -> None:
    result = autoplan(*SMALL, *args)
    assert result.returncode == 2
    assert says in result.stderr and "Traceback" not in result.stderr


def test_export_to_a_file_is_refused_before_the_search(tmp_path: Path) -> None:
    target = tmp_path / "plan.txt"
    target.write_text("mine")
    result = autoplan(*SMALL, "--export", target)
    assert result.returncode == 2 and "--export" in result.stderr and "not a directory" in result.stderr
    assert target.read_text() == "mine"
