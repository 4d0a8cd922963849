"""The runs log under hostile and newcomer input (issue 47): numbers held to one range
where they are read and where they are written, readers whose cost does not grow with the
rows (each distinct plan built and predicted once, row counts refused before anything is
built), cells a spreadsheet would run as formulas escaped and read back exactly, repeated
columns and JSON keys refused, a user's own CSV appended to, the runs-based correction
only from comparable runs, and the loop's flag vocabulary. Each reject path: exit 2, the
file named, in well under a second of CPU and bounded memory, nothing written."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import resolve_model
from autoplan.errors import InputError
from autoplan.tune import calibrate as calibrate_module
from autoplan.tune import runs as runs_module
from autoplan.tune.runs import (
    COLUMNS,
    FORMULA_START,
    MAX_PEAK_GIB,
    MAX_ROWS,
    MAX_STEP_S,
    MIN_STEP_S,
    NUMBER_COLUMNS,
    Run,
    csv_text,
    escape_cell,
    parse_runs,
    peak_gib_problem,
    plan_id,
    step_time_problem,
    unescape_cell,
)
from tests.cli.test_hostile_input import _refused
from tests.helpers import autoplan, cpu_seconds
from tests.unit.test_tune import cpu_plan

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "examples" / "cpu"
PLAN = CPU / "plan-dp2.yaml"
SEARCH = ["--model", CPU / "tiny-llama.yaml", "--cluster", CPU / "local-cpu.yaml", "--gpus", "2",
          "--global-batch", "8", "--seq-len", "256"]
USER_HEADER = "measured_step_time_s,micro_batch,pp,tp,dp,seq_len,global_batch,cluster,model\n"
USER_ROW = "3.1,4,1,1,2,256,8,local-cpu.yaml,tiny-llama.yaml\n"


@pytest.fixture(autouse=True, scope="module")
def _imported() -> None:
    """The commands' imports happen once, as in a process that starts: not timed here."""
    autoplan("calibrate", "--help")
    autoplan("check", PLAN)


def megatron_log(times_ms: list[str]) -> str:
    return "".join(f" iteration {i:8d}/{len(times_ms):8d} | consumed samples: {8 * i:12d} | "
                   f"elapsed time per iteration (ms): {t} | learning rate: 3.0E-04 |\n"
                   for i, t in enumerate(times_ms, start=1))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("bad", ["1e308", "inf", "0", "1e-300", "-5", "nan"])
def test_runs_import_refuses_a_step_time_that_is_no_measurement_naming_the_logs_line(tmp_path, bad):
    log, runs = tmp_path / "train.log", tmp_path / "runs.csv"
    log.write_text(megatron_log([bad, "100", "100", "100"]))
    err = _refused("runs", "import", log, "--plan", PLAN, "--runs", runs, "--warmup", "0",
                   needles=(f"{log}: line 1: ",))
    assert "0" * 30 not in err  # no 300-digit number printed
    assert not runs.exists()


def test_runs_import_refuses_a_peak_or_tokens_per_second_that_is_no_measurement(tmp_path):
    runs = tmp_path / "runs.csv"
    memory = tmp_path / "memory.log"
    memory.write_text("[Rank 0] (after 1 iterations) memory (MB) | allocated: 1 | max allocated: 1e44 | "
                      "reserved: 1 | max reserved: 1e44\n" + megatron_log(["100", "100"]))
    _refused("runs", "import", memory, "--plan", PLAN, "--runs", runs, needles=(f"{memory}: line 1: ",))
    titan = tmp_path / "titan.log"
    titan.write_text("step:  1  loss: 9.0  memory:  1.20GiB(10.00%)  tps: 0.0001\n" * 3)
    _refused("runs", "import", titan, "--plan", PLAN, "--runs", runs, needles=(f"{titan}: line 1: ",))
    assert not runs.exists()


def test_the_runs_log_reads_the_range_import_writes_and_refuses_past_it():
    assert step_time_problem(MIN_STEP_S) is None and step_time_problem(MAX_STEP_S) is None
    assert peak_gib_problem(MAX_PEAK_GIB) is None
    for bad in (0.0, 1e-300, MIN_STEP_S / 2, MAX_STEP_S * 2, float("inf"), float("nan"), -1.0):
        assert step_time_problem(bad) is not None
    for bad in (0.0, 1e44, float("inf"), -1.0):
        assert peak_gib_problem(bad) is not None
    # the same bounds for the predictions, and on the writing side: nothing is written that
    # the reader refuses
    header = "model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s,"
    for column, value in (("predicted_step_time_s", "1e-300"), ("predicted_peak_gib", "1e44"),
                          ("measured_peak_gib", "0")):
        text = f"{header}{column}\ntiny-llama.yaml,local-cpu.yaml,2,8,256,2,1,1,4,1.5,{value}\n"
        with pytest.raises(InputError, match=f"runs.csv: row 1.{column}: expected"):
            parse_runs(text, "runs.csv", CPU)
    with pytest.raises(InputError, match="measured_step_time_s: expected a step time"):
        csv_text([Run(plan=cpu_plan(), measured_step_time_s=1e-300)])


@settings(max_examples=60, deadline=None)
@given(step=st.floats(allow_nan=True, allow_infinity=True),
       peak=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_every_run_written_reads_back_and_every_other_is_refused_at_writing(step, peak):
    run = Run(plan=PLAN_A, measured_step_time_s=step, measured_peak_gib=peak)
    try:
        text = csv_text([run])
    except InputError:
        assert step_time_problem(step) or (peak is not None and peak_gib_problem(peak))
        return
    (back,) = parse_runs(text, "runs.csv", ROOT)
    assert back.measured_step_time_s == pytest.approx(step, rel=1e-5)


PLAN_A = cpu_plan()


def test_calibrate_and_import_print_bounded_numbers(tmp_path):
    from autoplan.api.loop import percent_text

    assert percent_text(50.79) == "50.8%" and len(percent_text(1e300)) < 10
    log, runs = tmp_path / "train.log", tmp_path / "runs.csv"
    log.write_text(megatron_log(["1e-3", "1e-3", "1.234567e-3"]))
    r = autoplan("runs", "import", log, "--plan", PLAN, "--runs", runs, "--warmup", "2")
    assert r.returncode == 0, r.stderr
    assert "1.235e-06 s per step" in r.stderr


# --------------------------------------------------------------------------- bounded readers

def test_a_runs_log_of_too_many_rows_is_refused_before_any_plan_is_built(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text("model,cluster,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"
                    + "m,c,1,1,1,1,1,1,1\n" * (MAX_ROWS + 1))
    for args in (("calibrate", runs), ("check", PLAN, "--runs", runs)):
        _refused(*args, needles=(str(runs), f"more than {MAX_ROWS:,} rows"))


def test_each_distinct_plan_of_a_runs_log_is_built_once(monkeypatch):
    import autoplan.plans.file

    built = []
    real = autoplan.plans.file.read_plan

    def counting(*args, **kwargs):
        built.append(args[1:])
        return real(*args, **kwargs)

    monkeypatch.setattr(autoplan.plans.file, "read_plan", counting)
    plans = [cpu_plan(), cpu_plan(dp=1, tp=2, micro_batch=8)]
    text = csv_text([Run(plan=plans[i % 2], measured_step_time_s=1 + i / 1000) for i in range(2000)])
    user = USER_HEADER + USER_ROW * 2000
    built.clear()
    with cpu_seconds() as took:
        back = parse_runs(text, "runs.csv", CPU)
        mine = parse_runs(user, "mine.csv", CPU)
    assert len(back) == 2000 and len(mine) == 2000 and len(built) == 3
    assert took[0] < 1.0, took[0]
    assert {plan_id(r.plan) for r in back} == {plan_id(p) for p in plans}


def test_a_runs_log_of_more_distinct_plans_than_the_bound_is_refused(monkeypatch):
    monkeypatch.setattr(runs_module, "MAX_PLANS", 2)
    text = csv_text([Run(plan=cpu_plan(micro_batch=m), measured_step_time_s=1.0) for m in (1, 2, 4)])
    with pytest.raises(InputError, match=r"runs.csv: row 3: more than 2 distinct plans"):
        parse_runs(text, "runs.csv", CPU)


def test_calibrate_costs_the_distinct_plans_not_the_runs(monkeypatch):
    base = cpu_plan().stack
    plans = [cpu_plan(dp=1, tp=2, micro_batch=8), cpu_plan(dp=1, pp=2, micro_batch=1),
             cpu_plan(dp=2, micro_batch=4, global_batch=64)]
    once = [Run(plan=p, measured_step_time_s=2.5 * evaluate(p).step_time_s) for p in plans]
    calls = []
    real = calibrate_module.evaluate

    def counting(plan):
        calls.append(plan)
        return real(plan)

    monkeypatch.setattr(calibrate_module, "evaluate", counting)
    few = calibrate_module.calibrate(once, base, "x")
    n_few = len(calls)
    calls.clear()
    many = calibrate_module.calibrate(once * 30, base, "x")  # each run 30 times
    assert len(calls) == n_few  # the same predictions for 90 runs as for 3
    assert many.fitted == few.fitted and many.runs == 90 and len(many.held_out) == 90
    monkeypatch.setattr(calibrate_module, "MAX_PLANS", 2)
    with pytest.raises(InputError, match="3 distinct plans: calibrate fits on at most 2"):
        calibrate_module.calibrate(once, base, "x", "runs.csv")


def test_many_groups_are_held_out_in_at_most_ten_folds():
    from autoplan.tune.calibrate import MAX_FOLDS, folds

    assert folds(["b", "a"]) == [["a"], ["b"]]
    many = folds([f"g{i:03d}" for i in range(1000)])
    assert len(many) == MAX_FOLDS and sorted(g for f in many for g in f) == [f"g{i:03d}" for i in range(1000)]


# --------------------------------------------------------------------------- formula injection

@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(["'", "=", "+", "-", "@", "\t", "\r", "a", " ", "1"]), max_size=6)
       | st.text(max_size=8))
def test_a_text_cell_is_never_written_as_a_formula_and_reads_back_exactly(value):
    cell = escape_cell(value)
    assert cell[:1] not in FORMULA_START
    assert unescape_cell(cell) == value


def test_the_runs_log_writes_formulas_as_text_and_reads_them_back(tmp_path):
    model = tmp_path / "model.yaml"
    model.write_text((CPU / "tiny-llama.yaml").read_text().replace("name: tiny-llama", "name: =HYPERLINK(1)"))
    plan = dataclasses.replace(cpu_plan(), model=resolve_model(str(model)))
    group = "=cmd|' /C calc'!A0"
    text = csv_text([Run(plan=plan, measured_step_time_s=1.5, group=group, reason="-oops")])
    (row,) = csv.DictReader(io.StringIO(text))
    assert row["group"] == "'" + group and row["model"] == "'=HYPERLINK(1)" and row["reason"] == "'-oops"
    assert all(row[c][:1] not in FORMULA_START for c in COLUMNS)
    assert all(not row[c].startswith("'") for c in NUMBER_COLUMNS)  # numbers are never escaped
    (back,) = parse_runs(text, "runs.csv", tmp_path)
    assert back.group == group and back.reason == "-oops" and back.plan.model.name == "=HYPERLINK(1)"
    # a negative number in a number column is a number (refused as one), not text
    with pytest.raises(InputError, match=r"row 1.measured_step_time_s: expected a step time .* got -5 s"):
        parse_runs(USER_HEADER + USER_ROW.replace("3.1", "-5", 1), "mine.csv", CPU)


def test_runs_import_escapes_a_group_a_spreadsheet_would_run(tmp_path):
    log, runs = tmp_path / "train.log", tmp_path / "runs.csv"
    log.write_text(megatron_log(["100"] * 4))
    group = "=cmd|' /C calc'!A0"
    assert autoplan("runs", "import", log, "--plan", PLAN, "--runs", runs, "--group", group).returncode == 0
    assert ",'=cmd|' /C calc'!A0," in runs.read_text()
    (back,) = parse_runs(runs.read_text(), str(runs), tmp_path)
    assert back.group == group


# --------------------------------------------------------------------------- soft but wrong

def test_a_column_named_twice_is_refused_naming_both(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(USER_HEADER.rstrip("\n") + ",model\n" + USER_ROW.rstrip("\n") + ",other.yaml\n")
    _refused("calibrate", runs, needles=(f"{runs}: column 10: 'model' again (column 9",))


def test_a_plan_cell_naming_a_json_key_twice_is_refused(tmp_path):
    text = csv_text([Run(plan=cpu_plan(), measured_step_time_s=1.0)])
    header, row = text.splitlines()
    runs = tmp_path / "runs.csv"
    twice = row.replace('""micro_batch"":4', '""micro_batch"":4,""micro_batch"":1')
    runs.write_text(header + "\n" + twice + "\n")
    _refused("check", PLAN, "--runs", runs, needles=(f"{runs}: row 1.plan: key 'micro_batch' twice",))


def test_tune_and_import_read_an_existing_runs_log_whole_before_any_trial(tmp_path):
    runs = tmp_path / "runs.csv"
    good = csv_text([Run(plan=cpu_plan(), measured_step_time_s=1.0)] * 3)
    header, first, *rest = good.splitlines()
    bad = "\n".join([header, first, first.replace(",ok,", ",great,"), *rest]) + "\n"
    runs.write_text(bad)
    before = runs.read_bytes()
    _refused("tune", *SEARCH, "--runner", "torchrun", "--runs", runs, needles=(f"{runs}: row 2.status",))
    log = tmp_path / "train.log"
    log.write_text(megatron_log(["100"] * 4))
    _refused("runs", "import", log, "--plan", PLAN, "--runs", runs, needles=(f"{runs}: row 2.status",))
    assert runs.read_bytes() == before


def test_tune_refuses_a_within_that_is_not_finite(tmp_path):
    for value in ("inf", "nan", "-inf"):
        _refused("tune", *SEARCH, "--within", value, "--no-runs", needles=("--within",), megabytes=None)


def test_errors_in_a_runs_log_name_the_file_and_the_row(tmp_path):
    runs = tmp_path / "runs.csv"
    runs.write_text(USER_HEADER + USER_ROW.replace("tiny-llama.yaml", "missing.yaml"))
    for args in (("calibrate", runs), ("check", PLAN, "--runs", runs), ("evaluate", PLAN, "--runs", runs)):
        _refused(*args, needles=(f"{runs}: row 1: ", "missing.yaml"))


# --------------------------------------------------------------------------- a user's own CSV

def test_appending_to_a_users_csv_adds_the_missing_columns_and_keeps_its_rows(tmp_path):
    runs = tmp_path / "mine.csv"
    (tmp_path / "tiny-llama.yaml").write_text((CPU / "tiny-llama.yaml").read_text())
    (tmp_path / "local-cpu.yaml").write_text((CPU / "local-cpu.yaml").read_text())
    runs.write_text(USER_HEADER + USER_ROW + USER_ROW.replace("3.1", "3.30"))
    log = tmp_path / "train.log"
    log.write_text(megatron_log(["100"] * 4))
    for flag in ("--runs", "--out", "-o"):  # the runs log's name, and its former one
        r = autoplan("runs", "import", log, "--plan", PLAN, flag, runs)
        assert r.returncode == 0, r.stderr
    rows = list(csv.reader(io.StringIO(runs.read_text())))
    header = rows[0]
    assert header[:9] == USER_HEADER.strip().split(",")  # its own order first
    assert sorted(header) == sorted(COLUMNS)
    assert rows[1][:9] == USER_ROW.strip().split(",") and set(rows[1][9:]) == {""}
    assert rows[2][0] == "3.30"  # kept as written
    assert len(rows) == 6 and {r[header.index("source")] for r in rows[3:]} == {"import"}
    assert not list(tmp_path.glob(".mine.csv.*"))  # written beside it and renamed: no leftover
    back = parse_runs(runs.read_text(), str(runs), tmp_path)
    assert [r.measured_step_time_s for r in back] == [3.1, 3.3, 0.1, 0.1, 0.1]
    # appended again: the header is autoplan's columns now (its order kept), rows added
    assert autoplan("runs", "import", log, "--plan", PLAN, "--runs", runs).returncode == 0
    assert len(parse_runs(runs.read_text(), str(runs), tmp_path)) == 6
    # tune reads it up front as a runs log it can append to (refused here for its --workdir,
    # checked after the runs log, before any search)
    r = autoplan("tune", *SEARCH, "--runner", "torchrun", "--workdir", log, "--runs", runs)
    assert r.returncode == 2 and "--workdir" in r.stderr and "not a folder" in r.stderr, r.stderr


def test_appending_to_a_log_past_its_row_bound_is_refused(monkeypatch):
    monkeypatch.setattr(runs_module, "MAX_ROWS", 2)
    text = csv_text([Run(plan=cpu_plan(), measured_step_time_s=1.0)] * 2)
    with pytest.raises(InputError, match="2 rows already"):
        csv_text([Run(plan=cpu_plan(), measured_step_time_s=1.0)], text, "runs.csv")


# --------------------------------------------------------------------------- comparable runs

def test_runs_on_another_device_do_not_correct_a_plan(tmp_path):
    from autoplan.tune.residual import fit_residual

    runs = tmp_path / "h100.csv"
    runs.write_text("model,cluster,gpus,global_batch,seq_len,dp,tp,pp,micro_batch,measured_step_time_s\n"
                    "llama3-8b,dgx-h100,8,64,4096,8,1,1,1,4.0\n"
                    "llama3-8b,dgx-h100,8,64,4096,4,2,1,1,4.4\n"
                    "llama3-8b,dgx-h100,8,64,4096,2,2,2,1,5.0\n")
    learned = fit_residual(parse_runs(runs.read_text(), str(runs), tmp_path), str(runs))
    plan = cpu_plan()
    why = learned.why_not(plan)
    assert why is not None and "local-cpu" in why and "h100" in why
    with pytest.raises(InputError, match=re.escape(str(runs))):
        learned.band(plan, evaluate(plan))
    r = autoplan("evaluate", PLAN, "--runs", runs)
    # the plan is still predicted (exit 0), uncorrected, and a note on stderr says why
    assert r.returncode == 0, r.stderr
    assert "corrected by" not in r.stdout and "Traceback" not in r.stderr
    assert "note: --runs:" in r.stderr and "local-cpu" in r.stderr
    j = autoplan("evaluate", PLAN, "--runs", runs, "--format", "json")
    assert j.returncode == 0 and "learned_from_runs" not in j.stdout
    assert json.loads(j.stdout)["plans"][0]["prediction"]["feasible"]


# --------------------------------------------------------------------------- flags

def test_the_loops_flags_show_their_choices_and_take_the_shared_names(tmp_path):
    text = autoplan("tune", "--help").stdout
    for shown in ("<local|torchrun|slurm>", "<megatron|torchtitan>", "<cpu|cuda>", "--top"):
        assert shown in text
    assert re.search(r"--top\s+-k\s", text)
    assert "--runs,--out" in autoplan("runs", "import", "--help").stdout
    # --top, -k and the former --top-k are one option; bad values are named by what was typed
    for flag in ("--top", "-k"):
        err = _refused("tune", *SEARCH, flag, "0", "--no-runs", needles=("--top: expected a value >= 1",),
                       megabytes=None)
        assert err.startswith("autoplan: error: ")
    _refused("tune", *SEARCH, "--top-k", "0", "--no-runs", needles=("--top-k: expected a value >= 1",),
             megabytes=None)
    _refused("tune", *SEARCH, "--top", "2", "--top-k", "3", "--no-runs", needles=("--top: given twice",),
             megabytes=None)
    err = _refused("tune", *SEARCH, "--runner", "bogus", needles=(
        "autoplan: error: --runner: expected one of local, torchrun, slurm, got 'bogus'",), megabytes=None)
    assert len(err.splitlines()) == 1
