"""`autoplan check` (the CI gate for a committed plan) and `autoplan diff`, as the library
returns them; tests/cli/test_check_diff_cli.py has them as CI systems and people meet
them on the command line.

Every regression search here is over at most 256 GPUs of a dense model: seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoplan.commands.check import Rule, Status, check_plan
from autoplan.commands.diff import diff_plans
from autoplan.descriptors.space import load_space
from autoplan.descriptors.strict import read_yaml
from autoplan.plans.file import read_plan
from tests.helpers import BEST, MALFORMED, NOT_DIVISIBLE, ONE_F_ONE_B, OOM, SLOW, ZB_V

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- check: the library

def test_the_searched_best_plan_passes_a_five_percent_gate_in_its_own_space() -> None:
    report = check_plan(BEST, space=load_space("megatron"), max_regression=0.05)
    assert report.exit_code == 0 and report.passed
    assert [r.rule for r in report.rules] == [Rule.VALID, Rule.FITS_MEMORY, Rule.REGRESSION]
    assert all(r.status is Status.PASSED for r in report.rules)
    assert report.regression is not None and report.regression.best is not None
    assert report.prediction is not None
    gap = report.regression.gap(report.prediction.step_time_s)
    assert gap is not None and abs(gap) < 1e-9  # it is the best the search finds


def test_a_plan_that_does_not_fit_fails_fits_memory_and_names_the_numbers() -> None:
    report = check_plan(OOM, space=load_space("default"))
    assert report.exit_code == 1
    assert [r.rule for r in report.failed] == [Rule.FITS_MEMORY]
    rule = report.failed[0]
    assert "1357.4 GiB exceeds h100-sxm (80.0 GiB" in rule.message
    assert "3.0 GiB reserve" in rule.message  # the peak includes the device's reserve
    assert rule.details and "optimizer 788.5" in rule.details[0]


def test_a_slow_plan_fails_the_regression_gate_naming_the_best_plan_and_the_gap() -> None:
    report = check_plan(SLOW, space=load_space("default"), max_regression=0.05)
    assert report.exit_code == 1
    assert [r.rule for r in report.failed] == [Rule.REGRESSION]
    assert report.regression is not None and report.regression.best is not None
    assert report.prediction is not None
    gap = report.regression.gap(report.prediction.step_time_s)
    assert gap is not None and gap > 0.3
    best = report.regression.best
    assert best.prediction.step_time_s * 1.05 < report.prediction.step_time_s
    assert f"{gap:.1%} slower, more than 5.0%" in report.failed[0].message
    assert best.plan.layout.pp == 1  # the search beats the pipeline with plain data parallelism


def test_a_looser_gate_passes_the_slow_plan() -> None:
    report = check_plan(SLOW, space=load_space("default"), max_regression=1.0)
    assert report.exit_code == 0
    assert "slower, within 100.0%" in report.rules[-1].message


def test_every_failed_rule_is_reported_not_only_the_first() -> None:
    report = check_plan(SLOW, space=load_space("default"), max_regression=0.05, min_headroom_gib=60)
    assert [r.rule.value for r in report.rules] == ["valid", "fits-memory", "headroom", "regression"]
    assert [r.rule.value for r in report.failed] == ["headroom", "regression"]
    headroom = report.failed[0]
    assert "+ 60.0 GiB headroom exceeds" in headroom.message
    assert [d.split(":")[0] for d in headroom.details] == ["stage 0", "stage 3"]  # every stage over


def test_headroom_passes_when_every_stage_leaves_that_much_free() -> None:
    report = check_plan(BEST, space=load_space("default"), min_headroom_gib=10)
    assert report.exit_code == 0
    assert [r.rule for r in report.rules] == [Rule.VALID, Rule.FITS_MEMORY, Rule.HEADROOM]
    assert check_plan(BEST, space=load_space("default"), min_headroom_gib=12).exit_code == 1


def test_a_search_that_finds_nothing_that_fits_leaves_the_committed_plan_the_best_known(
        tmp_path: Path) -> None:
    space = write(tmp_path, yaml.safe_dump({"searchspace": {
        "name": "dp-only", "tp": {"max": 1}, "pp_max": 1, "cp_max": 1, "vpp_max": 1,
        "micro_batch": [1], "schedules": ["1f1b"], "recompute": ["none"], "zero": [0],
        "sequence_parallel": [False]}}), "dp-only.yaml")
    report = check_plan(OOM, space=load_space(str(space)), max_regression=0.05)
    regression = report.rules[-1]
    assert regression.rule is Rule.REGRESSION and regression.status is Status.PASSED
    assert "finds no plan that fits" in regression.message
    assert report.exit_code == 1  # fits-memory still fails


def test_a_malformed_plan_is_reported_as_bad_input_with_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, MALFORMED)
    report = check_plan(path, space=load_space("default"), max_regression=0.05)
    assert report.exit_code == 2 and report.bad_input
    valid, *rest = report.rules
    assert valid.status is Status.ERROR
    lines = (valid.message, *valid.details)
    assert any(f"{path}: layout.tp: expected an integer" in line for line in lines)
    assert any(f"{path}: schedul: unknown field" in line for line in lines)
    assert [(r.rule, r.status) for r in rest] == [(Rule.FITS_MEMORY, Status.SKIPPED),
                                                  (Rule.REGRESSION, Status.SKIPPED)]


def test_a_layout_that_does_not_divide_is_bad_input_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, NOT_DIVISIBLE)
    report = check_plan(path, space=load_space("default"))
    assert report.exit_code == 2
    lines = (report.rules[0].message, *report.rules[0].details)
    assert any(f"{path}: micro_batch: dp*micro_batch = 2*3 must divide" in line for line in lines)


def test_negative_or_nan_limits_are_bad_input() -> None:
    from autoplan.errors import InputError

    with pytest.raises(InputError, match="--max-regression"):
        check_plan(BEST, space=load_space("default"), max_regression=float("nan"))
    with pytest.raises(InputError, match="--min-headroom"):
        check_plan(BEST, space=load_space("default"), min_headroom_gib=-1.0)


# --------------------------------------------------------------------------- diff

def _plan(path: Path) -> Any:
    return read_plan(read_yaml(path), str(path))


def test_diff_names_only_what_changed_and_what_it_does_to_time_and_memory() -> None:
    d = diff_plans(_plan(ONE_F_ONE_B), _plan(ZB_V))
    assert [(c.field, c.a, c.b) for c in d.changes] == [("layout.vpp", 1, 2), ("schedule", "1f1b", "zb-v")]
    deltas = {x.metric: x for x in d.deltas}
    step = deltas["step_time_s"]
    assert step.change is not None and step.relative is not None
    assert step.change == pytest.approx(d.prediction_b.step_time_s - d.prediction_a.step_time_s)
    assert step.relative == pytest.approx(step.change / d.prediction_a.step_time_s)
    assert deltas["breakdown_s.bubble"].change < 0 < deltas["memory_gib.activations"].change  # type: ignore[operator]
    assert {f"memory_gib_per_stage[{s}].peak" for s in range(4)} <= set(deltas)
    for key in ("tokens_per_s", "mfu", "memory_gib.peak", "memory_gib.weights", "breakdown_s.compute"):
        assert key in deltas


def test_diff_of_a_plan_with_itself_is_empty_and_every_delta_is_zero() -> None:
    d = diff_plans(_plan(SLOW), _plan(SLOW))
    assert d.changes == ()
    assert all(x.change == 0 for x in d.deltas)


def test_diff_across_models_clusters_and_pipeline_depths() -> None:
    d = diff_plans(_plan(SLOW), _plan(OOM))
    fields = {c.field: (c.a, c.b) for c in d.changes}
    assert fields["model.name"] == ("llama3-8b", "llama3-70b")
    assert fields["model.layers"] == (32, 80)
    assert fields["cluster.nodes"] == (1, 32) and fields["gpus"] == (8, 256)
    assert fields["job.global_batch"] == (64, 1024)
    assert fields["layout.pp"] == (4, 1) and fields["stages"] == ((8, 8, 8, 8), (80,))
    assert fields["recompute"] == ("full", "none") and fields["sequence_parallel"] == (True, False)
    stage3 = next(x for x in d.deltas if x.metric == "memory_gib_per_stage[3].peak")
    assert stage3.b is None and stage3.change is None and stage3.relative is None
