"""`autoplan check` (the CI gate for a committed plan) and `autoplan diff` as CI systems
and people meet them on the command line; tests/unit/test_check_diff.py has them as the
library returns them.

The commands run in this process (tests.helpers.autoplan), but for the checks that the
same input prints the same bytes: their second run is a new process (another hash seed).

Every regression search here is over at most 256 GPUs of a dense model: seconds on a CPU.
"""

from __future__ import annotations

import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    BEST,
    MALFORMED,
    NOT_DIVISIBLE,
    ONE_F_ONE_B,
    OOM,
    SLOW,
    ZB_V,
    autoplan,
    autoplan_subprocess,
)

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "examples" / "ci"
def junit(text: str) -> ET.Element:
    root = ET.fromstring(text)
    suites = root.findall("testsuite")
    assert root.tag == "testsuites" and len(suites) == 1
    assert suites[0].get("name") == "autoplan check"
    return suites[0]


def cases(suite: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name", ""): case for case in suite.findall("testcase")}


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- check: the command line

def test_check_passes_the_best_plan_with_exit_0() -> None:
    result = autoplan("check", BEST, "--space", "megatron", "--max-regression", "0.05")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS  regression" in result.stdout
    assert result.stdout.rstrip().endswith("check passed: 3 rules")


def test_check_fails_the_oom_plan_with_exit_1_naming_the_rule() -> None:
    result = autoplan("check", OOM)
    assert result.returncode == 1
    assert "FAIL  fits-memory" in result.stdout
    assert "check failed: 1 of 2 rules (fits-memory)" in result.stdout


def test_check_fails_the_slow_plan_naming_the_best_plan_and_the_gap() -> None:
    result = autoplan("check", SLOW, "--max-regression", "0.05")
    assert result.returncode == 1
    line = next(x for x in result.stdout.splitlines() if "regression" in x)
    assert line.lstrip().startswith("FAIL  regression")
    assert "% slower, more than 5.0% (best: dp4 tp1 pp1 cp2" in line


def test_check_of_a_malformed_plan_exits_2_with_file_and_field_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, MALFORMED)
    result = autoplan("check", path, "--max-regression", "0.05")
    assert result.returncode == 2
    assert result.stdout == ""  # text: the reason goes to stderr, as for every command
    assert f"autoplan: error: {path}: layout.tp: expected an integer" in result.stderr
    assert f"autoplan: error: {path}: schedul: unknown field (did you mean 'schedule'?)" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_of_a_missing_file_exits_2(tmp_path: Path) -> None:
    result = autoplan("check", tmp_path / "nope.yaml")
    assert result.returncode == 2
    assert "nope.yaml: file not found" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--max-regression", "-0.1"], "--max-regression"),
    (["--min-headroom", "-1"], "--min-headroom"),
    (["--space", "megatorn"], "did you mean 'megatron'"),
    (["--format", "xml"], "--format"),
])
def test_check_refuses_bad_options_with_exit_2(args: list[str], needle: str) -> None:
    result = autoplan("check", BEST, *args)
    assert result.returncode == 2
    assert needle in result.stderr and "Traceback" not in result.stderr


def test_junit_has_one_suite_one_case_per_rule_and_a_failure_per_failed_rule() -> None:
    result = autoplan("check", SLOW, "--max-regression", "0.05", "--min-headroom", "60", "-f", "junit")
    assert result.returncode == 1
    suite = junit(result.stdout)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "4", "2", "0", "0")
    by_name = cases(suite)
    assert list(by_name) == ["valid", "fits-memory", "headroom", "regression"]
    for name, case in by_name.items():
        failure = case.find("failure")
        assert (failure is not None) is (name in ("headroom", "regression")), name
        assert case.get("classname") == str(SLOW)
    failure = by_name["regression"].find("failure")
    assert failure is not None
    assert "more than 5.0% (best: dp4 tp1 pp1 cp2" in failure.get("message", "")


def test_junit_of_a_malformed_plan_still_reports_why_and_exits_2(tmp_path: Path) -> None:
    """CI uploads the report whatever the exit code: a bad file shows as an error in it
    (rule `valid`), the rules it could not check as skipped; the reason also goes to stderr."""
    path = write(tmp_path, MALFORMED)
    out = tmp_path / "reports" / "check.xml"
    result = autoplan("check", path, "--max-regression", "0.05", "-f", "junit", "-o", out)
    assert result.returncode == 2
    assert "layout.tp: expected an integer" in result.stderr
    suite = junit(out.read_text(encoding="utf-8"))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == (
        "3", "0", "1", "2")
    error = cases(suite)["valid"].find("error")
    assert error is not None and "layout.tp: expected an integer" in error.get("message", "")
    assert "schedul: unknown field" in (error.text or "")


def test_junit_escapes_what_comes_from_file_names(tmp_path: Path) -> None:
    path = write(tmp_path, OOM.read_text(encoding="utf-8"), 'odd <&"> plan.yaml')
    result = autoplan("check", path, "-f", "junit")
    assert result.returncode == 1
    suite = junit(result.stdout)
    assert {case.get("classname") for case in suite.findall("testcase")} == {str(path)}
    assert cases(suite)["fits-memory"].find("failure") is not None


def test_json_report_names_every_rule_and_the_best_plan() -> None:
    result = autoplan("check", SLOW, "--max-regression", "0.05", "--format", "json")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["status"] == "failed" and doc["failed"] == ["regression"]
    assert [r["rule"] for r in doc["rules"]] == ["valid", "fits-memory", "regression"]
    reg = doc["regression"]
    assert reg["space"] == "launchable" and reg["max_regression"] == 0.05 and reg["gap"] > 0.05
    assert reg["best"]["layout"]["pp"] == 1
    assert reg["best"]["prediction"]["step_time_s"] * (1 + reg["gap"]) == pytest.approx(
        doc["prediction"]["step_time_s"])


@pytest.mark.parametrize("fmt", ["text", "json", "junit"])
def test_check_output_is_the_same_bytes_every_time(fmt: str) -> None:
    runs = [run("check", SLOW, "--max-regression", "0.05", "--min-headroom", "60", "-f", fmt)
            for run in (autoplan, autoplan_subprocess)]
    assert runs[0].returncode == runs[1].returncode == 1
    assert runs[0].stdout == runs[1].stdout


def test_out_writes_the_report_and_the_log_gets_the_text(tmp_path: Path) -> None:
    out = tmp_path / "check.xml"
    result = autoplan("check", BEST, "--space", "megatron", "-r", "0.05", "-f", "junit", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "check passed" in result.stdout
    assert junit(out.read_text(encoding="utf-8")).get("failures") == "0"


# --------------------------------------------------------------------------- check: the CI examples

def _check_commands(text: str) -> list[list[str]]:
    return [shlex.split(cmd) for cmd in text.split("\n") if cmd.strip().startswith("autoplan check")]


def _run_example(command: list[str], tmp_path: Path) -> tuple[ET.Element, str]:
    """Run an example's `autoplan check` with its report written under tmp_path."""
    args = command[1:]
    out_at = args.index("--out") + 1
    report_path = args[out_at]
    args[out_at] = str(tmp_path / report_path)
    result = autoplan(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "junit" == args[args.index("--format") + 1]
    return junit((tmp_path / report_path).read_text(encoding="utf-8")), report_path


def test_the_github_actions_example_runs_check_and_reports_its_junit_file(tmp_path: Path) -> None:
    doc = yaml.safe_load((CI / "github-actions.yml").read_text(encoding="utf-8"))
    assert "on" in doc or True in doc  # PyYAML reads the key `on` as a boolean
    steps = [step for job in doc["jobs"].values() for step in job["steps"]]
    commands = [c for step in steps for c in _check_commands(step.get("run", ""))]
    assert len(commands) == 1
    suite, report = _run_example(commands[0], tmp_path)
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    uses = {step["uses"].split("@")[0]: step for step in steps if "uses" in step}
    assert uses["actions/upload-artifact"]["with"]["path"] == report
    assert uses["mikepenz/action-junit-report"]["with"]["report_paths"] == report
    for name in ("actions/upload-artifact", "mikepenz/action-junit-report"):
        assert "cancelled()" in uses[name]["if"]  # the report is kept when the check fails


def test_the_gitlab_example_runs_check_and_reports_its_junit_file(tmp_path: Path) -> None:
    doc = yaml.safe_load((CI / "gitlab-ci.yml").read_text(encoding="utf-8"))
    job = doc["autoplan-check"]
    commands = [c for line in job["script"] for c in _check_commands(line)]
    assert len(commands) == 1
    suite, report = _run_example(commands[0], tmp_path)
    assert suite.get("tests") == "4" and suite.get("failures") == "0"
    assert job["artifacts"]["reports"]["junit"] == report
    assert job["artifacts"]["when"] == "always"


# --------------------------------------------------------------------------- diff

def test_diff_json_is_stable_and_keeps_a_and_b_apart() -> None:
    runs = [run("diff", ONE_F_ONE_B, ZB_V, "--format", "json") for run in (autoplan, autoplan_subprocess)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    doc = json.loads(runs[0].stdout)
    assert doc["a"] == str(ONE_F_ONE_B) and doc["b"] == str(ZB_V)
    assert doc["changes"] == [{"field": "layout.vpp", "a": 1, "b": 2},
                              {"field": "schedule", "a": "1f1b", "b": "zb-v"}]
    assert doc["feasible"] == {"a": True, "b": True}
    row = next(x for x in doc["deltas"] if x["metric"] == "step_time_s")
    assert set(row) == {"metric", "unit", "a", "b", "change", "relative"} and row["unit"] == "s"


def test_diff_table_for_people() -> None:
    result = autoplan("diff", ONE_F_ONE_B, ZB_V)
    assert result.returncode == 0, result.stderr
    for needle in ("what changed", "layout.vpp", "zb-v", "what it does to the prediction",
                   "breakdown_s.bubble", "memory_gib_per_stage[3].peak", "B against A: step"):
        assert needle in result.stdout, needle


def test_diff_reports_the_problems_of_both_files_at_once_with_exit_2(tmp_path: Path) -> None:
    a = write(tmp_path, MALFORMED, "a.yaml")
    b = write(tmp_path, NOT_DIVISIBLE, "b.yaml")
    result = autoplan("diff", a, b)
    assert result.returncode == 2 and result.stdout == ""
    assert f"{a}: layout.tp: expected an integer" in result.stderr
    assert f"{b}: micro_batch: dp*micro_batch" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["check", "diff"])
def test_check_and_diff_have_a_help_that_exits_zero(command: str) -> None:
    result = autoplan(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout and "exit" in result.stdout


# --------------------------------------------------------------------------- issue 47: output hygiene

# characters a file name or a runs log's cell may hold that a report must not carry raw: a
# bidi override (reorders what a CI page shows), line and paragraph separators and C1's
# NEL (line breaks to some renderers), C0 controls (not XML 1.0 at all), ESC
ODD = "\u202e\u2028\u2029\u0085\x01\x1b"


def _raw_free(text: str) -> None:
    for ch in ODD:
        assert ch not in text, repr(ch)


def test_json_of_a_file_name_that_is_not_utf8_is_valid_utf8_json(tmp_path: Path) -> None:
    """A name of bytes that are not UTF-8 reaches Python as lone surrogates, which JSON
    readers such as jq refuse as escapes and UTF-8 cannot encode: they are written as
    their escape text, as the terminal shows them."""
    import os

    path = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/odd\xed\xa0\x80\xff.yaml"))
    path.write_bytes(OOM.read_bytes())
    result = autoplan("check", path, "-f", "json")
    assert result.returncode == 1
    result.stdout.encode("utf-8")  # no surrogate left to encode
    assert "\\ud" not in result.stdout.replace("\\\\ud", "")  # no surrogate escape either
    doc = json.loads(result.stdout)
    assert doc["plan"].endswith("odd\\udced\\udca0\\udc80\\udcff.yaml")


def test_json_output_never_holds_a_lone_surrogate_or_a_bare_nan() -> None:
    from autoplan.cli.output import json_text

    text = json_text({"a\udc80": ["x\ud800y", float("nan"), float("inf"), 1.5, "\U0001f600"], "b": None})
    text.encode("utf-8")
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert doc == {"a\\udc80": ["x\\ud800y", None, None, 1.5, "\U0001f600"], "b": None}
    assert json_text({"ok": 1.0}) == '{\n  "ok": 1.0\n}\n'  # the common case as before


def test_junit_shows_bidi_overrides_separators_and_controls_of_file_names_as_escapes(tmp_path: Path) -> None:
    path = write(tmp_path, OOM.read_text(encoding="utf-8"), f"odd{ODD}.yaml")
    for fmt in ("junit", "json", "text"):
        result = autoplan("check", path, "-f", fmt)
        assert result.returncode == 1, result.stderr
        _raw_free(result.stdout)
    result = autoplan("check", path, "-f", "junit")
    suite = junit(result.stdout)
    shown = "odd\\u202e\\u2028\\u2029\\x85\\x01\\x1b.yaml"
    assert {case.get("classname") for case in suite.findall("testcase")} == {str(tmp_path / shown)}


def test_junit_shows_a_runs_logs_time_column_as_escapes(tmp_path: Path) -> None:
    import csv
    import io

    source = ROOT / "examples" / "runs" / "tiny-llama-2cpu.csv"
    rows = list(csv.DictReader(io.StringIO(source.read_text(encoding="utf-8"))))
    for row in rows:
        row["time"] = f"2026-11-27{ODD}T09:26:09"
    runs = tmp_path / "runs.csv"
    with runs.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plan = ROOT / "examples" / "runs" / "tiny-llama-best.yaml"
    result = autoplan("check", plan, "--runs", runs, "-f", "junit")
    if result.returncode == 2:  # the runs log refuses such a time itself: nothing raw in its error
        _raw_free(result.stderr)
        return
    assert result.returncode == 0, result.stderr
    _raw_free(result.stdout)
    suite = junit(result.stdout)
    text = cases(suite)["measured"].findtext("system-out") or ""
    assert "2026-11-27\\u202e\\u2028\\u2029\\x85\\x01\\x1bT09:26:09" in text
