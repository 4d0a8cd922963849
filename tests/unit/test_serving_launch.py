"""Launch scripts for disaggregated deployments and speculative decoding (issue 32): each
instance's command line is the engine's own (parsed by vLLM's and SGLang's parsers where
AUTOPLAN_VLLM_PYTHON / AUTOPLAN_SGLANG_PYTHON name a Python with the engine and its router
installed, as tests/unit/test_serving.py does for aggregated ones), and the router's lists
every instance at the port its script gives it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.export.engines import launch
from autoplan.export.serving import export_serving
from autoplan.serving.engine import Engine
from autoplan.serving.planfile import read_serving_plan
from tests.helpers import autoplan, run_launch_script

ENGINE_PYTHON = {"vllm": os.environ.get("AUTOPLAN_VLLM_PYTHON"),
                 "sglang": os.environ.get("AUTOPLAN_SGLANG_PYTHON")}
HELPERS = Path(__file__).resolve().parents[1] / "engines"
SERVER = {"vllm": ["vllm", "serve"], "sglang": ["python", "-m", "sglang.launch_server"]}
ROUTER = {"vllm": ["vllm-router"], "sglang": ["python", "-m", "sglang_router.launch_router"]}

DISAGGREGATED = """\
autoplan: 1
kind: serving
model: llama3-70b
cluster: {name: dgx-h100, nodes: 2}
engine: ENGINE
deployment: {disaggregated: {prefill: {replicas: 2, tp: 4}, decode: {replicas: 1, tp: 8}}}
workload: {input_len: 2000, output_len: 200, arrival: {rate_rps: 2}, requests: 100}
"""


def _plan(text: str, engine: str):
    text = text.replace("ENGINE", engine)
    return read_serving_plan(parse_yaml(text, "p.yaml"), "p.yaml")


def _launches(tmp_path: Path, engine: str) -> tuple[list[tuple[str, int, list[str]]], list[str]]:
    """Each instance's command line ((role, replica, argv)) and the router's."""
    plan = _plan(DISAGGREGATED, engine)
    files = export_serving(plan, Engine(engine), "p.yaml")
    assert set(files) == {f"serve-{engine}-prefill.sh", f"serve-{engine}-decode.sh", f"router-{engine}.sh"}
    out = []
    for role, replicas in (("prefill", 2), ("decode", 1)):
        for r in range(replicas):
            argv = run_launch_script(files[f"serve-{engine}-{role}.sh"], tmp_path, SERVER[engine],
                                     REPLICA=str(r))
            out.append((role, r, argv))
    router = run_launch_script(files[f"router-{engine}.sh"], tmp_path, ROUTER[engine],
                               NODE_ADDRS="10.0.0.1 10.0.0.2")
    return out, router


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_disaggregated_deployment_is_a_script_per_pool_and_a_router_listing_every_instance(
        tmp_path, engine: str) -> None:
    instances, router = _launches(tmp_path, engine)
    ports = [int(argv[argv.index("--port") + 1]) for _, _, argv in instances]
    assert ports == [8000, 8001, 8002]  # the prefill pool's first, each its own
    tp_flag = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"}[engine]
    assert [argv[argv.index(tp_flag) + 1] for _, _, argv in instances] == ["4", "4", "8"]
    # prefill instances on the first node (GPUs 0-7), the decode instance on the second
    prefill = [i for i, a in enumerate(router) if a == "--prefill"]
    decode = [i for i, a in enumerate(router) if a == "--decode"]
    assert [router[i + 1] for i in prefill] == ["http://10.0.0.1:8000", "http://10.0.0.1:8001"]
    assert [router[i + 1] for i in decode] == ["http://10.0.0.2:8002"]
    if engine == "sglang":  # each prefill instance's bootstrap port, as its server was told
        boots = [argv[argv.index("--disaggregation-bootstrap-port") + 1] for role, _, argv in instances
                 if role == "prefill"]
        assert [router[i + 2] for i in prefill] == boots == ["8998", "8999"]
        modes = [argv[argv.index("--disaggregation-mode") + 1] for _, _, argv in instances]
        assert modes == ["prefill", "prefill", "decode"]
    else:
        assert all("--kv-transfer-config" in argv for _, _, argv in instances)


def test_the_instances_take_their_own_gpus_of_a_node(tmp_path) -> None:
    plan = _plan(DISAGGREGATED.replace("nodes: 2", "nodes: 1").replace(
        "{prefill: {replicas: 2, tp: 2}, decode: {replicas: 1, tp: 4}}", "").replace(
        "prefill: {replicas: 2, tp: 4}, decode: {replicas: 1, tp: 8}",
        "prefill: {replicas: 2, tp: 2}, decode: {replicas: 1, tp: 4}"), "vllm")
    files = export_serving(plan, Engine.VLLM, "p.yaml")
    seen = []
    for role, replicas in (("prefill", 2), ("decode", 1)):
        for r in range(replicas):
            path = tmp_path / "v.sh"
            text = files[f"serve-vllm-{role}.sh"]
            path.write_text(text.replace("exec vllm serve", 'echo "$CUDA_VISIBLE_DEVICES" #'))
            done = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                                  env={**os.environ, "MODEL": "m", "REPLICA": str(r)})
            seen.append(done.stdout.strip())
    assert seen == ["0,1", "2,3", "4,5,6,7"]


def test_an_instance_across_two_nodes_is_refused() -> None:
    """GPT-3's 96 heads take TP 6: after a TP-4 prefill instance (GPUs 0-3) the first TP-6
    decode instance would hold GPUs 4-9, on both nodes."""
    text = DISAGGREGATED.replace("ENGINE", "vllm").replace("llama3-70b", "gpt3-175b").replace(
        "{prefill: {replicas: 2, tp: 4}, decode: {replicas: 1, tp: 8}}",
        "{prefill: {replicas: 1, tp: 4}, decode: {replicas: 2, tp: 6}}").replace(
        "input_len: 2000", "input_len: 1000")
    plan = read_serving_plan(parse_yaml(text, "p.yaml"), "p.yaml")
    with pytest.raises(InputError) as info:
        export_serving(plan, Engine.VLLM, "p.yaml")
    assert [p.field for p in info.value.problems] == ["deployment.disaggregated.decode"]
    assert "GPUs 4..9" in info.value.problems[0].message


def test_tensorrt_llms_disaggregated_launch_is_refused_by_name(tmp_path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(DISAGGREGATED.replace("ENGINE", "trtllm"))
    got = autoplan("export", path, "--to", "trtllm")
    assert got.returncode == 2 and "deployment.disaggregated" in got.stderr and "Traceback" not in got.stderr


SPECULATIVE = """\
autoplan: 1
kind: serving
model: MODEL
cluster: {name: CLUSTER, nodes: 1}
engine: ENGINE
deployment: {replicas: 1, tp: 8, speculative: SPEC}
workload: {input_len: 1000, output_len: 200, arrival: {rate_rps: 1}, requests: 50}
"""
SPECS = {  # (model, cluster, speculative)
    "eagle": ("llama3-70b", "dgx-h100", "{method: eagle, tokens: 3, acceptance_length: 2.6}"),
    "draft": ("llama3-70b", "dgx-h100",
              "{method: draft, draft_model: llama3-8b, tokens: 4, acceptance_rate: 0.7}"),
    "ngram": ("llama3-70b", "dgx-h100", "{method: ngram, tokens: 3, acceptance_length: 1.8}"),
    "mtp": ("deepseek-v3", "dgx-h100", "{method: mtp, tokens: 1, acceptance_length: 1.8}"),
}


def _spec_plan(method: str, engine: str):
    model, cluster, spec = SPECS[method]
    text = (SPECULATIVE.replace("MODEL", model).replace("CLUSTER", cluster).replace("SPEC", spec)
            .replace("ENGINE", engine))
    return read_serving_plan(parse_yaml(text, "p.yaml"), "p.yaml")


def _spec_argv(tmp_path: Path, engine: str, method: str) -> list[str]:
    plan = _spec_plan(method, engine)
    script = export_serving(plan, Engine(engine), "p.yaml")[f"serve-{engine}.sh"]
    return run_launch_script(script, tmp_path, SERVER[engine], DRAFT_MODEL="org/draft")


@pytest.mark.parametrize("method", list(SPECS))
def test_vllms_speculative_config_says_what_the_prediction_ran(tmp_path, method: str) -> None:
    argv = _spec_argv(tmp_path, "vllm", method)
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    tokens = {"eagle": 3, "draft": 4, "ngram": 3, "mtp": 1}[method]
    assert config["num_speculative_tokens"] == tokens
    names = {"eagle": "eagle", "draft": "draft_model", "ngram": "ngram", "mtp": "mtp"}
    assert config["method"] == names[method]
    assert config.get("model") == ("org/draft" if method in ("eagle", "draft") else None)


def test_a_draft_path_that_would_break_the_json_is_refused_by_the_script(tmp_path) -> None:
    script = export_serving(_spec_plan("eagle", "vllm"), Engine.VLLM, "p.yaml")["serve-vllm.sh"]
    path = tmp_path / "s.sh"
    path.write_text(script)
    for bad in ('a"b', "a\\b"):
        done = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30,
                              env={**os.environ, "MODEL": "m", "DRAFT_MODEL": bad})
        assert done.returncode == 2 and "DRAFT_MODEL" in done.stderr


@pytest.mark.parametrize("method", list(SPECS))
def test_sglangs_speculative_flags_say_what_the_prediction_ran(tmp_path, method: str) -> None:
    argv = _spec_argv(tmp_path, "sglang", method)
    tokens = {"eagle": 3, "draft": 4, "ngram": 3, "mtp": 1}[method]
    assert argv[argv.index("--speculative-num-steps") + 1] == str(tokens)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(tokens + 1)
    assert ("--speculative-draft-model-path" in argv) is (method in ("eagle", "draft"))


@pytest.mark.parametrize(("method", "ok"), [("mtp", True), ("ngram", True), ("eagle", False),
                                            ("draft", False)])
def test_tensorrt_llm_takes_mtp_and_ngram_in_its_options_file(method: str, ok: bool) -> None:
    plan = _spec_plan(method, "trtllm")
    if not ok:
        with pytest.raises(InputError, match="speculative_model_dir"):
            export_serving(plan, Engine.TRTLLM, "p.yaml")
        return
    import yaml

    doc = yaml.safe_load(export_serving(plan, Engine.TRTLLM, "p.yaml")["extra-llm-api-options.yaml"])
    assert doc["speculative_config"]["decoding_type"] == {"mtp": "MTP", "ngram": "NGram"}[method]


# ---------------------------------------------------------------- the engines' own parsers

def _parse(engine: str, helper: str, argvs: list[list[str]], *extra: str) -> list[dict]:
    python = ENGINE_PYTHON[engine]
    if not python:
        pytest.skip(f"AUTOPLAN_{engine.upper()}_PYTHON (a Python with {engine}) not set")
    done = subprocess.run([python, str(HELPERS / helper), *extra], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = json.loads(done.stdout)
    for argv, values in zip(argvs, parsed, strict=True):
        assert "error" not in values, (argv, values, done.stderr[-2000:])
    return parsed


def _router_parser(engine: str) -> str:
    """Where the engine's router parses its arguments, as its file says."""
    dis = launch(Engine(engine)).disaggregation
    assert dis is not None
    return dis.parser


def test_vllms_own_parsers_read_the_disaggregated_launch(tmp_path) -> None:
    instances, router = _launches(tmp_path, "vllm")
    parsed = _parse("vllm", "vllm_serve_args.py", [argv for _, _, argv in instances])
    for values in parsed:
        config = values["kv_transfer_config"]
        config = json.loads(config) if isinstance(config, str) else config
        assert config["kv_connector"] == "NixlConnector" and config["kv_role"] == "kv_both"
    (r,) = _parse("vllm", "router_args.py", [router], _router_parser("vllm"))
    assert r["vllm_pd_disaggregation"] is True and r["kv_connector"] == "nixl"
    assert [u for u, _ in r["prefill_urls"]] == ["http://10.0.0.1:8000", "http://10.0.0.1:8001"]
    assert r["decode_urls"] == ["http://10.0.0.2:8002"]


def test_sglangs_own_parsers_read_the_disaggregated_launch(tmp_path) -> None:
    instances, router = _launches(tmp_path, "sglang")
    parsed = _parse("sglang", "sglang_server_args.py", [argv for _, _, argv in instances])
    assert [v["disaggregation_mode"] for v in parsed] == ["prefill", "prefill", "decode"]
    assert [v["disaggregation_bootstrap_port"] for v in parsed[:2]] == [8998, 8999]
    assert {v["disaggregation_transfer_backend"] for v in parsed} == {"nixl"}
    (r,) = _parse("sglang", "router_args.py", [router], _router_parser("sglang"))
    assert r["pd_disaggregation"] is True
    assert r["prefill_urls"] == [["http://10.0.0.1:8000", 8998], ["http://10.0.0.1:8001", 8999]]
    assert r["decode_urls"] == ["http://10.0.0.2:8002"]


def test_vllms_own_parser_reads_every_speculative_config(tmp_path) -> None:
    argvs = [_spec_argv(tmp_path, "vllm", method) for method in SPECS]
    for values in _parse("vllm", "vllm_serve_args.py", argvs):
        assert values["speculative_config"]["num_speculative_tokens"] >= 1


def test_sglangs_own_parser_reads_every_speculative_launch(tmp_path) -> None:
    argvs = [_spec_argv(tmp_path, "sglang", method) for method in SPECS]
    parsed = _parse("sglang", "sglang_server_args.py", argvs)
    assert [v["speculative_algorithm"] for v in parsed] == ["EAGLE", "STANDALONE", "NGRAM", "NEXTN"]
