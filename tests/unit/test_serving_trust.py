"""How far to trust a serving prediction (``autoplan/serving/trust.py``, issue 49 item 5):
which parts of its iterations a measured profile corrects (and the profile's device, engine
and release), which come from the roofline, and the held-out error of its regime, in the
prediction's JSON (``evidence``) and its table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.errors import InputError
from autoplan.serving import trust
from autoplan.serving.trust import HeldOutError, held_out_error, write_accuracy
from tests.helpers import REPO, autoplan

PLAN = """\
autoplan: 1
kind: serving
model: llama3-8b
cluster: {{name: {cluster}, gpus: {gpus}}}
engine: vllm
deployment: {deployment}
workload: {{input_len: 256, output_len: 16, arrival: {arrival}, requests: 16}}
"""


def _evidence(tmp_path, cluster: str = "dgx-h200", gpus: int = 1, deployment: str = "{replicas: 1, tp: 1}",
              arrival: str = "{concurrency: 4}", *extra: str) -> dict:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(cluster=cluster, gpus=gpus, deployment=deployment, arrival=arrival))
    got = autoplan("evaluate", path, "--format", "json", *extra)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["plans"][0]["prediction"]["evidence"]


def test_a_plan_on_a_device_with_a_measured_profile_names_what_it_corrects(tmp_path) -> None:
    ev = _evidence(tmp_path)
    prov = ev["provenance"]
    # the engine's own kernels measured on the device (AIConfigurator's tables for vLLM)
    assert prov["profile"]["source"] == "profiles/measured/h200-vllm-0.24.0-aiconfigurator.csv"
    assert prov["profile"]["device"] == "h200" and prov["profile"]["engine"] == "vllm"
    # the engine profile applies its prefill attention (and collectives: none on one GPU);
    # its GEMM and decode rows do not (measured.profile.ENGINE_APPLIED_KINDS), and the fused
    # elementwise kernels are priced from bandwidth alone
    assert "attention" in prov["measured"]
    assert {"gemm", "kv_read", "elementwise", "logits"} <= set(prov["roofline"])


def test_a_collective_the_profile_never_measured_comes_from_the_roofline(tmp_path) -> None:
    # the bench H200 profile was taken on one GPU: no collective rows
    bench = REPO / "profiles" / "measured" / "h200-2026-11-26.csv"
    prov = _evidence(tmp_path, "dgx-h200", 2, "{replicas: 1, tp: 2}", "{concurrency: 4}", "--profile",
                     bench)["provenance"]
    assert "tp_comm" in prov["roofline"] and "gemm" in prov["measured"]


def test_a_plan_on_a_device_without_a_profile_is_all_roofline(tmp_path) -> None:
    prov = _evidence(tmp_path, cluster="dgx-a100")["provenance"]
    assert prov["profile"] is None and not prov["measured"]
    assert {"gemm", "attention", "kv_read", "elementwise", "logits"} <= set(prov["roofline"])


def test_a_profile_naming_its_engine_and_release_says_so(tmp_path) -> None:
    text = (REPO / "profiles" / "measured" / "h200-2026-11-26.csv").read_text()
    tagged = tmp_path / "tagged.csv"
    tagged.write_text("# engine: vllm\n# engine_version: 0.19.0\n" + text)
    ev = _evidence(tmp_path, "dgx-h200", 1, "{replicas: 1, tp: 1}", "{concurrency: 4}", "--profile", tagged)
    profile = ev["provenance"]["profile"]
    assert (profile["engine"], profile["engine_version"], profile["device"]) == ("vllm", "0.19.0", "h200")
    assert profile["source"].endswith("tagged.csv")


def test_the_regime_is_the_engine_the_gpu_and_the_mode(tmp_path) -> None:
    held = _evidence(tmp_path)["held_out_error"]
    assert (held["engine"], held["gpu"], held["mode"], held["measured"]) == ("vllm", "h200", "agg", False)
    split = ("{disaggregated: {prefill: {replicas: 1, tp: 1}, decode: {replicas: 1, tp: 1}}}")
    held = _evidence(tmp_path, "dgx-h100", 2, split, "{rate_rps: 2.0}")["held_out_error"]
    assert held["mode"] == "disagg"


def test_the_table_ends_with_the_evidence_in_words(tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN.format(cluster="dgx-h200", gpus=1, deployment="{replicas: 1, tp: 1}",
                                arrival="{concurrency: 4}"))
    got = autoplan("evaluate", path)
    assert "engine vllm 0.33.0: predicted as release line 0.33.0" in got.stdout
    assert ("kernels measured (profiles/measured/h200-vllm-0.24.0-aiconfigurator.csv, taken on h200 with "
            "vllm 0.24.0)") in got.stdout
    assert "held-out error (vllm, h200, agg): not measured" in got.stdout


def test_the_shipped_accuracy_file_reads_and_measures_the_silicon_fits_held_out_gpus() -> None:
    """benchmarks/serving_silicon_fit.py --write: each engine's regimes on the GPUs of
    NVIDIA's measured runs it fitted on (H100, B200, GB200), each held out in turn; the
    reserved GPUs' (H200, B300, GB300) are never in it, so their regimes read as not measured."""
    data = json.loads(trust.accuracy_path().read_text())
    assert "about" in data and "serving_silicon_fit.py" in data["source"]
    regimes = data["regimes"]
    assert set(regimes) == {"vllm", "sglang", "trtllm"}
    assert {gpu for gpus in regimes.values() for gpu in gpus} == {"h100-sxm", "b200", "gb200"}
    for engine, gpus in regimes.items():
        for gpu, modes in gpus.items():
            assert modes and set(modes) <= {"agg", "disagg"}, (engine, gpu)
            for mode in modes:
                held = held_out_error(engine, gpu, mode)
                assert held.measured and held.ttft_mape is not None and held.tpot_mape is not None
    assert held_out_error("trtllm", "b200", "disagg").measured
    for gpu in ("h200", "b300", "gb300"):
        assert not held_out_error("trtllm", gpu, "agg").measured


def test_the_writer_and_the_reader_agree(tmp_path) -> None:
    path = tmp_path / "accuracy.json"
    write_accuracy({"trtllm": {"b200": {"agg": {"ttft_mape": 0.18, "tpot_mape": 0.07, "rows": 120}}}},
                   source="benchmarks/serving_accuracy.py (test)", path=path)
    got = held_out_error("trtllm", "b200", "agg", path)
    assert got == HeldOutError("trtllm", "b200", "agg", 0.18, 0.07, 120)
    assert got.label() == "held-out error (trtllm, b200, agg): TTFT 18%, TPOT 7% MAPE over 120 runs"
    assert not held_out_error("trtllm", "b200", "disagg", path).measured  # a regime it lacks
    assert not held_out_error("trtllm", "b200", "agg", tmp_path / "none.json").measured  # no file


@pytest.mark.parametrize("entry,words", [
    ({"ttft_mape": -0.1, "tpot_mape": 0.1, "rows": 3}, "ttft_mape"),
    ({"ttft_mape": 0.1, "tpot_mape": 0.1, "rows": 2.5}, "rows"),
    ({"ttft_mape": 0.1, "tpot_mape": 0.1, "rows": 3, "bias": 0.2}, "unknown fields bias"),
])
def test_the_writer_refuses_a_bad_entry_and_writes_nothing(tmp_path, entry, words) -> None:
    path = tmp_path / "accuracy.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match=words):
        write_accuracy({"vllm": {"h100-sxm": {"agg": entry}}}, source="test", path=path)
    with pytest.raises(ValueError, match="mode"):
        write_accuracy({"vllm": {"h100-sxm": {"aggregated": {"rows": 1}}}}, source="test", path=path)
    assert path.read_text() == "{}"


def test_a_hand_edited_accuracy_file_with_a_bad_entry_is_named_by_file_and_field(tmp_path) -> None:
    path = tmp_path / "accuracy.json"
    path.write_text(json.dumps({"regimes": {"vllm": {"h100-sxm": {"agg": {"rows": -1}}}}}))
    with pytest.raises(InputError, match=r"accuracy.json: regimes.vllm.h100-sxm.agg: rows"):
        held_out_error("vllm", "h100-sxm", "agg", Path(path))
