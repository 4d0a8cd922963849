"""The strict loader and the descriptor resolvers, at library level: what a
file may say, how each problem is reported, and a smoke test that every shipped
file (profiles/, searchspace/, examples/) loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from autoplan.commands.request import build_request
from autoplan.descriptors.library import (
    builtin_names,
    resolve_any_cluster,
    resolve_cluster,
    resolve_device,
    resolve_model,
    resolve_stack,
    with_gpus,
)
from autoplan.descriptors.space import builtin_spaces, load_space
from autoplan.descriptors.strict import Fields, parse_yaml, read_yaml
from autoplan.errors import AutoplanError, InputError, Problem
from autoplan.plans.file import read_plan
from autoplan.schedules import Schedule
from autoplan.vocab import Dtype

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PROFILES = ROOT / "profiles"
SEARCHSPACE = ROOT / "searchspace"

LLAMA3_8B = {
    "name": "llama3-8b-inline", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
    "ffn_hidden": 14336, "vocab": 128256, "activation": "swiglu", "position": "rope",
    "tied_embeddings": False, "max_seq_len": 8192,
}


def problems_of(exc: pytest.ExceptionInfo[InputError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def read_fields(data: object, source: str = "f.yaml", path: str = "") -> tuple[Fields, list[Problem]]:
    problems: list[Problem] = []
    return Fields(data, source, path, problems), problems


# --------------------------------------------------------------------------- parse_yaml

def test_a_duplicate_key_is_refused_with_both_lines() -> None:
    with pytest.raises(InputError) as exc:
        parse_yaml("a: 1\nb: 2\na: 3\n", "dup.yaml")
    (message,) = problems_of(exc)
    assert message.startswith("dup.yaml: line 3, column 1: ")
    assert "duplicate key 'a'" in message and "first at line 1" in message


def test_a_duplicate_key_in_a_nested_mapping_is_refused() -> None:
    with pytest.raises(InputError, match="duplicate key 'tp'"):
        parse_yaml("layout: {dp: 1, tp: 2, tp: 4}\n", "dup.yaml")


@pytest.mark.parametrize(("text", "value"), [
    ("989e12", 989e12), ("1e-3", 1e-3), ("-2E+5", -2e5), ("3.35e3", 3350.0), ("1.0e3", 1000.0),
    ("1.5", 1.5), ("8", 8), ("1_000", 1000),
])
def test_numbers_in_scientific_notation_are_numbers(text: str, value: float) -> None:
    parsed = parse_yaml(f"x: {text}\n", "n.yaml")["x"]
    assert parsed == value and not isinstance(parsed, str)


@pytest.mark.parametrize("text", ["e5", "1e", "bf16", "1f1b"])
def test_words_that_only_look_numeric_stay_strings(text: str) -> None:
    assert parse_yaml(f"x: {text}\n", "n.yaml")["x"] == text


def test_invalid_yaml_names_the_source_line_and_column() -> None:
    with pytest.raises(InputError) as exc:
        parse_yaml("a: [1, 2\nb: 3\n", "bad.yaml")
    (message,) = problems_of(exc)
    assert message.startswith("bad.yaml: line ")
    assert "column" in message and "invalid YAML" in message


def test_a_missing_file_is_an_input_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as exc:
        read_yaml(missing)
    assert problems_of(exc) == [f"{missing}: file not found"]


def test_input_errors_exit_with_code_two() -> None:
    assert issubclass(InputError, AutoplanError)
    assert InputError.single("f.yaml", "a", "bad").exit_code == 2


# --------------------------------------------------------------------------- Fields

def test_a_problem_reads_file_then_key_path_then_message() -> None:
    assert str(Problem("f.yaml", "layout.tp", "expected an integer, got string 'eight'")) == (
        "f.yaml: layout.tp: expected an integer, got string 'eight'")
    assert str(Problem("f.yaml", "", "file not found")) == "f.yaml: file not found"


def test_an_input_error_message_has_one_line_per_problem() -> None:
    error = InputError([Problem("a.yaml", "x", "one"), Problem("a.yaml", "y", "two")])
    assert str(error).splitlines() == ["a.yaml: x: one", "a.yaml: y: two"]


def test_a_string_where_an_integer_belongs_is_reported_with_its_key_path() -> None:
    f, problems = read_fields({"layout": {"tp": "eight"}}, "plan.yaml")
    assert f.child("layout", f.raw("layout")).int("tp") is None
    assert [str(p) for p in problems] == [
        "plan.yaml: layout.tp: expected an integer, got string 'eight'"]


@pytest.mark.parametrize(("value", "message"), [
    (True, "expected an integer, got boolean True"),
    (2.5, "expected an integer, got 2.5"),
    (None, "missing required field"),
    (0, "expected a value >= 1, got 0"),
])
def test_integers_are_checked_for_type_and_bounds(value: object, message: str) -> None:
    f, problems = read_fields({"n": value})
    assert f.int("n", min=1) is None
    assert [p.message for p in problems] == [message]


def test_a_whole_float_is_accepted_as_an_integer() -> None:
    f, problems = read_fields({"n": 8.0})
    assert f.int("n") == 8 and isinstance(f.int("n"), int)
    assert problems == []


def test_a_float_field_accepts_an_integer_and_refuses_a_string() -> None:
    f, problems = read_fields({"a": 80, "b": "80GB", "c": -1.0})
    assert f.float("a") == 80.0
    assert f.float("b") is None
    assert f.float("c", positive=True) is None
    assert [p.message for p in problems] == [
        "expected a number, got string '80GB'", "expected a number > 0, got -1"]


def test_a_quoted_true_is_not_a_boolean() -> None:
    f, problems = read_fields(parse_yaml('sp: "true"\n', "p.yaml"))
    assert f.bool("sp") is None
    assert problems[0].message == "expected true or false, got string 'true'"


def test_enums_accept_any_case_and_list_the_choices_otherwise() -> None:
    f, problems = read_fields({"a": "1F1B", "b": "2f2b"})
    assert f.enum("a", Schedule) is Schedule.ONE_F_ONE_B
    assert f.enum("b", Schedule) is None
    (problem,) = problems
    assert problem.field == "b"
    assert "gpipe | 1f1b | interleaved" in problem.message and "'2f2b'" in problem.message


def test_an_integer_list_names_the_bad_element() -> None:
    f, problems = read_fields({"stages": [40, "forty"]})
    assert f.int_list("stages", min=1) is None
    assert [str(p) for p in problems] == ["f.yaml: stages[1]: expected an integer, got string 'forty'"]


def test_defaults_apply_to_missing_and_null_fields() -> None:
    f, problems = read_fields({"cp": None})
    assert f.int("cp", 1) == 1 and f.int("ep", 1) == 1
    assert f.enum("dtype", Dtype, Dtype.BF16) is Dtype.BF16
    assert problems == []


def test_an_unknown_key_suggests_the_nearest_valid_one() -> None:
    f, problems = read_fields({"micro_bach": 1})
    f.int("micro_batch", 1)
    f.str("schedule", "1f1b")
    f.close()
    (problem,) = problems
    assert problem.field == "micro_bach"
    assert "did you mean 'micro_batch'?" in problem.message
    assert "valid fields: micro_batch, schedule" in problem.message


def test_an_unknown_key_far_from_every_valid_one_gets_no_suggestion() -> None:
    f, problems = read_fields({"colour": "red"})
    f.int("layers", 1)
    f.close()
    assert "did you mean" not in problems[0].message
    assert "unknown field" in problems[0].message


def test_a_non_mapping_is_reported_where_a_mapping_belongs() -> None:
    f, problems = read_fields([1, 2], "plan.yaml", "layout")
    assert not f.ok
    assert [str(p) for p in problems] == ["plan.yaml: layout: expected a mapping, got a list"]


def test_every_problem_in_one_mapping_is_collected_before_raising() -> None:
    f, problems = read_fields({"a": "x", "b": -1, "c": "maybe", "typo": 1})
    f.int("a")
    f.int("b", min=0)
    f.bool("c")
    f.int("missing")
    f.close()
    assert [p.field for p in problems] == ["a", "b", "c", "missing", "typo"]


# --------------------------------------------------------------------------- descriptors

def test_a_model_mapping_with_several_problems_reports_them_all_at_once() -> None:
    broken = {**LLAMA3_8B, "layers": 0, "hidden": "big", "activation": "swish", "colour": "red"}
    with pytest.raises(InputError) as exc:
        resolve_model(broken, "plan.yaml", "model")
    assert [p.field for p in exc.value.problems] == [
        "model.layers", "model.hidden", "model.activation", "model.colour"]
    assert all(p.source == "plan.yaml" for p in exc.value.problems)


def test_a_model_file_reports_problems_under_its_own_path(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("model:\n  name: m\n  layers: two\n", encoding="utf-8")
    with pytest.raises(InputError) as exc:
        resolve_model(str(path))
    messages = problems_of(exc)
    assert f"{path}: model.layers: expected an integer, got string 'two'" in messages
    assert f"{path}: model.hidden: missing required field" in messages


def test_kv_heads_must_divide_heads() -> None:
    with pytest.raises(InputError, match=r"model\.kv_heads: expected a divisor of heads \(32\)"):
        resolve_model({**LLAMA3_8B, "kv_heads": 12})


def test_an_unknown_model_name_suggests_and_lists_the_builtins() -> None:
    with pytest.raises(InputError) as exc:
        resolve_model("llama3-8")
    (message,) = problems_of(exc)
    assert message.startswith("--model: model: unknown model 'llama3-8'")
    assert "did you mean 'llama3-8b'" in message
    for name in builtin_names("model"):
        assert name in message


def test_a_huggingface_config_resolves_as_a_model() -> None:
    model = resolve_model(str(ROOT / "tests" / "data" / "hf" / "Meta-Llama-3-8B.json"))
    assert dataclasses.replace(model, name="llama3-8b") == resolve_model("llama3-8b")


@pytest.mark.parametrize("name", builtin_names("model"))
def test_every_builtin_model_resolves_by_name_and_by_path(name: str) -> None:
    model = resolve_model(name)
    assert model.name == name
    assert model.params_total > 0 and model.params_active <= model.params_total
    assert resolve_model(str(PROFILES / "models" / f"{name}.yaml")) == model


@pytest.mark.parametrize("name", builtin_names("device"))
def test_every_builtin_device_resolves(name: str) -> None:
    device = resolve_device(name, "test", "device")
    assert device.name == name
    assert device.peak_bf16_flops > 1e12 and device.mem_bytes > 2**30 and device.hbm_Bps > 1e9


@pytest.mark.parametrize("name", builtin_names("cluster"))
def test_every_builtin_cluster_resolves_by_name_and_by_path(name: str) -> None:
    cluster = resolve_cluster(name)
    assert cluster.name == name and cluster.gpus == cluster.gpus_per_node * cluster.nodes
    assert cluster.inter_node.bandwidth_Bps > 0 and cluster.intra_node.bandwidth_Bps > 0
    assert resolve_cluster(str(PROFILES / "hardware" / f"{name}.yaml")) == cluster


def test_the_cluster_short_form_is_the_builtin_with_its_node_count() -> None:
    cluster = resolve_cluster({"name": "dgx-h100", "nodes": 32}, "plan.yaml", "cluster")
    assert cluster == dataclasses.replace(resolve_cluster("dgx-h100"), nodes=32)
    assert cluster.gpus == 256


def test_the_cluster_short_form_defaults_to_one_node() -> None:
    assert resolve_cluster({"name": "dgx-a100"}).gpus == 8


@pytest.mark.parametrize(("ref", "field", "text"), [
    ({"name": "dgx-h100", "nodez": 2}, "cluster.nodez", "did you mean 'nodes'?"),
    ({"name": "dgx-h100", "nodes": 0}, "cluster.nodes", "expected a value >= 1, got 0"),
    ({"name": "dgx-h900", "nodes": 2}, "cluster.name", "unknown cluster 'dgx-h900'"),
])
def test_the_cluster_short_form_reports_its_problems(ref: dict, field: str, text: str) -> None:
    with pytest.raises(InputError) as exc:
        resolve_cluster(ref, "plan.yaml", "cluster")
    (problem,) = exc.value.problems
    assert (problem.source, problem.field) == ("plan.yaml", field)
    assert text in problem.message


def test_an_inline_cluster_may_name_a_builtin_device() -> None:
    cluster = resolve_cluster({
        "name": "mine", "device": "h100-sxm", "gpus_per_node": 4,
        "intra_node": {"bandwidth_GBps": 450, "latency_us": 3},
        "inter_node": {"bandwidth_GBps": 50, "latency_us": 10}})
    assert cluster.device == resolve_device("h100-sxm", "test", "device")
    assert cluster.nvlink_domain == 4  # defaults to gpus_per_node
    assert cluster.inter_node.bandwidth_Bps == pytest.approx(50e9)
    assert cluster.inter_node.latency_s == pytest.approx(10e-6)


def test_an_inline_device_problem_is_reported_under_the_cluster_path() -> None:
    with pytest.raises(InputError) as exc:
        resolve_cluster({
            "name": "mine", "gpus_per_node": 8,
            "device": {"name": "d", "peak_tflops": {"bf16": "fast"}, "mem_GiB": 80,
                       "hbm_GBps": 3350},
            "intra_node": {"bandwidth_GBps": 450, "latency_us": 3},
            "inter_node": {"bandwidth_GBps": 50, "latency_us": 10}}, "plan.yaml", "cluster")
    assert problems_of(exc) == [
        "plan.yaml: cluster.device.peak_tflops.bf16: expected a number, got string 'fast'"]


def test_device_numbers_in_scientific_notation_are_read_in_their_units() -> None:
    data = parse_yaml("device: {name: d, peak_tflops: {bf16: 989e0}, mem_GiB: 8e1, "
                      "hbm_GBps: 3.35e3}\n", "d.yaml")
    device = resolve_device(data["device"], "d.yaml", "device")
    assert device.peak_bf16_flops == pytest.approx(989e12)
    assert device.mem_bytes == 80 * 2**30
    assert device.hbm_Bps == pytest.approx(3.35e12)


def test_with_gpus_sizes_a_cluster_in_whole_nodes_or_part_of_one() -> None:
    h100 = resolve_cluster("dgx-h100")
    assert with_gpus(h100, 64).nodes == 8
    part = with_gpus(h100, 4)
    assert (part.nodes, part.gpus_per_node, part.gpus) == (1, 4, 4)
    with pytest.raises(InputError, match="expected a multiple of dgx-h100's 8 GPUs per node"):
        with_gpus(h100, 12)


# --------------------------------------------------------------------------- plans

GOOD_PLAN = {
    "autoplan": 1, "model": "llama3-70b", "cluster": {"name": "dgx-h100", "nodes": 32},
    "job": {"global_batch": 1024, "seq_len": 8192}, "layout": {"dp": 16, "tp": 8, "pp": 2},
    "micro_batch": 1, "schedule": "1f1b", "recompute": "selective", "zero": 1,
    "sequence_parallel": True,
}


def test_a_plan_with_problems_in_several_sections_reports_them_all_at_once() -> None:
    bad = {**GOOD_PLAN, "layout": {"dp": 16, "tp": "eight", "pp": 2},
           "job": {"global_batch": 1024}, "micro_bach": 1}
    del bad["micro_batch"]
    with pytest.raises(InputError) as exc:
        read_plan(bad, "plan.yaml")
    fields = [p.field for p in exc.value.problems]
    assert {"layout.tp", "job.seq_len", "micro_bach"} <= set(fields)
    assert "micro_batch" not in fields  # the typo's suggestion says it; no second "missing"
    (typo,) = [p for p in exc.value.problems if p.field == "micro_bach"]
    assert "did you mean 'micro_batch'?" in typo.message


def test_a_plan_breaking_the_rules_names_each_rule() -> None:
    with pytest.raises(InputError) as exc:
        read_plan({**GOOD_PLAN, "layout": {"dp": 8, "tp": 8, "pp": 2}}, "plan.yaml")
    (problem,) = exc.value.problems
    assert problem.field == "layout" and "but the cluster has 256 GPUs" in problem.message


def test_the_prediction_block_of_a_plan_is_ignored_on_input() -> None:
    plan = read_plan(GOOD_PLAN, "plan.yaml")
    again = read_plan({**GOOD_PLAN, "prediction": {"feasible": False, "anything": 1}}, "plan.yaml")
    assert plan == again


# --------------------------------------------------------------------------- every shipped file

def _profile_files() -> list[Path]:
    return sorted(PROFILES.glob("*/*.yaml"))


@pytest.mark.parametrize("path", _profile_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_profile_file_loads(path: Path) -> None:
    data = read_yaml(path)
    (kind,) = data
    if kind == "model":
        assert resolve_model(str(path)).name == path.stem
    elif kind == "device":
        assert resolve_device(str(path), "test", "device").name == path.stem
    elif kind == "stack":
        assert resolve_stack(str(path)).name == path.stem
    else:
        assert kind == "cluster"
        assert resolve_cluster(str(path)).name == path.stem


@pytest.mark.parametrize("name", builtin_spaces())
def test_every_search_space_loads_by_name_and_by_path(name: str) -> None:
    space = load_space(name)
    assert space.name == name
    assert space.schedules and space.recompute and space.zero and space.micro_batches
    assert load_space(str(SEARCHSPACE / f"{name}.yaml")) == space


def test_every_search_space_file_is_a_builtin() -> None:
    assert builtin_spaces() == sorted(p.stem for p in SEARCHSPACE.glob("*.yaml"))


@pytest.mark.parametrize("path", sorted((EXAMPLES / "plans").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_plan_loads(path: Path) -> None:
    plan = read_plan(read_yaml(path), str(path))
    assert plan.layout.gpus == plan.cluster.gpus


@pytest.mark.parametrize("path", sorted((EXAMPLES / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_job_loads(path: Path) -> None:
    request = build_request(path)
    assert request.cluster.gpus >= request.cluster.gpus_per_node
    assert request.job.global_batch > 0 and request.job.seq_len > 0


@pytest.mark.parametrize("path", sorted((EXAMPLES / "models").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_model_loads(path: Path) -> None:
    assert resolve_model(str(path)).params_total > 0


@pytest.mark.parametrize("path", sorted((EXAMPLES / "clusters").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_cluster_loads(path: Path) -> None:
    assert resolve_any_cluster(str(path)).gpus > 0


def test_there_are_example_files_of_every_kind() -> None:
    for kind in ("plans", "jobs", "models", "clusters"):
        assert list((EXAMPLES / kind).glob("*.yaml")), kind


# --------------------------------------------------------------------------- requests

def test_a_request_from_options_alone_needs_model_cluster_and_job() -> None:
    with pytest.raises(InputError) as exc:
        build_request(None)
    fields = {p.field for p in exc.value.problems}
    assert {"model", "cluster", "job.global_batch", "job.seq_len"} <= fields


def test_request_options_win_over_the_job_file() -> None:
    request = build_request(EXAMPLES / "jobs" / "llama3-70b-256xh100.yaml", gpus=64,
                            seq_len=4096, space="megatron")
    assert request.cluster.gpus == 64
    assert (request.job.global_batch, request.job.seq_len) == (1024, 4096)
    assert request.space.name == "megatron"


def test_a_relative_path_inside_a_file_is_taken_relative_to_that_file(tmp_path, monkeypatch) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "dev.yaml").write_text(
        "device: {name: d, peak_tflops: {bf16: 100}, mem_GiB: 40, hbm_GBps: 1000}\n")
    (sub / "cl.yaml").write_text(
        "cluster:\n  name: c\n  device: dev.yaml\n  gpus_per_node: 4\n"
        "  intra_node: {bandwidth_GBps: 100, latency_us: 3}\n"
        "  inter_node: {bandwidth_GBps: 10, latency_us: 10}\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_cluster("sub/cl.yaml").device.name == "d"


def test_a_job_file_given_as_a_plan_says_so() -> None:
    job_file = {"model": "llama3-8b", "cluster": "dgx-h100", "job": {"global_batch": 8,
                                                                    "seq_len": 4096}}
    with pytest.raises(InputError) as exc:
        read_plan(job_file, "job.yaml")
    assert len(exc.value.problems) == 1
    assert "looks like a job file" in str(exc.value) and "autoplan search" in str(exc.value)


def test_an_option_is_named_once_in_its_error() -> None:
    from autoplan.commands.request import build_request

    with pytest.raises(InputError) as exc:
        build_request(None, model="llama9", cluster="dgx-h100", global_batch=8, seq_len=128)
    assert str(exc.value).startswith("--model: unknown model 'llama9'")


# ---- part of a node: {name: BUILT-IN, gpus: N}

PART = """\
autoplan: 1
model: llama3-8b
cluster: {name: dgx-h100, gpus: 4}
job: {global_batch: 16, seq_len: 4096}
layout: {dp: 4, tp: 1, pp: 1}
micro_batch: 1
"""


def test_a_plan_may_use_part_of_a_node_and_writes_it_back_so():
    from autoplan.descriptors.library import resolve_cluster, with_gpus
    from autoplan.plans.file import plan_document, read_plan

    plan = read_plan(yaml.safe_load(PART), "<part>", correct=False)
    assert plan.cluster == with_gpus(resolve_cluster("dgx-h100"), 4)
    assert plan.cluster.gpus_per_node == 4 and plan.cluster.nvlink_domain == 4
    assert plan_document(plan)["cluster"] == {"name": "dgx-h100", "gpus": 4}
    whole = read_plan(yaml.safe_load(PART.replace("gpus: 4", "gpus: 16").replace("dp: 4", "dp: 16")),
                      "<whole>", correct=False)
    assert plan_document(whole)["cluster"] == {"name": "dgx-h100", "nodes": 2}


@pytest.mark.parametrize(("cluster", "message"), [
    ("{name: dgx-h100, gpus: 12}", "cluster.gpus: expected a multiple of dgx-h100's 8 GPUs per node"),
    ("{name: dgx-h100, gpus: 0}", "cluster.gpus: expected a value >= 1"),
    ("{name: dgx-h100, gpus: 4, nodes: 1}", "cluster.gpus: give nodes or gpus, not both"),
])
def test_a_bad_gpu_count_names_the_field(cluster, message):
    from autoplan.plans.file import read_plan

    with pytest.raises(InputError) as exc:
        read_plan(yaml.safe_load(PART.replace("{name: dgx-h100, gpus: 4}", cluster)), "p.yaml")
    assert message in str(exc.value)
