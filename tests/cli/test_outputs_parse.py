"""Every document autoplan writes parses, whatever the names and numbers it was given held
(issue 34, item 4 and its property test): a name with quotes, '#', '&', '<', '$', braces
or any printable character goes into YAML, TOML, JSON, shell and XML through their
serializers; a number anywhere in its field's range gives exit 0, outside it exit 2
naming the field, never a traceback."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import xml.dom.minidom
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import resolve_cluster, resolve_model
from autoplan.errors import InputError
from autoplan.export import Launcher, Target
from autoplan.export import export as export_training
from autoplan.export.serving import export_serving
from autoplan.plans.file import read_plan
from autoplan.serving.engine import Engine
from autoplan.serving.planfile import read_serving_plan
from autoplan.text import NOT_IN_NAMES
from tests.helpers import BEST, PLANS, autoplan

ROOT = Path(__file__).resolve().parents[2]
# each launcher with a plan it runs
TRAINING = [(BEST, Target.MEGATRON, Launcher.MEGATRON), (BEST, Target.NEMO, Launcher.MEGATRON),
            (BEST, Target.SLURM, Launcher.MEGATRON),
            (PLANS / "llama3-70b-64xh100-deepspeed.yaml", Target.DEEPSPEED, Launcher.MEGATRON),
            (PLANS / "llama3-70b-64xh100-torchtitan.yaml", Target.TORCHTITAN, Launcher.MEGATRON)]
SERVING = ROOT / "examples" / "serving" / "chat-plan.yaml"

# what a name may hold (Fields.name): any printable character, markup and shell ones included
NAMES = st.text(st.characters(blacklist_categories=tuple(NOT_IN_NAMES)), min_size=1,
                max_size=30).filter(str.strip)  # a blank name is refused (Fields.name)
TRICKY = ["a<b & 'c' \"d\"", "x: 1 # {y: [z]}", "$(touch pwned)`id`;|&", "]]>&#0;<!--", "\\n\\x1b",
          "ünïcödé ✓ 模型", "-leading-dash", " spaced  out "]


def _doc(path: Path, name: str) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    doc.pop("prediction", None)
    doc["model"] = {**resolve_model(doc["model"] if isinstance(doc["model"], str)
                                    else doc["model"]["name"]).to_dict(), "name": name}
    cluster = doc["cluster"]
    ref = cluster if isinstance(cluster, str) else cluster["name"]
    extra = {} if isinstance(cluster, str) else {k: v for k, v in cluster.items() if k != "name"}
    doc["cluster"] = {**resolve_cluster(ref).to_dict(), **extra, "name": name}
    return doc


def _parses(filename: str, text: str) -> Any:
    """The document parsed by its format's own parser (a shell script by bash -n)."""
    if filename.endswith((".yaml", ".yml")):
        return yaml.safe_load(text)
    if filename.endswith(".json"):
        return json.loads(text)
    if filename.endswith(".toml"):
        try:
            import tomllib  # Python 3.11+
        except ImportError:  # pragma: no cover - 3.10: the structure compared without it
            return {"toml": text.count("\n[")}
        return tomllib.loads(text)
    if filename.endswith((".sh", ".sbatch")) or text.startswith("#!"):
        bash = shutil.which("bash")
        if bash:
            r = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True, check=False)
            assert r.returncode == 0, (filename, r.stderr)
        return None
    raise AssertionError(f"no parser for {filename}")


def _structure(value: Any) -> Any:
    """The document's shape: keys and types, no values (a name must change no key)."""
    if isinstance(value, dict):
        return {k: _structure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_structure(v) for v in value]
    return type(value).__name__


def _exports(name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, target, launcher in TRAINING:
        plan = read_plan(_doc(path, name), "plan.yaml")
        assert evaluate(plan).step_time_s > 0
        for filename, text in export_training(plan, target, "plan.yaml", launcher).items():
            out[f"{target.value}/{filename}"] = _structure(_parses(filename, text))
    for engine in Engine:
        plan = read_serving_plan({**_doc(SERVING, name), "engine": engine.value}, "plan.yaml")
        for filename, text in export_serving(plan, engine, "plan.yaml").items():
            out[f"{engine.value}/{filename}"] = _structure(_parses(filename, text))
    return out


@functools.cache
def _benign() -> dict[str, Any]:
    """The exports' structure for a plain name, worked out once in a process when a test
    first asks (not at import: every pytest-xdist worker imports this module to collect it,
    and this takes seconds, most of them in the serving plan's profile and forest)."""
    return _exports("benign")


@pytest.mark.parametrize("name", TRICKY)
def test_a_tricky_name_changes_no_key_of_any_export(name: str) -> None:
    assert _exports(name) == _benign()


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=NAMES)
def test_any_legal_name_goes_through_load_evaluate_and_every_export(name: str) -> None:
    assert _exports(name) == _benign()


# numeric fields of a plan's inline cluster and device, by key path
NUMBER_FIELDS = [("inter_node", "bandwidth_GBps"), ("inter_node", "latency_us"),
                 ("intra_node", "bandwidth_GBps"), ("intra_node", "efficiency"), ("pue",),
                 ("host_mem_GiB",), ("device", "mem_GiB"), ("device", "hbm_GBps"),
                 ("device", "peak_tflops", "bf16"), ("device", "efficiency", "gemm"),
                 ("device", "kernel_gap_us"), ("device", "reserve_GiB")]


def _with_number(where: tuple[str, ...], value: float) -> dict[str, Any]:
    doc = yaml.safe_load(BEST.read_text())
    doc.pop("prediction", None)
    doc["cluster"] = {**resolve_cluster("dgx-h100").to_dict(), "nodes": 8}
    inner = doc["cluster"]
    for key in where[:-1]:
        inner = inner[key]
    inner[where[-1]] = value
    return doc


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@example(where=("pue",), value=1.2)
@example(where=("inter_node", "bandwidth_GBps"), value=25)
@example(where=("device", "mem_GiB"), value=1e-300)
@example(where=("device", "peak_tflops", "bf16"), value=1e308)
@example(where=("intra_node", "efficiency"), value=2.0)
@given(where=st.sampled_from(NUMBER_FIELDS),
       value=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2**70, 2**70))
def test_any_number_in_a_cluster_is_read_or_refused_naming_the_field(where: tuple[str, ...],
                                                                      value: float) -> None:
    """Read, evaluated and exported to every launcher that runs the plan (each output
    parsed), or refused naming the file and that field: never a traceback."""
    field = "cluster." + ".".join(where)
    try:
        plan = read_plan(_with_number(where, value), "plan.yaml")
    except InputError as exc:
        assert exc.problems and all(p.source == "plan.yaml" for p in exc.problems)
        assert any(p.field == field or p.field.startswith(field) or p.field == "cluster"
                   for p in exc.problems), (field, exc.problems)
        return
    step = evaluate(plan).step_time_s
    assert 0 < step < 1e12 and step == step
    for target in (Target.MEGATRON, Target.NEMO, Target.SLURM):
        for filename, text in export_training(plan, target, "plan.yaml").items():
            _parses(filename, text)


def test_junit_and_svg_parse_with_hostile_paths_and_names(tmp_path: Path) -> None:
    """A plan path with a control character (XML cannot hold it: shown as \\x01) and a model
    name with markup; the JUnit report and both plots parse, the name in them as text."""
    plan = tmp_path / "pl\x01an <&>.yaml"
    plan.write_text(BEST.read_text())
    r = autoplan("check", plan, "--format", "junit")
    assert r.returncode == 0, r.stderr
    suite = xml.dom.minidom.parseString(r.stdout)
    assert "pl\\x01an <&>.yaml" in suite.getElementsByTagName("property")[0].getAttribute("value")

    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump({"model": {**resolve_model("llama3-8b").to_dict(), "name": "a<b & c"}}))
    svg = tmp_path / "front.svg"
    r = autoplan("search", "-m", model, "-c", "dgx-h100", "--gpus", "8,16", "-b", "64", "-s", "4096",
                 "--train-tokens", "1e11", "--plot", svg)
    assert r.returncode == 0, r.stderr
    texts = [t.firstChild.data for t in xml.dom.minidom.parse(str(svg)).getElementsByTagName("text")
             if t.firstChild is not None]
    assert any("a<b & c" in t for t in texts), texts
    r = autoplan("serve", "-m", model, "-c", "dgx-h100", "--gpus", "8", "--input-len", "512",
                 "--output-len", "64", "--rate", "2", "--top", "1", "--plot", svg)
    assert r.returncode == 0, r.stderr
    texts = [t.firstChild.data for t in xml.dom.minidom.parse(str(svg)).getElementsByTagName("text")
             if t.firstChild is not None]
    assert any("a<b & c" in t for t in texts), texts


def test_every_json_output_parses_with_a_tricky_name(tmp_path: Path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump({"model": {**resolve_model("llama3-8b").to_dict(),
                                               "name": "x\"}{'<&#"}}))
    for args in (("search", "-m", model, "-c", "dgx-h100", "--gpus", "8", "-b", "64", "-s", "4096",
                  "--top", "2", "--format", "json"),
                 ("serve", "-m", model, "-c", "dgx-h100", "--gpus", "8", "--input-len", "512",
                  "--output-len", "64", "--rate", "2", "--top", "2", "--format", "json")):
        r = autoplan(*args)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["plans"][0]["model"]["name"] == "x\"}{'<&#"


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("bash -n")
