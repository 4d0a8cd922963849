"""The learned correction: a random forest of measured/analytic ratios fitted on a profile.

The synthetic profile below is generated from the cost model's own analytic functions
times a known smooth function of shape (and 2% noise): what the surrogate must learn.
Inputs (the generating function) and predictions (the forest's) stay apart.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from autoplan import resources
from autoplan.commands.request import build_request
from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.library import resolve_cluster
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.compute import attention_time, gemm_time, grouped_gemm_time
from autoplan.measured import surrogate
from autoplan.measured.profile import format_profile, parse_profile, row_flops
from autoplan.measured.shipped import shipped_profile
from autoplan.measured.surrogate import (
    RatioForest,
    SurrogateCorrection,
    band,
    calibrate,
    fit_report,
)
from autoplan.vocab import Dtype
from tests.helpers import autoplan, autoplan_subprocess, make_plan

ROOT = Path(__file__).resolve().parents[2]
META = {"device_kind": "cuda", "device_name": "NVIDIA H100 80GB HBM3 (synthetic)", "torch": "2.13.0",
        "date": "2026-11-22", "command": "synthetic (tests/unit/test_surrogate.py)", "descriptor": "h100-sxm"}


# --------------------------------------------------------------------------- a synthetic profile

def gemm_factor(m: float, n: float, k: float) -> float:
    """Measured/analytic of the synthetic machine's GEMMs: slower for thin k, a wave in m."""
    return math.exp(0.35 * math.tanh((11 - math.log2(k)) / 2) + 0.15 * math.sin(math.log2(m) / 2))


def attention_factor(seq: float, backward: bool) -> float:
    return math.exp(0.3 * math.tanh((11 - math.log2(seq)) / 2) + (0.15 if backward else -0.05))


def collective_factor(nbytes: float, ranks: int) -> float:
    return math.exp(0.5 * math.tanh((22 - math.log2(nbytes)) / 4) + 0.05 * ranks)


def _row(kind: str, op: str, seconds: float, **shape: Any) -> dict[str, Any]:
    return {"kind": kind, "op": op, "dtype": shape.pop("dtype", "bf16"), **shape, "seconds": seconds,
            "seconds_p10": seconds * 0.97, "seconds_p90": seconds * 1.03, "repeats": 20}


def synthetic_rows(seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    cluster = resolve_cluster("dgx-h100")
    device = cluster.device
    noise = lambda: float(np.exp(rng.normal(0.0, 0.02)))  # noqa: E731
    rows = []
    for _ in range(240):
        m, n, k = (int(2 ** rng.integers(7, 15)) for _ in range(3))
        t = gemm_time(m, n, k, device, Dtype.BF16) * gemm_factor(m, n, k) * noise()
        rows.append(_row("gemm", "matmul", t, m=m, n=n, k=k))
    for _ in range(120):
        heads = int(rng.choice([8, 16, 32, 64]))
        attn = {"batch": int(rng.choice([1, 2, 4])), "heads": heads,
                "kv_heads": heads // int(rng.choice([1, 4, 8])), "seq": int(2 ** rng.integers(9, 15)),
                "head_dim": int(rng.choice([64, 128])), "causal": int(rng.integers(0, 2))}
        for op in ("sdpa_fwd", "sdpa_bwd"):
            rec = {"kind": "attention", "op": op, **attn}
            call = surrogate._row_call(rec)
            t = attention_time(row_flops(rec), call, device) * attention_factor(attn["seq"], call.backward)
            rows.append(_row("attention", op, t * noise(), **attn))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
        for ranks in ((2,) if op == "p2p" else (2, 4, 8)):
            for e in range(10, 31, 2):
                nb = 2**e
                t = surrogate._collective_time(op, nb, ranks, ranks, cluster)
                rows.append(_row("collective", op, t * collective_factor(nb, ranks) * noise(),
                                 nbytes=nb, ranks=ranks, ranks_per_node=ranks))
    for e in range(16, 31, 2):
        rows.append(_row("elementwise", "copy", 2**e / device.hbm_Bps, nbytes=2**e))
    return rows


@pytest.fixture(scope="module")
def profile_text() -> str:
    return format_profile(META, synthetic_rows())


@pytest.fixture(scope="module")
def profile(profile_text: str):
    return parse_profile(profile_text, "h100-synthetic.csv")


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory, profile_text: str) -> Path:
    path = tmp_path_factory.mktemp("profiles") / "h100-synthetic.csv"
    path.write_text(profile_text)
    return path


# --------------------------------------------------------------------------- the estimator

@parametrize_with_checks([RatioForest(n_estimators=10)])
def test_ratio_forest_follows_scikit_learn_rules(estimator, check):
    check(estimator)


def test_forest_prediction_is_the_mean_of_its_trees():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 3)), rng.normal(size=60)
    forest = RatioForest(n_estimators=7).fit(X, y)
    members = forest.predict_members(X[:5])
    assert members.shape == (7, 5)
    np.testing.assert_allclose(forest.predict(X[:5]), members.mean(axis=0))


# --------------------------------------------------------------------------- accuracy

def test_surrogate_held_back_error_is_well_below_the_analytic_error(profile):
    report = {row.kind: row for row in fit_report(profile, resolve_cluster("dgx-h100"))}
    assert set(report) == {"gemm", "attention", "collective"}
    for row in report.values():
        assert row.surrogate_mape is not None
        assert row.analytic_mape > 0.1  # the synthetic machine is off the analytic model ...
        assert row.surrogate_mape < row.analytic_mape / 3  # ... and the forest learns how
        assert row.surrogate_mape < 0.08


def test_fit_report_without_a_cluster_describes_the_measured_machine(profile):
    rows = fit_report(profile)
    assert [r.kind for r in rows] == ["gemm", "attention", "collective"]
    assert all(r.surrogate_mape is not None and r.surrogate_mape <= r.analytic_mape for r in rows)


# --------------------------------------------------------------------------- the hook

def test_a_corrected_gemm_is_the_analytic_time_times_the_predicted_ratio(profile):
    cluster = calibrate(resolve_cluster("dgx-h100"), profile)
    corrected, device = cluster.device, resolve_cluster("dgx-h100").device
    correction = corrected.correction
    assert isinstance(correction, SurrogateCorrection)
    m, n, k = 8192.0, 3072.0, 4096.0
    forest = correction.fitted.forests["gemm"]
    ratio = math.exp(forest.predict(np.array([surrogate.gemm_features(m, n, k, "bf16")]))[0])
    assert gemm_time(m, n, k, corrected, Dtype.BF16) == pytest.approx(
        gemm_time(m, n, k, device, Dtype.BF16) * ratio, rel=1e-12)
    assert ratio != pytest.approx(1.0, abs=0.01)
    # thin GEMMs were measured slower than the model: the forest says so
    thin = correction.gemm(8192.0, 8192.0, 256.0, Dtype.BF16)
    assert thin == pytest.approx(gemm_factor(8192, 8192, 256), rel=0.15)


def test_the_grouped_expert_gemm_attention_and_collectives_are_corrected(profile):
    base = resolve_cluster("dgx-h100")
    cluster = calibrate(base, profile)
    c = cluster.device.correction
    assert c is not None
    grouped = grouped_gemm_time(300.0, 4096.0, 7168.0, 8, cluster.device, Dtype.BF16)
    assert grouped == pytest.approx(grouped_gemm_time(300.0, 4096.0, 7168.0, 8, base.device, Dtype.BF16)
                                    * c.gemm(384.0 * 8, 4096.0, 7168.0, Dtype.BF16))
    g, g0 = comm.place_group(cluster, 8, 1), comm.place_group(base, 8, 1)
    assert comm.all_reduce(2**24, g) == pytest.approx(
        comm.all_reduce(2**24, g0) * c.collective("all_reduce", 2**24, 8, 8))
    assert c.collective("all_reduce", 2**12, 8, 8) == pytest.approx(collective_factor(2**12, 8), rel=0.15)
    assert c.attention(32.0, 1024.0, 128.0, 8.0, True, True) > c.attention(32.0, 8192.0, 128.0, 8.0,
                                                                         True, False)


def test_collectives_beyond_what_the_profile_measured_stay_analytic(profile):
    cluster = calibrate(resolve_cluster("dgx-h100"), profile)
    c = cluster.device.correction
    assert c is not None
    # the profile never crossed nodes nor had more than 8 ranks: no correction there
    assert c.collective("all_reduce", 2**24, 16, 8) == 1.0
    assert c.collective("all_reduce", 2**24, 4, 1) == 1.0
    assert c.collective("p2p", 2**20, 2, 1) == 1.0
    assert c.gemm(4096.0, 4096.0, 4096.0, Dtype.FP8) == 1.0  # no fp8 rows measured


def test_corrected_and_uncorrected_devices_never_share_memoized_costs(profile):
    base = resolve_cluster("dgx-h100")
    cluster = calibrate(base, profile)
    assert cluster.device != base.device and hash(cluster.device) != hash(base.device)
    assert calibrate(base, profile) == cluster  # fitted once per profile and machine
    assert calibrate(base, profile).device.correction.fitted is cluster.device.correction.fitted
    plan = make_plan()
    corrected = dataclasses.replace(plan, cluster=calibrate(plan.cluster, profile))
    assert evaluate(corrected).step_time_s != evaluate(plan).step_time_s


def test_the_same_profile_gives_the_same_prediction_byte_for_byte(profile_text):
    from autoplan.plans.file import plan_document

    docs = []
    for source in ("a.csv", "a.csv"):
        surrogate.clear_caches()
        prof = parse_profile(profile_text, source)
        plan = make_plan(tp=2, dp=4, micro_batch=2)
        plan = dataclasses.replace(plan, cluster=calibrate(plan.cluster, prof))
        docs.append(json.dumps(plan_document(plan, surrogate.predict_with_band(plan))))
    assert docs[0] == docs[1]
    assert '"uncertainty"' in docs[0] and '"cluster": {"name": "dgx-h100"' in docs[0]


# --------------------------------------------------------------------------- the band

def test_the_band_brackets_the_forest_prediction(profile):
    plan = make_plan(model="llama3-70b", gpus=64, dp=4, tp=8, pp=2, global_batch=256,
                     sequence_parallel=True)
    plan = dataclasses.replace(plan, cluster=calibrate(plan.cluster, profile))
    unc = band(plan)
    assert unc is not None and unc.profile == "h100-synthetic.csv"
    step = evaluate(plan).step_time_s
    assert unc.step_time_s_p10 <= unc.step_time_s_p90
    assert unc.step_time_s_p10 * 0.97 <= step <= unc.step_time_s_p90 * 1.03
    assert unc.step_time_s_p90 / unc.step_time_s_p10 < 1.3  # 2% noise: a narrow band
    assert band(make_plan()) is None


# --------------------------------------------------------------------------- shipped profiles

def test_a_shipped_profile_is_found_by_its_descriptor(tmp_path, monkeypatch, profile_text):
    (tmp_path / "measured").mkdir()
    (tmp_path / "measured" / "h100-synthetic.csv").write_text(profile_text)
    (tmp_path / "measured" / "README.md").write_text("not a profile")
    monkeypatch.setattr(resources, "profiles_dir", lambda: tmp_path)
    found = shipped_profile("h100-sxm")
    assert found is not None and found.source == "profiles/measured/h100-synthetic.csv"
    assert shipped_profile("a100-80gb") is None
    req = build_request(None, model="llama3-8b", cluster="dgx-h100", global_batch=64, seq_len=4096)
    assert req.profile is not None and req.profile.source == found.source
    assert isinstance(req.cluster.device.correction, SurrogateCorrection)
    plain = build_request(None, model="llama3-8b", cluster="dgx-a100", global_batch=64, seq_len=4096)
    assert plain.profile is None and plain.cluster.device.correction is None


def test_a_job_file_names_its_profile_relative_to_itself(tmp_path, profile_text):
    (tmp_path / "h100.csv").write_text(profile_text)
    job = tmp_path / "job.yaml"
    job.write_text("model: llama3-8b\ncluster: dgx-h100\njob: {global_batch: 64, seq_len: 4096}\n"
                   "profile: h100.csv\n")
    req = build_request(job)
    assert req.profile is not None and req.profile.source == str(tmp_path / "h100.csv")
    assert req.cluster.device.correction is not None
    job.write_text("model: llama3-8b\ncluster: dgx-h100\njob: {global_batch: 64, seq_len: 4096}\n"
                   "profile: 3\n")
    with pytest.raises(InputError, match="job.yaml: profile: expected the path of a profile CSV"):
        build_request(job)


def test_no_shipped_profile_leaves_the_cluster_alone():
    # uncorrected: the device carries its measured kernel grids (measured/door.py), no correction
    req = build_request(None, model="llama3-8b", cluster="dgx-h100", global_batch=64, seq_len=4096)
    plain = resolve_cluster("dgx-h100")
    assert req.profile is None and req.cluster.device.correction is None
    assert req.cluster == dataclasses.replace(plain, device=dataclasses.replace(
        plain.device, kernels=req.cluster.device.kernels))


# --------------------------------------------------------------------------- command line
# (in this process: tests.helpers.autoplan; the determinism check's second run in a new one)

@pytest.fixture(scope="module")
def plan_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "plan.yaml"
    path.write_text("""\
autoplan: 1
model: llama3-8b
cluster: {name: dgx-h100, nodes: 2}
job: {global_batch: 128, seq_len: 4096, dtype: bf16}
layout: {dp: 8, tp: 2, pp: 1}
micro_batch: 1
schedule: 1f1b
recompute: selective
zero: 1
sequence_parallel: true
""")
    return path


def test_evaluate_with_a_profile_shows_a_band(plan_path, profile_path):
    plain = autoplan("evaluate", plan_path)
    table = autoplan("evaluate", plan_path, "--profile", profile_path)
    assert plain.returncode == 0 and table.returncode == 0, table.stderr
    assert "p10" not in plain.stdout
    line = next(line for line in table.stdout.splitlines() if line.startswith("step time"))
    assert "p10" in line and "p90" in line and f"profile {profile_path}" in line
    runs = [run("evaluate", plan_path, "--profile", profile_path, "-f", "json")
            for run in (autoplan, autoplan_subprocess)]
    assert runs[0].stdout == runs[1].stdout  # same input, same output, across processes
    doc = json.loads(runs[0].stdout)
    pred = doc["plans"][0]["prediction"]
    unc = pred["uncertainty"]
    assert set(unc) == {"step_time_s_p10", "step_time_s_p90", "profile"}
    assert unc["step_time_s_p10"] <= unc["step_time_s_p90"] and unc["profile"] == str(profile_path)
    assert doc["plans"][0]["cluster"] == {"name": "dgx-h100", "nodes": 2}


def test_evaluate_without_a_profile_prints_what_it_printed_before(plan_path):
    # the analytic prediction, unchanged: the fields a plan file has always had, no band
    doc = json.loads(autoplan("evaluate", plan_path, "-f", "json").stdout)
    assert "uncertainty" not in doc["plans"][0]["prediction"]
    from autoplan.descriptors.strict import read_yaml
    from autoplan.plans.file import plan_document, read_plan

    plan = read_plan(read_yaml(plan_path), str(plan_path))
    assert doc["plans"][0] == json.loads(json.dumps(plan_document(plan, evaluate(plan))))


def test_search_with_a_profile_says_which_profile_it_used(profile_path):
    job = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64", "--seq-len", "4096",
           "--top", "3"]
    plain = json.loads(autoplan("search", *job, "-f", "json").stdout)
    result = autoplan("search", *job, "--profile", profile_path, "-f", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["profile"] == str(profile_path) and "profile" not in plain
    assert doc["plans"][0]["prediction"]["step_time_s"] != plain["plans"][0]["prediction"]["step_time_s"]
    table = autoplan("search", *job, "--profile", profile_path)
    assert f"profile {profile_path}" in table.stdout


def test_a_profile_of_another_device_is_noted(profile_path):
    result = autoplan("evaluate", ROOT / "examples" / "plans" / "gpt3-175b-1024xa100-sc21.yaml",
                      "--profile", profile_path, "-f", "json")
    assert result.returncode == 0
    assert f"note: {profile_path} was taken on h100-sxm; it corrects a100-80gb here" in result.stderr


def test_a_malformed_profile_is_exit_2_naming_file_and_field(tmp_path, plan_path, profile_text):
    bad = tmp_path / "bad.csv"
    bad.write_text(profile_text.replace("matmul", "matmol", 1))
    for args in (("evaluate", plan_path), ("search", "--model", "llama3-8b", "--cluster", "dgx-h100",
                                           "--global-batch", "64", "--seq-len", "4096")):
        result = autoplan(*args, "--profile", bad)
        assert result.returncode == 2
        assert f"{bad}: row 1.op: expected one of matmul" in result.stderr
        assert "Traceback" not in result.stderr
