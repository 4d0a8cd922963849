"""The newcomer's frictions of issue 34: one flag vocabulary across commands, help that
reads whole, no near-duplicate plans, numbers a CPU run can read, a fit report that says
what it leaves out."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from tests.helpers import BEST, REPO, autoplan


def test_the_top_level_help_names_serving_too() -> None:
    r = autoplan("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "serve ranks deployments" in text and "vLLM" in text


def test_the_command_list_never_breaks_a_sentence() -> None:
    """typer kept a docstring's line breaks: "1 none fits or" / "meets it"."""
    from autoplan.cli.main import app

    for info in app.registered_commands:
        first = (info.help or "").split("\n\n")[0]
        assert "\n" not in first, (info.name, first)


def test_check_takes_table_as_the_other_commands_do() -> None:
    table = autoplan("check", BEST, "--format", "table")
    text = autoplan("check", BEST, "--format", "text")
    assert table.returncode == text.returncode == 0
    assert table.stdout == text.stdout


def test_piped_output_never_breaks_a_line() -> None:
    r = autoplan("evaluate", BEST)
    summary = next(line for line in r.stdout.splitlines() if "tokens/s" in line and "MFU" in line)
    assert summary.rstrip().endswith("fits"), summary  # 200 columns used to wrap 'fits' away


def test_a_cpu_plans_tflops_are_not_printed_as_zero() -> None:
    r = autoplan("evaluate", REPO / "examples" / "cpu" / "plan-pp2.yaml")
    assert r.returncode == 0, r.stderr
    assert "(0 model / 0 hardware" not in r.stdout
    line = next(line for line in r.stdout.splitlines() if "hardware TFLOP/s" in line)
    model = float(line.split("(")[1].split(" model")[0])
    assert 0 < model < 10


def test_with_nothing_to_shard_a_search_offers_one_zero_stage_per_plan() -> None:
    """dp 1, cp 1, experts unsharded: ZeRO 0, 1 and 2 run identically; the top plans are
    not the same plan under three names (they were: dp1 tp8 at zero 0, 1, 2)."""
    r = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "-b", "1", "-s", "1024",
                 "--top", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    keys = [json.dumps({k: v for k, v in p.items() if k not in ("zero", "prediction")}, sort_keys=True)
            for p in doc["plans"]]
    assert doc["plans"][0]["layout"]["dp"] == 1 and len(keys) == len(set(keys)) == 3
    assert doc["stats"]["pruned"]["zero-unsharded"] > 0
    # where only a higher stage can offload the optimizer, that stage's offloaded plans stay
    r = autoplan("search", "-m", "llama3-70b", "-c", "dgx-h100", "--gpus", "8", "-b", "1", "-s", "2048",
                 "--top", "1", "--space", "megatron", "--format", "json")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["plans"][0]
    assert best["zero"] == 1 and best["offload"]["optimizer"] is True


def test_the_fit_report_says_which_rows_it_counts_and_where_the_surrogate_loses() -> None:
    from autoplan.cli.commands.bench import _fit_notes

    kinds = ["gemm"] * 5 + ["collective"] * 3 + ["elementwise"] * 2
    profile = SimpleNamespace(rows=pd.DataFrame({"kind": kinds}))
    report = [SimpleNamespace(kind="gemm", rows=3, analytic_mape=0.1, surrogate_mape=0.05),
              SimpleNamespace(kind="collective", rows=3, analytic_mape=0.46, surrogate_mape=0.79)]
    notes = _fit_notes(profile, report)
    assert notes[0].startswith("rows: 6 of the profile's 10 train the surrogate; 2 gemm rows")
    assert "2 elementwise rows fit the machine descriptor" in notes[0]
    assert len(notes) == 2 and notes[1].startswith(
        "collective: the surrogate's held-out error (79.0%) is worse than the formula's (46.0%)")
    r = autoplan("bench", "--profile", REPO / "examples" / "cpu" / "profile.csv", "--fit")
    assert r.returncode == 0 and "rows: 129 of the profile's 266 train the surrogate" in r.stdout


def test_validate_takes_a_built_in_cluster_name_as_search_does(tmp_path: Path) -> None:
    from autoplan.bench import validate as v
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import read_plan

    plan_path = REPO / "examples" / "cpu" / "plan-dp2.yaml"
    plan = read_plan(read_yaml(plan_path), str(plan_path))
    machine = v.Machine.local("cpu")
    desc = v.machine_descriptor(plan, "plan.yaml", v.Options(cluster="dgx-h100"), machine)
    assert desc.cluster.device.name == "h100-sxm" and desc.source == "the cluster built-in dgx-h100"


def test_a_sweep_says_what_it_has_done_on_stderr_unless_quiet() -> None:
    args = ("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8,16", "-b", "64", "-s", "4096",
            "--train-tokens", "1e11", "--top", "1")
    r = autoplan(*args)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("autoplan: search")]
    assert lines[0] == "autoplan: searching launchable space on 8, 16 GPUs ..."
    assert {line.split(" (")[0] for line in lines[1:]} == {"autoplan: searched 8 GPUs",
                                                           "autoplan: searched 16 GPUs"}
    quiet = autoplan(*args, "--quiet")
    assert quiet.returncode == 0 and "autoplan: search" not in quiet.stderr
    assert quiet.stdout == r.stdout
    single = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8", "-b", "64", "-s", "4096")
    assert "autoplan: search" not in single.stderr  # a second's search says nothing


def test_a_job_files_train_section_is_the_train_flags(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: [8, 16]\n"
                   "job: {global_batch: 64, seq_len: 4096}\n"
                   "train: {tokens: 1e11, objective: cost}\n")
    from_file = autoplan("search", job, "--top", "1", "--format", "json", "--objective", "time")
    from_flags = autoplan("search", "-m", "llama3-8b", "-c", "dgx-h100", "--gpus", "8,16", "-b", "64",
                          "-s", "4096", "--train-tokens", "1e11", "--objective", "time", "--top", "1",
                          "--format", "json", "-q")
    assert from_file.returncode == from_flags.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout) == json.loads(from_flags.stdout)
    assert f"--objective time overrides {job}'s 'cost'" in from_file.stderr  # as every flag's note
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: [8, 16]\n"
                   "job: {global_batch: 64, seq_len: 4096}\ntrain: {tokens: -1, objectve: cost}\n")
    r = autoplan("search", job)
    assert r.returncode == 2
    assert "train.tokens: expected a number > 0" in r.stderr and "train.objectve: unknown field" in r.stderr
