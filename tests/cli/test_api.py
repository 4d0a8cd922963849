"""autoplan.api, the commands as functions: each result's ``to_dict()`` is the document the
command's ``--format json`` prints for the same inputs (the command calls the same
function); bad input raises the command's InputError naming the option, never SystemExit;
nothing prints; the Python examples (examples/python) and docs/API.md's snippets run and
print what the command does."""

from __future__ import annotations

import csv
import json
import os
import re
import runpy
import sys
from pathlib import Path

import pytest

from autoplan import api
from tests.helpers import autoplan

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "llama3-8b-32xh100-1f1b.yaml"
SLOW = ROOT / "examples" / "plans" / "llama3-8b-8xh100-slow.yaml"
DEEPSPEED = ROOT / "examples" / "plans" / "llama3-70b-64xh100-deepspeed.yaml"  # two files
CPU = ROOT / "examples" / "cpu"
STANDIN = ROOT / "tests" / "data" / "standin"
TRAIN = dict(model="llama3-8b", cluster="dgx-h100", global_batch=64, seq_len=4096, top=3)
TRAIN_ARGS = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64", "--seq-len", "4096",
              "--top", "3"]
SERVE = dict(model="llama3-8b", cluster="dgx-h100", input_len=512, output_len=128, rate=5, requests=200,
             ttft_slo=500, tpot_slo=50)
SERVE_ARGS = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--input-len", "512", "--output-len", "128",
              "--rate", "5", "--requests", "200", "--ttft-slo", "500", "--tpot-slo", "50"]


def cli_json(*args: object, code: int = 0, **kwargs: object) -> dict:
    r = autoplan(*args, "--format", "json", **kwargs)  # type: ignore[arg-type]
    assert r.returncode == code, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_search_returns_the_document_and_table_the_command_prints():
    result = api.search(gpus=8, **TRAIN)
    assert result.ok and result.to_dict() == cli_json("search", *TRAIN_ARGS, "--gpus", "8")
    assert json.loads(result.to_json()) == result.to_dict()
    table = result.to_frame()
    assert list(table["rank"]) == [1, 2, 3]
    assert list(table["step_time_s"]) == [p.prediction.step_time_s for p in result.plans]
    assert table.loc[0, "layout"].startswith(f"dp{result.plans[0].plan.layout.dp} ")


def test_a_search_over_gpu_counts_prices_each_as_the_command_does():
    told: list[str] = []
    result = api.search(gpus=[8, 16, 32], train_tokens=1e11, progress=told.append, **TRAIN)
    # each count as its search ends, in the order they end
    assert sorted(int(line.split()[1]) for line in told) == [8, 16, 32]
    assert all(line.startswith("searched ") and line.endswith(" of 3 counts)") for line in told)
    assert result.to_dict() == cli_json("search", *TRAIN_ARGS, "--gpus", "8..32", "--train-tokens", "1e11")
    assert result.train is not None
    front = result.train.to_frame()
    assert list(front["gpus"]) == [8, 16, 32] and front["chosen"].sum() == 1
    assert result.train.front_svg().startswith("<svg")


def test_a_model_and_a_cluster_given_as_objects_search_as_their_names_do():
    from autoplan.descriptors.library import resolve_cluster, resolve_model

    by_name = api.search(gpus=8, **TRAIN).to_dict()
    objects = dict(TRAIN, model=resolve_model("llama3-8b"), cluster=resolve_cluster("dgx-h100"))
    assert api.search(gpus=8, **objects).to_dict() == by_name


def test_serve_returns_the_document_the_command_prints_on_one_count_and_several():
    one = api.serve(gpus=2, **SERVE)
    assert one.ok and one.to_dict() == cli_json("serve", *SERVE_ARGS, "--gpus", "2")
    assert list(one.to_frame()["deployment"]) == [r.plan.deployment.label() for r in one.plans]
    several = api.serve(gpus="1..4", **SERVE)
    assert several.to_dict() == cli_json("serve", *SERVE_ARGS, "--gpus", "1..4")
    assert several.sweep is not None and list(several.sweep.to_frame()["gpus"]) == [1, 2, 4]


def test_evaluate_and_explain_return_the_commands_documents_for_a_file_and_an_object():
    evaluated = api.evaluate(PLAN)
    assert evaluated.ok and evaluated.to_dict() == cli_json("evaluate", PLAN)
    assert api.evaluate(evaluated.plans[0].plan).to_dict() == evaluated.to_dict()
    explained = api.explain(PLAN, microbatches=4)
    assert explained.to_dict() == cli_json("explain", PLAN, "--microbatches", "4")
    assert len(explained.to_frame()) == explained.plan.layout.pp
    assert explained.timeline_svg().startswith("<svg")


def test_a_serving_plan_missing_its_slo_fails_evaluate_beside_a_training_plan_that_fits(tmp_path):
    # the command once exited 0 here: with training plans given, only they decided its exit
    tight = tmp_path / "tight.yaml"
    chat = (ROOT / "examples" / "serving" / "chat-plan.yaml").read_text()
    tight.write_text(chat.replace("slo: {ttft_ms: 1500.0,", "slo: {ttft_ms: 1.0,"))
    result = api.evaluate([tight, PLAN])
    assert [e.ok for e in result.plans] == [False, True] and not result.ok
    assert autoplan("evaluate", tight, PLAN).returncode == 1


@pytest.mark.parametrize(("plan", "to"), [(PLAN, "megatron"), (DEEPSPEED, "deepspeed")])
def test_export_returns_the_files_the_command_prints(plan, to):
    exported = api.export(plan, to=to)
    r = autoplan("export", plan, "--to", to)
    assert r.returncode == 0 and exported.text() == r.stdout
    assert exported.to_dict()["files"] == exported.files


def test_check_returns_the_commands_report_in_each_format_and_its_exit_code():
    result = api.check(SLOW, max_regression=0.05)
    assert not result.passed and result.exit_code == 1 and result.failed == ("regression",)
    assert result.to_dict() == cli_json("check", SLOW, "--max-regression", "0.05", code=1)
    for fmt, text in (("text", result.to_text()), ("junit", result.to_junit())):
        r = autoplan("check", SLOW, "--max-regression", "0.05", "--format", fmt)
        assert r.returncode == 1 and r.stdout == text
    assert list(result.to_frame()["status"]) == ["passed", "passed", "failed"]


def test_calibrate_returns_the_commands_document_and_stack_file(tmp_path):
    runs = ROOT / "examples" / "runs" / "tiny-llama-2cpu.csv"
    result = api.calibrate(runs)
    out = tmp_path / "stack.yaml"
    assert result.to_dict() == cli_json("calibrate", runs, "--out", out)
    assert result.file_text() == out.read_text()
    assert len(result.to_frame()) == result.to_dict()["runs"]


def test_tune_runs_the_stand_in_launcher_as_the_command_does(tmp_path, monkeypatch):
    env = {"PATH": f"{STANDIN}{os.pathsep}{os.environ['PATH']}", "STANDIN_STEP_MS": "10",
           "STANDIN_PIDS": str(tmp_path / "pids"), "STANDIN_TOKENS": str(8 * 256)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job = dict(model=CPU / "tiny-llama.yaml", cluster=CPU / "local-cpu.yaml", gpus=2, global_batch=8,
               seq_len=256)
    result = api.tune(**job, runner="torchrun", top=1, steps=2, warmup=1, diverge=1000,
                      workdir=tmp_path / "w1", runs=tmp_path / "api.csv")
    assert result.ok and [t.outcome.status for t in result.trials] == ["ok"]
    args = [a for k, v in job.items() for a in (f"--{k.replace('_', '-')}", v)]
    doc = cli_json("tune", *args, "--runner", "torchrun", "--top", "1", "--steps", "2", "--warmup", "1",
                   "--diverge", "1000", "--workdir", tmp_path / "w2", "--runs", tmp_path / "cli.csv", env=env)
    mine = result.to_dict()
    for d in (mine, doc):  # what a run measures differs run to run
        for trial in d["trials"]:
            trial.pop("measured")
    assert mine == doc
    with open(tmp_path / "api.csv", newline="") as f:
        assert [row["source"] for row in csv.DictReader(f)] == ["tune"]  # appended, as the command does


@pytest.mark.parametrize(("call", "option"), [
    (lambda: api.search(model="no-such-model", cluster="dgx-h100", gpus=8, global_batch=8, seq_len=128),
     "--model"),
    (lambda: api.search(gpus=8, **dict(TRAIN, top=0)), "--top"),
    (lambda: api.search(gpus="eight", **TRAIN), "--gpus"),
    (lambda: api.search(gpus=8, price=3.0, **TRAIN), "--price"),
    (lambda: api.search(gpus=8, dtype="fp4", **TRAIN), "--dtype"),
    (lambda: api.serve(gpus=2, **dict(SERVE, rate=0)), "--rate"),
    (lambda: api.serve(gpus=2, objective="cost", **SERVE), "--objective"),
    (lambda: api.export(PLAN, to="no-such-launcher"), "--to"),
    (lambda: api.check(PLAN, max_slowdown=-1.0), "--max-slowdown"),
    (lambda: api.explain(PLAN, microbatches=0), "--microbatches"),
    (lambda: api.tune(model="llama3-8b", runner="no-such-runner", runs=None), "--runner"),
    (lambda: api.calibrate(ROOT / "examples" / "runs" / "tiny-llama-2cpu.csv", name="two\nlines"), "--name"),
], ids=["model", "top", "gpus", "price", "dtype", "rate", "objective", "to", "max-slowdown", "microbatches",
        "runner", "name"])
def test_bad_input_raises_input_error_naming_the_option_never_system_exit(call, option, capsys):
    with pytest.raises(api.InputError) as caught:
        call()
    assert caught.value.problems[0].source == option
    assert capsys.readouterr() == ("", "")  # nothing printed


def test_tune_serving_refuses_a_job_without_weights_to_serve_before_any_search(monkeypatch, tmp_path):
    monkeypatch.delenv("MODEL", raising=False)
    job = ROOT / "examples" / "serving" / "tune-job.yaml"
    with pytest.raises(api.InputError, match="--checkpoint: missing: the weights the engine serves"):
        api.tune_serving(job, runs=None, workdir=tmp_path / "w")
    prepared = api.prepare_tune_serving(job, runs=None, workdir=tmp_path / "w", checkpoint="/models/8b")
    assert prepared.trial.checkpoint == "/models/8b" and prepared.top == 3
    assert not (tmp_path / "w").exists()  # nothing run


def test_a_missing_plan_file_is_named_and_the_library_prints_nothing(capsys, tmp_path):
    with pytest.raises(api.InputError, match="plan.yaml: file not found"):
        api.evaluate(tmp_path / "plan.yaml")
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: 8\njob: {global_batch: 64, seq_len: 4096}\n")
    result = api.search(job, seq_len=2048, top=1)
    assert result.notes == (f"--seq-len 2048 overrides {job}'s 4096",)  # said in the result, not printed
    assert capsys.readouterr() == ("", "")


def test_the_api_package_neither_prints_nor_exits_nor_knows_the_command_line():
    import ast

    found = []
    for path in sorted((ROOT / "autoplan" / "api").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
            if called in ("print", "exit"):
                found.append(f"{path.name}:{node.lineno}: {node.func.id}()")
            if isinstance(node, ast.Attribute) and node.attr in ("exit", "stdout", "stderr") and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{path.name}:{node.lineno}: sys.{node.attr}")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                         else [a.name for a in node.names])
                found += [f"{path.name}:{node.lineno}: import {n}" for n in names
                          if n.split(".")[0] in ("typer", "rich") or n.startswith("autoplan.cli")]
    assert found == []


def run_example(name: str, args: list[str], cwd: Path, monkeypatch) -> int:
    """examples/python/NAME run as a script from ``cwd``: its exit code."""
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [name, *args])
    try:
        runpy.run_path(str(ROOT / "examples" / "python" / name), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_the_sweep_example_writes_each_models_counts_as_the_command_prices_them(tmp_path, monkeypatch,
                                                                                capsys):
    family = ("gpt-1.7b", "gpt-3.6b", "gpt-7.5b")  # Megatron-LM's GPT family (Narayanan et al. 2021)
    job = ["--gpus", "8..32", "--global-batch", "128", "--seq-len", "2048", "--train-tokens", "1e11"]
    args = ["--models", ",".join(family), *job]
    assert run_example("sweep_gpu_counts.py", args, tmp_path, monkeypatch) == 0
    out = capsys.readouterr().out
    assert "wrote sweep.csv" in out and (tmp_path / "sweep-gpt-7.5b.svg").read_text().startswith("<svg")
    with open(tmp_path / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted({r["model"] for r in rows}) == sorted(family)
    for model in family:
        doc = cli_json("search", "--model", model, "--cluster", "dgx-h100", *job)
        kept = [r for r in rows if r["model"] == model and r["kept"] == "True"]
        assert [int(r["gpus"]) for r in kept] == [p["gpus"] for p in doc["pareto"]]
        for r, p in zip(kept, doc["pareto"], strict=True):
            assert r["layout"] == p["layout"]
            assert float(r["train_days"]) == pytest.approx(p["train_days"], rel=1e-12)
            assert float(r["cost_usd"]) == pytest.approx(p["cost_usd"], rel=1e-12)
        chosen = [int(r["gpus"]) for r in rows if r["model"] == model and r["chosen"] == "True"]
        assert chosen == [doc["train"]["best_gpus"]]


@pytest.mark.parametrize("plan", [PLAN, SLOW], ids=["passes", "regressed"])
def test_the_ci_gate_example_prints_and_exits_as_the_command(plan, tmp_path, monkeypatch, capsys):
    code = run_example("ci_gate.py", [str(plan), "--max-regression", "0.05", "--junit", "report.xml"],
                       tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    text = autoplan("check", plan, "--max-regression", "0.05")
    junit = autoplan("check", plan, "--max-regression", "0.05", "--format", "junit")
    assert code == text.returncode == junit.returncode
    assert printed == text.stdout and (tmp_path / "report.xml").read_text() == junit.stdout


def test_the_engine_comparison_example_prints_each_engines_best_as_the_command(tmp_path, monkeypatch, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\ngpus: 2\nengine: vllm\nworkload:\n  input_len: 512\n"
                   "  output_len: 128\n  arrival: {rate_rps: 5}\n  requests: 200\n"
                   "slo: {ttft_ms: 500, tpot_ms: 50}\n")
    args = [str(job), "--engines", "vllm,sglang"]
    assert run_example("compare_engines.py", args, tmp_path, monkeypatch) == 0
    lines = capsys.readouterr().out.splitlines()
    printed = [json.loads(line) for line in lines if line.startswith("{")]
    assert [p["engine"] for p in printed] == ["vllm", "sglang"]
    for p in printed:
        best = cli_json("serve", job, "--engine", p["engine"])["plans"][0]
        assert p["deployment"] == best["deployment"] and p["prediction"] == best["prediction"]
    assert re.search(r"(vllm|sglang) serves the most tokens per GPU within the SLO", lines[-1])


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_every_python_snippet_of_the_api_doc_runs(monkeypatch, tmp_path, capsys):
    blocks = python_blocks((ROOT / "docs" / "API.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 9  # the overview and one per function
    monkeypatch.chdir(ROOT)  # the snippets name the repository's example files
    for block in blocks:
        exec(compile(block.replace("OUT/", f"{tmp_path}/"), "docs/API.md", "exec"), {"__name__": "api_doc"})
    capsys.readouterr()


def test_the_readme_shows_the_python_api_and_links_its_doc(monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/API.md" in readme
    (snippet,) = [b for b in python_blocks(readme) if "autoplan import api" in b]
    monkeypatch.chdir(ROOT)
    exec(compile(snippet, "README.md", "exec"), {"__name__": "readme"})
