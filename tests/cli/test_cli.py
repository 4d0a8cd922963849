"""The command line as users and scripts meet it, judged by exit code, stdout (tables or
JSON) and stderr (one line per problem, no traceback).

Most tests run the entry point in this process (tests.helpers.autoplan: the same exit
code, stdout and stderr as a new process, without the interpreter start); the smoke tests
at the top run it in a new one (tests.helpers.autoplan_subprocess), for what only a real
process shows: the module and console-script entry points, exit statuses, and output that
must not depend on the process (hash seeds).

Searches stay small (at most 64 GPUs) so the whole file runs in seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import autoplan, autoplan_subprocess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROFILES = ROOT / "profiles"
HF_LLAMA3_8B = ROOT / "tests" / "data" / "hf" / "Meta-Llama-3-8B.json"

SMALL_JOB = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64",
             "--seq-len", "4096"]

PLAN_KEYS = {"autoplan", "model", "cluster", "job", "layout", "micro_batch", "schedule",
             "recompute", "zero", "sequence_parallel", "prediction"}
PREDICTION_KEYS = {"feasible", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                   "memory_gib", "memory_gib_per_stage", "breakdown_s"}
MEMORY_KEYS = {"peak", "weights", "grads", "optimizer", "activations", "other"}
TIME_KEYS = {"compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
             "bubble", "optimizer", "offload", "overhead"}

# A plan every bad-plan test starts from (and changes one thing of).
GOOD_PLAN = """\
autoplan: 1
model: llama3-70b
cluster: {name: dgx-h100, nodes: 32}
job: {global_batch: 1024, seq_len: 8192, dtype: bf16}
layout: {dp: 16, tp: 8, pp: 2, cp: 1, ep: 1, vpp: 1}
micro_batch: 1
schedule: 1f1b
recompute: selective
zero: 1
sequence_parallel: true
"""


def json_out(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def assert_bad_input(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, no traceback, and every needle somewhere in stderr."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"


def write_plan(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def search_8() -> subprocess.CompletedProcess[str]:
    return autoplan("search", *SMALL_JOB, "--gpus", "8", "--format", "json")


@pytest.fixture(scope="module")
def search_16() -> subprocess.CompletedProcess[str]:
    return autoplan("search", *SMALL_JOB, "--gpus", "16", "--format", "json", "--top", "50")


# --------------------------------------------------------------------------- help, listings

@pytest.mark.parametrize("command", [[], ["search"], ["evaluate"], ["models"], ["hardware"]],
                         ids=["top-level", "search", "evaluate", "models", "hardware"])
def test_every_command_has_a_help_that_exits_zero(command: list[str]) -> None:
    result = autoplan(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_a_command_runs_built_alone_and_anything_else_sees_every_command() -> None:
    """main() builds only the command argv names (typer builds every command's click
    options otherwise): the root options still come first, and the whole app answers what
    names none, so the top-level help and a typo's suggestions still list every command."""
    from autoplan.cli.main import _only_the_command, app

    everything = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    assert {"search", "serve", "export"} <= everything
    only = _only_the_command(["--debug", "export", "plan.yaml", "--to", "megatron"])
    assert [c.name for c in only.registered_commands] == ["export"] and not only.registered_groups
    (search,) = _only_the_command(["search", "-m", "llama3-8b"]).registered_commands
    assert search.callback is not None and search.callback.__name__ == "search"
    assert [g.name for g in _only_the_command(["runs", "import"]).registered_groups] == ["runs"]
    for args in ([], ["--help"], ["serch"], ["--version"]):
        assert _only_the_command(args) is app
    lists = autoplan("--help").stdout
    assert all(name.replace("_", "-") in lists for name in everything)
    assert "Did you mean 'search'" in autoplan("serch").stderr
    helped = autoplan("--debug", "search", "--help")
    assert helped.returncode == 0 and "--global-batch" in helped.stdout


def test_no_arguments_print_the_usage_without_a_traceback() -> None:
    result = autoplan_subprocess()  # python -m autoplan.cli.main, in a new process
    assert result.returncode in (0, 2)
    assert "Usage" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_option_is_a_usage_error_without_a_traceback() -> None:
    assert_bad_input(autoplan_subprocess("search", "--bogus"), "--bogus")  # exit status of a process


def test_the_installed_command_finds_its_data_outside_the_checkout(tmp_path: Path) -> None:
    """profiles/ and searchspace/ ship inside the wheel (autoplan/_data)."""
    exe = shutil.which("autoplan")
    if exe is None:
        pytest.skip("autoplan is not installed as a command")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([exe, "models", "--format", "json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert '"name": "llama3-70b"' in run.stdout


def test_a_non_integer_gpu_count_is_a_usage_error_without_a_traceback() -> None:
    assert_bad_input(autoplan("search", *SMALL_JOB, "--gpus", "eight"), "--gpus")


def test_models_json_lists_every_builtin_with_parameter_counts() -> None:
    result = autoplan("models", "--format", "json")
    assert result.returncode == 0, result.stderr
    models = json_out(result)["models"]
    assert {m["name"] for m in models} == {p.stem for p in (PROFILES / "models").glob("*.yaml")}
    for m in models:
        assert isinstance(m["params_total"], int) and m["params_total"] > 0, m["name"]
        assert isinstance(m["params_active"], int) and 0 < m["params_active"] <= m["params_total"]


def test_models_table_names_every_builtin() -> None:
    result = autoplan("models")
    assert result.returncode == 0, result.stderr
    for path in (PROFILES / "models").glob("*.yaml"):
        assert path.stem in result.stdout


def test_hardware_json_lists_devices_and_clusters() -> None:
    result = autoplan("hardware", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json_out(result)
    cluster_names = {c["name"] for c in data["clusters"]}
    assert {"dgx-h100", "dgx-a100"} <= cluster_names
    assert "h100-sxm" in {d["name"] for d in data["devices"]}
    for cluster in data["clusters"]:
        assert cluster["gpus_per_node"] >= 1
        assert cluster["device"]["peak_tflops"]["bf16"] > 0


# --------------------------------------------------------------------------- search

@pytest.mark.parametrize("fixture", ["search_8", "search_16"])
def test_search_on_a_small_job_prints_plans_in_the_plan_schema(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    result = request.getfixturevalue(fixture)
    assert result.returncode == 0, result.stderr
    plans = json_out(result)["plans"]
    assert plans
    for plan in plans:
        assert PLAN_KEYS <= set(plan), PLAN_KEYS - set(plan)
        assert plan["autoplan"] == 1
        prediction = plan["prediction"]
        assert PREDICTION_KEYS <= set(prediction), PREDICTION_KEYS - set(prediction)
        assert prediction["feasible"] is True
        assert MEMORY_KEYS <= set(prediction["memory_gib"])
        assert len(prediction["memory_gib_per_stage"]) == plan["layout"]["pp"]
        for stage in prediction["memory_gib_per_stage"]:
            assert MEMORY_KEYS <= set(stage)
        assert set(prediction["breakdown_s"]) == TIME_KEYS
        assert sum(prediction["breakdown_s"].values()) == pytest.approx(prediction["step_time_s"])


@pytest.mark.parametrize(("fixture", "gpus"), [("search_8", 8), ("search_16", 16)])
def test_every_searched_layout_multiplies_to_the_gpu_count(
    fixture: str, gpus: int, request: pytest.FixtureRequest
) -> None:
    for plan in json_out(request.getfixturevalue(fixture))["plans"]:
        lay = plan["layout"]
        assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == gpus, lay
        assert plan["cluster"] == {"name": "dgx-h100", "nodes": max(1, gpus // 8)}


@pytest.mark.parametrize("fixture", ["search_8", "search_16"])
def test_searched_plans_are_sorted_by_throughput_best_first(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    rates = [p["prediction"]["tokens_per_s"] for p in json_out(request.getfixturevalue(fixture))["plans"]]
    assert len(rates) > 1
    assert rates == sorted(rates, reverse=True)


def test_search_prints_the_same_bytes_twice(search_16: subprocess.CompletedProcess[str]) -> None:
    # search_16 ran in this process; again in a new one, with another hash seed
    again = autoplan_subprocess("search", *SMALL_JOB, "--gpus", "16", "--format", "json", "--top", "50")
    assert again.stdout == search_16.stdout


def test_the_search_table_is_the_same_bytes_twice() -> None:
    first, second = (run("search", *SMALL_JOB, "--gpus", "8") for run in (autoplan, autoplan_subprocess))
    assert first.returncode == 0, first.stderr
    assert "dp" in first.stdout and "tokens/s" in first.stdout
    assert first.stdout == second.stdout


def test_search_top_limits_the_number_of_plans() -> None:
    result = autoplan("search", *SMALL_JOB, "--gpus", "8", "--top", "2", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert len(json_out(result)["plans"]) == 2


def test_search_out_writes_a_plan_that_evaluate_predicts_the_same(tmp_path: Path) -> None:
    out = tmp_path / "best.yaml"
    found = autoplan("search", *SMALL_JOB, "--gpus", "16", "--format", "json", "--out", out)
    assert found.returncode == 0, found.stderr
    best = json_out(found)["plans"][0]
    evaluated = autoplan("evaluate", out, "--format", "json")
    assert evaluated.returncode == 0, evaluated.stderr
    again = json_out(evaluated)["plans"][0]
    assert again["prediction"]["step_time_s"] == pytest.approx(best["prediction"]["step_time_s"],
                                                               rel=1e-12)
    assert {k: again[k] for k in PLAN_KEYS - {"prediction"}} == {
        k: best[k] for k in PLAN_KEYS - {"prediction"}}
    assert [p.name for p in tmp_path.iterdir()] == ["best.yaml"]  # no temp file left over


def test_search_reads_a_job_file() -> None:
    job = EXAMPLES / "jobs" / "llama3-8b-64xh100-megatron.yaml"
    result = autoplan("search", job, "--format", "json", "--top", "3")
    assert result.returncode == 0, result.stderr
    plans = json_out(result)["plans"]
    assert plans[0]["model"] == "llama3-8b"
    assert plans[0]["cluster"] == {"name": "dgx-h100", "nodes": 8}
    assert plans[0]["job"] == {"global_batch": 512, "seq_len": 8192, "dtype": "bf16"}
    for plan in plans:  # the file asks for the megatron space
        assert plan["schedule"] in ("1f1b", "interleaved") and plan["zero"] <= 1


def test_search_options_override_the_job_file() -> None:
    job = EXAMPLES / "jobs" / "llama3-8b-64xh100-megatron.yaml"
    result = autoplan("search", job, "--gpus", "8", "--global-batch", "64", "--seq-len", "4096",
                      "--format", "json", "--top", "1")
    assert result.returncode == 0, result.stderr
    plan = json_out(result)["plans"][0]
    assert plan["cluster"]["nodes"] == 1
    assert plan["job"] == {"global_batch": 64, "seq_len": 4096, "dtype": "bf16"}


def test_the_megatron_space_never_returns_gpipe_or_zero_above_one(
    search_16: subprocess.CompletedProcess[str],
) -> None:
    result = autoplan("search", *SMALL_JOB, "--gpus", "16", "--space", "megatron", "--top", "50",
                      "--format", "json")
    assert result.returncode == 0, result.stderr
    plans = json_out(result)["plans"]
    assert plans
    for plan in plans:
        assert plan["schedule"] != "gpipe"
        assert plan["zero"] <= 1
    # the same job in the launcher-free space does pick ZeRO > 1, so the space made the difference
    free = autoplan("search", *SMALL_JOB, "--gpus", "16", "--space", "any", "--format", "json")
    assert any(p["zero"] > 1 for p in json_out(free)["plans"])


def test_search_accepts_a_huggingface_config_json_as_the_model() -> None:
    result = autoplan("search", "--model", HF_LLAMA3_8B, "--cluster", "dgx-h100", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096", "--format", "json", "--top", "1")
    assert result.returncode == 0, result.stderr
    model = json_out(result)["plans"][0]["model"]
    assert model["layers"] == 32 and model["hidden"] == 4096 and model["kv_heads"] == 8


def test_search_accepts_the_example_model_and_cluster_files() -> None:
    result = autoplan("search", "--model", EXAMPLES / "models" / "my-model.yaml",
                      "--cluster", EXAMPLES / "clusters" / "my-cluster.yaml", "--gpus", "16",
                      "--global-batch", "64", "--seq-len", "4096", "--format", "json", "--top", "1")
    assert result.returncode == 0, result.stderr
    plan = json_out(result)["plans"][0]
    assert plan["model"]["name"] == "my-llama-3b"
    assert plan["cluster"]["name"] == "my-h100-pcie" and plan["cluster"]["nodes"] == 2


def test_a_model_name_that_looks_like_markup_is_printed_literally(tmp_path: Path) -> None:
    text = (EXAMPLES / "models" / "my-model.yaml").read_text(encoding="utf-8")
    model = write_plan(tmp_path, text.replace("name: my-llama-3b", 'name: "my[/bold]"'), "m.yaml")
    result = autoplan("search", *SMALL_JOB[2:], "--model", model, "--gpus", "8", "--top", "1")
    assert result.returncode == 0, result.stderr
    assert "my[/bold] on 8 x h100-sxm" in result.stdout


def test_search_exits_one_and_names_the_gib_needed_when_nothing_fits() -> None:
    result = autoplan_subprocess("search", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(r"needs [\d.,]+ GiB", result.stderr), result.stderr
    assert "80 GiB" in result.stderr  # what one H100 holds


def test_search_json_when_nothing_fits_is_an_empty_plan_list() -> None:
    result = autoplan("search", "--model", "llama3-405b", "--cluster", "dgx-h100", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096", "--format", "json")
    assert result.returncode == 1
    assert json_out(result)["plans"] == []
    assert "GiB" in result.stderr


# --------------------------------------------------------------------------- search: bad input

def test_an_unknown_model_name_lists_the_valid_names() -> None:
    result = autoplan("search", *SMALL_JOB[2:], "--model", "llama9", "--gpus", "8")
    assert_bad_input(result, "--model", "'llama9'")
    for path in (PROFILES / "models").glob("*.yaml"):
        assert path.stem in result.stderr


def test_an_unknown_cluster_name_lists_the_valid_names() -> None:
    result = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h900", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096")
    assert_bad_input(result, "--cluster", "'dgx-h900'", "dgx-h100", "dgx-a100")


def test_a_gpu_count_that_is_not_whole_nodes_is_refused() -> None:
    result = autoplan("search", *SMALL_JOB, "--gpus", "12")
    assert_bad_input(result, "--gpus", "multiple of", "8 GPUs per node", "12")


def test_an_unknown_search_space_suggests_the_nearest() -> None:
    result = autoplan("search", *SMALL_JOB, "--gpus", "8", "--space", "megatronn")
    assert_bad_input(result, "--space", "did you mean 'megatron'")


def test_a_missing_global_batch_names_the_option() -> None:
    result = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8",
                      "--seq-len", "4096")
    assert_bad_input(result, "global_batch", "--global-batch")


def test_a_missing_model_file_is_named() -> None:
    result = autoplan("search", *SMALL_JOB[2:], "--model", "no/such/model.yaml", "--gpus", "8")
    assert_bad_input(result, "no/such/model.yaml", "file not found")


def test_a_missing_job_file_is_named() -> None:
    assert_bad_input(autoplan("search", "no-such-job.yaml"), "no-such-job.yaml", "file not found")


def test_a_job_file_with_a_misspelt_key_suggests_the_nearest(tmp_path: Path) -> None:
    job = write_plan(tmp_path, "model: llama3-8b\nclustr: dgx-h100\n"
                               "job: {global_batch: 64, seq_len: 4096}\n", "job.yaml")
    assert_bad_input(autoplan("search", job), str(job), "clustr", "did you mean 'cluster'")


def test_a_job_file_with_a_string_gpu_count_is_refused(tmp_path: Path) -> None:
    job = write_plan(tmp_path, "model: llama3-8b\ncluster: dgx-h100\ngpus: eight\n"
                               "job: {global_batch: 64, seq_len: 4096}\n", "job.yaml")
    assert_bad_input(autoplan("search", job), str(job), "gpus: expected an integer",
                     "string 'eight'")


def test_fp8_on_a_device_without_fp8_is_refused() -> None:
    result = autoplan("search", "--model", "llama3-8b", "--cluster", "dgx-a100", "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096", "--dtype", "fp8")
    assert_bad_input(result, "--dtype", "fp8")


def test_a_model_file_with_several_problems_reports_them_all_at_once(tmp_path: Path) -> None:
    model = write_plan(tmp_path, """\
model:
  name: broken
  layers: 0
  hidden: big
  heads: 32
  kv_heads: 8
  ffn_hidden: 14336
  vocab: 128256
  activation: swish
  position: rope
  tied_embeddings: false
  max_seq_len: 8192
  colour: red
""", "model.yaml")
    result = autoplan("search", *SMALL_JOB[2:], "--model", model, "--gpus", "8")
    assert_bad_input(result, "model.layers", "model.hidden", "model.activation", "model.colour")
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 4, lines
    for line in lines:
        assert line.startswith(f"autoplan: error: {model}: model."), line


def test_a_device_file_may_write_numbers_as_989e12_style_floats(tmp_path: Path) -> None:
    device = write_plan(tmp_path, "device:\n  name: sci-h100\n"
                                  "  peak_tflops: {bf16: 989e0, fp8: 1979e0}\n"
                                  "  mem_GiB: 8e1\n  hbm_GBps: 3.35e3\n", "device.yaml")
    cluster = write_plan(tmp_path, f"""\
cluster:
  name: sci-cluster
  device: {device}
  gpus_per_node: 8
  intra_node: {{bandwidth_GBps: 4.5e2, latency_us: 3}}
  inter_node: {{bandwidth_GBps: 5e1, latency_us: 1e1}}
""", "cluster.yaml")
    result = autoplan("search", "--model", "llama3-8b", "--cluster", cluster, "--gpus", "8",
                      "--global-batch", "64", "--seq-len", "4096", "--format", "json", "--top", "1")
    assert result.returncode == 0, result.stderr
    written = json_out(result)["plans"][0]["cluster"]
    assert written["device"]["peak_tflops"]["bf16"] == pytest.approx(989)
    assert written["device"]["mem_GiB"] == pytest.approx(80)
    assert written["inter_node"]["bandwidth_GBps"] == pytest.approx(50)


def test_out_to_a_path_under_a_file_fails_and_writes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    result = autoplan("search", *SMALL_JOB, "--gpus", "8", "--out", blocker / "plan.yaml")
    assert_bad_input(result, str(blocker / "plan.yaml"), "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]


def test_out_onto_a_directory_fails_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "plan.yaml"
    target.mkdir()
    result = autoplan("search", *SMALL_JOB, "--gpus", "8", "--out", target)
    assert_bad_input(result, str(target), "cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]
    assert list(target.iterdir()) == []


# --------------------------------------------------------------------------- evaluate

def test_evaluate_prints_a_breakdown_for_a_plan_that_fits(tmp_path: Path) -> None:
    result = autoplan("evaluate", write_plan(tmp_path, GOOD_PLAN))
    assert result.returncode == 0, result.stderr
    assert "fits" in result.stdout
    for term in ("compute", "tp_comm", "bubble", "weights", "activations"):
        assert term in result.stdout


def test_evaluate_keeps_the_input_order_in_json() -> None:
    plans = [EXAMPLES / "plans" / name for name in (
        "llama3-8b-64xh100-megatron-best.yaml", "llama3-70b-256xh100-tp8pp2.yaml",
        "inline-model-and-cluster.yaml")]
    forward = autoplan("evaluate", *plans, "--format", "json")
    backward = autoplan("evaluate", *reversed(plans), "--format", "json")
    assert forward.returncode == backward.returncode == 0, forward.stderr + backward.stderr
    names = [p["model"] if isinstance(p["model"], str) else p["model"]["name"]
             for p in json_out(forward)["plans"]]
    assert names == ["llama3-8b", "llama3-70b", "my-llama-3b"]
    assert json_out(backward)["plans"] == list(reversed(json_out(forward)["plans"]))


def test_evaluate_exits_one_when_a_plan_does_not_fit_but_still_predicts_it() -> None:
    fits = EXAMPLES / "plans" / "llama3-70b-256xh100-tp8pp2.yaml"
    oom = EXAMPLES / "plans" / "llama3-70b-256xh100-oom.yaml"
    result = autoplan("evaluate", oom, fits, "--format", "json")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    first, second = json_out(result)["plans"]
    assert first["layout"]["dp"] == 256 and first["prediction"]["feasible"] is False
    assert first["prediction"]["step_time_s"] > 0
    assert first["prediction"]["memory_gib"]["peak"] > 80
    assert second["prediction"]["feasible"] is True


def test_evaluate_table_says_what_does_not_fit_in_gib() -> None:
    result = autoplan("evaluate", EXAMPLES / "plans" / "llama3-70b-256xh100-oom.yaml")
    assert result.returncode == 1
    assert "does not fit" in result.stdout
    assert re.search(r"needs [\d.,]+ GiB", result.stdout), result.stdout


def test_every_example_plan_evaluates_and_only_the_oom_one_does_not_fit() -> None:
    paths = sorted((EXAMPLES / "plans").glob("*.yaml"))
    assert len(paths) >= 4
    result = autoplan("evaluate", *paths, "--format", "json")
    assert result.returncode == 1, result.stderr  # the OOM example
    for path, plan in zip(paths, json_out(result)["plans"], strict=True):
        assert plan["prediction"]["feasible"] is ("oom" not in path.name), path.name


def test_evaluate_names_a_path_with_brackets_literally(tmp_path: Path) -> None:
    result = autoplan("evaluate", write_plan(tmp_path, GOOD_PLAN, "plan[red].yaml"))
    assert result.returncode == 0, result.stderr
    assert "plan[red].yaml" in result.stdout


# --------------------------------------------------------------------------- evaluate: bad input

@pytest.mark.parametrize(
    ("old", "new", "needles"),
    [
        ("micro_batch: 1", "micro_bach: 1", ["micro_bach", "did you mean 'micro_batch'"]),
        ("tp: 8", 'tp: "eight"', ["layout.tp", "expected an integer", "'eight'"]),
        ("dp: 16", "dp: 8", ["layout", "128", "256 GPUs"]),
        ("schedule: 1f1b", "schedule: 2f2b", ["schedule", "1f1b", "'2f2b'"]),
        ("zero: 1", "zero: 4", ["zero", "expected one of"]),
        ("autoplan: 1", "autoplan: 2", ["autoplan", "schema version 1"]),
        ("model: llama3-70b", "model: llama3-7b", ["model", "unknown model 'llama3-7b'"]),
        ("{name: dgx-h100, nodes: 32}", "{name: dgx-h100, nodes: 32, gpu: 8}",
         ["cluster.gpu", "unknown field"]),
    ],
    ids=["unknown-key", "string-for-number", "layout-product", "unknown-schedule", "zero-4",
         "schema-version", "unknown-model", "unknown-cluster-key"],
)
def test_a_bad_plan_names_its_file_and_field(
    tmp_path: Path, old: str, new: str, needles: list[str]
) -> None:
    assert old in GOOD_PLAN
    plan = write_plan(tmp_path, GOOD_PLAN.replace(old, new))
    result = autoplan("evaluate", plan)
    assert_bad_input(result, str(plan), *needles)
    assert result.stdout == ""


def test_a_duplicate_key_in_a_plan_is_refused(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, GOOD_PLAN + "zero: 3\n")
    assert_bad_input(autoplan("evaluate", plan), str(plan), "duplicate key 'zero'", "line 9")


def test_tp_that_does_not_divide_the_heads_is_refused(tmp_path: Path) -> None:
    # gpt-1.7b has 24 heads; tp 16 divides its ffn_hidden (9216) but not its heads
    plan = write_plan(tmp_path, """\
autoplan: 1
model: gpt-1.7b
cluster: {name: dgx-h100, nodes: 2}
job: {global_batch: 64, seq_len: 2048}
layout: {dp: 1, tp: 16, pp: 1}
micro_batch: 1
""")
    assert_bad_input(autoplan("evaluate", plan), str(plan), "layout.tp", "heads=24")


def test_invalid_yaml_is_refused_with_its_line(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, "autoplan: 1\nlayout: {dp: 8, tp: [1\n")
    assert_bad_input(autoplan_subprocess("evaluate", plan), str(plan), "invalid YAML", "line")


def test_a_missing_plan_file_is_named() -> None:
    assert_bad_input(autoplan("evaluate", "no-such-plan.yaml"), "no-such-plan.yaml",
                     "file not found")


def test_one_bad_plan_among_good_ones_stops_evaluate_before_any_output(tmp_path: Path) -> None:
    good = write_plan(tmp_path, GOOD_PLAN, "good.yaml")
    bad = write_plan(tmp_path, GOOD_PLAN.replace("tp: 8", "tp: eight"), "bad.yaml")
    result = autoplan("evaluate", good, bad, "--format", "json")
    assert_bad_input(result, str(bad), "layout.tp")
    assert result.stdout == ""


# -- mixture of experts and long context (issue 4's acceptance commands) ------------------

@pytest.mark.slow
def test_deepseek_v3_search_returns_expert_parallel_plans_with_all_to_all_cost():
    result = autoplan("search", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "2048",
                      "--global-batch", "15360", "--seq-len", "4096", "--top", "3",
                      "--format", "json")
    assert result.returncode == 0, result.stderr
    plans = json_out(result)["plans"]
    assert plans and all(p["layout"]["ep"] > 1 for p in plans)
    for p in plans:
        assert p["prediction"]["breakdown_s"]["ep_comm"] > 0
        assert p["prediction"]["mfu_basis"] == "active parameters"


def test_128k_context_search_uses_context_parallelism():
    result = autoplan("search", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "256",
                      "--global-batch", "64", "--seq-len", "131072", "--top", "3", "--format", "json")
    assert result.returncode == 0, result.stderr
    plans = json_out(result)["plans"]
    assert plans[0]["layout"]["cp"] > 1
    # the leaders offload activations at this length; each fits its node's host memory
    assert all(p["prediction"]["feasible"] for p in plans)
    assert all(p["prediction"]["host_memory_gib_per_node"] <= 2048 for p in plans)


def test_moe_table_says_mfu_counts_active_parameters():
    result = autoplan("search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "64",
                      "--global-batch", "256", "--seq-len", "4096", "--top", "2")
    assert result.returncode == 0, result.stderr
    assert "MFU counts the active parameters only" in result.stdout
    assert " ep" in result.stdout


def test_bad_moe_imbalance_names_the_option():
    assert_bad_input(autoplan("search", *SMALL_JOB, "--moe-imbalance", "0.5"), "moe_imbalance")


@pytest.mark.parametrize(("extra", "field", "needle"), [
    ("experts: 8\n  top_k: 9\n", "model.top_k", "1 <= top_k <= experts"),
    ("top_k: 2\n", "model.top_k", "give experts too"),
    ("experts: 8\n  top_k: 2\n  dense_layers: 32\n", "model.dense_layers", "fewer than layers"),
    ("kv_lora_rank: 512\n", "model.qk_nope_head_dim", "needs it"),
])
def test_bad_moe_and_mla_fields_name_the_field(tmp_path, extra, field, needle):
    text = (PROFILES / "models" / "llama3-8b.yaml").read_text().replace(
        "  max_seq_len:", "  " + extra + "  max_seq_len:")
    path = tmp_path / "model.yaml"
    path.write_text(text)
    result = autoplan("search", "--model", str(path), "--cluster",
                      "dgx-h100", "--global-batch", "64", "--seq-len", "4096")
    assert_bad_input(result, field, needle)


@pytest.mark.parametrize("ending,code", [(None, 0), (SystemExit(None), 0), (SystemExit(2), 2),
                                         (SystemExit(1), 1), (SystemExit("stopped"), 1)])
def test_the_program_ends_with_mains_exit_code_past_the_interpreters_teardown(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        ending: SystemExit | None, code: int) -> None:
    """``autoplan.cli.main.run`` (the console script and ``python -m``) flushes and ends the
    process with main's exit status through ``os._exit``: sys.exit(None) is 0, a message
    is printed and is 1, as Python would. (The subprocess tests run it for real.)"""
    from autoplan.cli import main as cli

    class Ended(Exception):
        pass

    def fake_main() -> None:
        print("answer")
        if ending is not None:
            raise ending

    def fake_exit(status: int) -> None:
        raise Ended(status)

    monkeypatch.setattr(cli, "main", fake_main)
    monkeypatch.setattr(cli.os, "_exit", fake_exit)
    with pytest.raises(Ended) as ended:
        cli.run()
    assert ended.value.args == (code,)
    out, err = capsys.readouterr()
    assert out == "answer\n"
    assert err == ("stopped\n" if code == 1 and isinstance(ending, SystemExit)
                   and ending.code == "stopped" else "")
