"""Every example plan says which launchers run it (`launchers:`, as `search --out` writes
it), and each of them exports it: the examples show plans people can launch, and a
what-if plan no launcher runs says so with `launchers: []`."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.descriptors.strict import read_yaml
from autoplan.export import export, launchers
from autoplan.plans.file import read_plan

PLANS = sorted((Path(__file__).resolve().parents[2] / "examples" / "plans").glob("*.yaml"))


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_an_example_plan_names_the_launchers_that_run_it_and_each_exports_it(path: Path) -> None:
    data = read_yaml(path)
    assert "launchers" in data, f"{path.name}: say which launchers run it (launchers: [...])"
    plan = read_plan(data, str(path), correct=False)
    assert list(launchers(plan)) == data["launchers"]
    for name in data["launchers"]:
        files = export(plan, name, str(path))
        assert files and all(text.strip() for text in files.values())


def test_most_example_plans_run_on_a_launcher() -> None:
    runs = [p.name for p in PLANS if read_yaml(p)["launchers"]]
    assert len(runs) >= len(PLANS) - 3, "the examples show launchable plans first"
