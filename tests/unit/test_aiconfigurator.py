"""Measured profiles from NVIDIA AIConfigurator's kernel tables (``autoplan profiles import
aiconfigurator``), the shipped ones, and the door's choice among them.

The import runs on a tiny aiconfigurator-core tree written in tmp_path (parquet tables
written with pandas, as the package lays them out), never on the package itself."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autoplan import resources
from autoplan.descriptors.library import resolve_cluster
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.compute import batch_experts_time, decode_attention_time, experts_time
from autoplan.measured import aiconfigurator, surrogate
from autoplan.measured.door import corrected, profile_for
from autoplan.measured.profile import format_profile, parse_profile, read_profile
from autoplan.measured.shipped import shipped_profile, version_key
from autoplan.vocab import Dtype
from tests.helpers import autoplan

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "profiles" / "measured"
H100 = "NVIDIA H100 80GB HBM3"


# --------------------------------------------------------------------------- a fake package

def _table(path: Path, rows: list[dict[str, Any]], **common: Any) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"framework": "VLLM", "version": path.parent.name, "device": H100, **common, **r}
                  for r in rows]).to_parquet(path)


def _attention(isl: int, step: int, kv: str = "bfloat16", window: int = 0, attn: str = "bfloat16",
               latency: float = 0.05) -> dict[str, Any]:
    return {"op_name": "attention", "kernel_source": "vllm_flash_attn_fa3", "batch_size": 4, "isl": isl,
            "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "beam_width": 1, "attn_dtype": attn,
            "kv_cache_dtype": kv, "step": step, "window_size": window, "latency": latency}


def fake_package(root: Path) -> Path:
    """An aiconfigurator-core install under ``root`` (on sys.path): h100_sxm tables of vLLM
    0.19.0 and 0.24.0 (attention only at 0.19.0) and of SGLang 0.5.14 (a GEMM table), NCCL
    2.23 and 2.29.2."""
    pkg = root / "aiconfigurator_core"
    (pkg / "systems" / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the import reads files; never imports me')\n")
    (pkg / "systems" / "silicon_sample.csv").write_text("never,read\n")
    info = root / "aiconfigurator_core-0.12.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: aiconfigurator-core\nVersion: 0.12.0\n")
    data = pkg / "systems" / "data" / "h100_sxm"
    gemm = {"op_name": "gemm"}
    for version, scale in (("0.19.0", 2.0), ("0.24.0", 1.0)):
        _table(data / "gemm" / "vllm" / version / "gemm_perf.parquet", [
            {"kernel_source": "torch.nn.functional.linear", "gemm_dtype": "bfloat16", "m": 16, "n": 4096,
             "k": 4096, "latency": 0.020 * scale},
            {"kernel_source": "CutlassFP8ScaledMMLinearKernel", "gemm_dtype": "fp8", "m": 4096, "n": 4096,
             "k": 4096, "latency": 0.150 * scale},
            {"kernel_source": "DeepGemm", "gemm_dtype": "fp8_block", "m": 64, "n": 7168, "k": 2048,
             "latency": 0.030},
            {"kernel_source": "Cutlass", "gemm_dtype": "fp8_block", "m": 64, "n": 7168, "k": 2048,
             "latency": 0.050},  # the same shape by a kernel with fewer rows: left out
            {"kernel_source": "DeepGemm", "gemm_dtype": "fp8_block", "m": 128, "n": 7168, "k": 2048,
             "latency": 0.032},
            {"kernel_source": "nvfp4", "gemm_dtype": "nvfp4", "m": 8, "n": 8192, "k": 8192, "latency": 0.011},
            {"kernel_source": "x", "gemm_dtype": "int8_wo", "m": 8, "n": 8192, "k": 8192, "latency": 0.011},
        ], **gemm)
    (data / "gemm" / "vllm" / "0.24.0" / "collection_meta.yaml").write_text(
        "schema_version: 1\ntables:\n  gemm_perf:\n    collected_at: '2026-08-31'\n    status: complete\n")
    _table(data / "gemm" / "sglang" / "0.5.14" / "gemm_perf.parquet", [
        {"kernel_source": "sgl", "gemm_dtype": "bfloat16", "m": 1, "n": 1024, "k": 1024, "latency": 0.008}],
        **gemm)
    _table(data / "attention" / "vllm" / "0.19.0" / "context_attention_perf.parquet", [
        _attention(2048, 0, latency=0.4),
        _attention(2048, 0, window=128), _attention(2048, 0, kv="fp8"), _attention(2048, 0, attn="fp8"),
        _attention(2048, 512)])  # a prefix: left out
    _table(data / "attention" / "vllm" / "0.19.0" / "generation_attention_perf.parquet", [
        _attention(1, 1023, latency=0.03), _attention(1, 4095, kv="fp8", latency=0.05),
        _attention(1, 1023, window=128), _attention(1, 1023, kv="nvfp4")])
    moe = {"op_name": "moe", "num_tokens": 256, "hidden_size": 4096, "inter_size": 1536, "topk": 8,
           "num_experts": 128, "moe_tp_size": 1, "moe_ep_size": 8}
    _table(data / "moe" / "vllm" / "0.24.0" / "moe_perf.parquet", [
        {**moe, "kernel_source": "triton", "moe_dtype": "bfloat16", "distribution": "balanced",
         "latency": 0.2},
        {**moe, "kernel_source": "triton", "moe_dtype": "bfloat16", "distribution": "power_law_1.2",
         "latency": 0.3},
        {**moe, "kernel_source": "triton_nongated", "moe_dtype": "fp8", "distribution": "balanced",
         "latency": 0.1},
        {**moe, "kernel_source": "marlin", "moe_dtype": "w4a16_mxfp4", "distribution": "balanced",
         "latency": 0.1}])
    _table(data / "comm" / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet", [
        {"op_name": "all_reduce", "kernel_source": "vLLM_custom_graph", "allreduce_dtype": "bfloat16",
         "num_gpus": 8, "message_size": 65536, "latency": 0.008, "backend": "vllm_graph"},
        {"op_name": "all_reduce", "kernel_source": "vLLM_custom_eager", "allreduce_dtype": "bfloat16",
         "num_gpus": 8, "message_size": 65536, "latency": 0.024, "backend": "vllm_eager"}])
    for version, latency in (("2.23", 9.0), ("2.29.2", 2.1)):
        _table(data / "comm" / "nccl" / version / "nccl_perf.parquet", [
            {"op_name": op, "kernel_source": "NCCL", "nccl_dtype": dtype, "num_gpus": 8,
             "message_size": size, "latency": latency}
            for op in ("all_reduce", "alltoall") for dtype, size in (("half", 2**28), ("int8", 2**29))])
    return root


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("pyarrow")
    root = fake_package(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return root


def _by(profile_rows: Any, **match: Any) -> list[dict[str, Any]]:
    rows = profile_rows.to_dict("records")
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


# --------------------------------------------------------------------------- the import

def test_the_import_turns_each_table_into_profile_rows_in_seconds(package: Path, tmp_path: Path) -> None:
    out = tmp_path / "h100.csv"
    r = autoplan("profiles", "import", "aiconfigurator", "--system", "h100_sxm", "--backend", "vllm",
                 "-o", out)
    assert r.returncode == 0, r.stderr
    assert "h100_sxm/vllm/0.24.0: " in r.stderr
    prof = read_profile(out)
    rows = prof.rows
    # GEMMs: ms -> s, dtypes mapped, int8 weight-only left out, a shape's main kernel kept
    assert sorted(_by(rows, kind="gemm")[i]["dtype"] for i in range(5)) == [
        "bf16", "fp4", "fp8", "fp8_block", "fp8_block"]
    (bf16,) = _by(rows, kind="gemm", dtype="bf16")
    assert (bf16["op"], bf16["m"], bf16["n"], bf16["k"]) == ("matmul", 16, 4096, 4096)
    assert bf16["seconds"] == pytest.approx(20e-6)
    (block,) = _by(rows, kind="gemm", dtype="fp8_block", m=64)
    assert block["seconds"] == pytest.approx(30e-6)  # DeepGemm's (2 rows), not Cutlass's (1)
    # prefill attention: the plain causal rows; decode: context = isl + step, dtype the KV cache's
    (ctx,) = _by(rows, kind="attention", op="sdpa_fwd")
    assert (ctx["batch"], ctx["heads"], ctx["kv_heads"], ctx["seq"], ctx["head_dim"], ctx["causal"]) == (
        4, 32, 8, 2048, 128, 1)
    assert ctx["seconds"] == pytest.approx(0.4e-3)
    decode = {r["dtype"]: r for r in _by(rows, kind="attention", op="decode")}
    assert set(decode) == {"bf16", "fp8"}
    assert (decode["bf16"]["seq"], decode["fp8"]["seq"], decode["bf16"]["causal"]) == (1024, 4096, 0)
    # MoE: balanced, gated, known dtypes
    (moe,) = _by(rows, kind="moe")
    assert (moe["op"], moe["dtype"], moe["m"], moe["n"], moe["k"]) == ("experts", "bf16", 256, 1536, 4096)
    assert (moe["experts"], moe["top_k"], moe["moe_tp"], moe["moe_ep"]) == (128, 8, 1, 8)
    assert moe["seconds"] == pytest.approx(0.2e-3)
    # collectives: NCCL's newest version, half rows, bytes = 2 x elements; the engine's graph kernel
    nccl = {r["op"]: r for r in _by(rows, kind="collective") if r["op"] != "custom_all_reduce"}
    assert set(nccl) == {"all_reduce", "all_to_all"}
    assert nccl["all_reduce"]["nbytes"] == 2**29 and nccl["all_reduce"]["seconds"] == pytest.approx(2.1e-3)
    assert (nccl["all_reduce"]["ranks"], nccl["all_reduce"]["ranks_per_node"]) == (8, 8)
    (custom,) = _by(rows, kind="collective", op="custom_all_reduce")
    assert custom["nbytes"] == 2 * 65536 and custom["seconds"] == pytest.approx(8e-6)
    # provenance
    meta = prof.meta
    assert (prof.descriptor, prof.engine, prof.engine_version) == ("h100-sxm", "vllm", "0.24.0")
    assert meta["device_name"] == H100 and meta["license"] == "Apache-2.0 (NVIDIA AIConfigurator)"
    assert meta["source"] == "aiconfigurator-core 0.12.0 h100_sxm/vllm/0.24.0"
    assert "context_attention vllm/0.19.0" in meta["tables"]  # the newest not after 0.24.0
    assert "nccl nccl/2.29.2" in meta["tables"] and meta["date"] == "2026-08-31"
    assert meta["command"].startswith("autoplan profiles import aiconfigurator")
    assert meta["autoplan-profile"] == "2" and meta["thinned"] == "no"


def test_an_older_engine_version_is_imported_with_the_tables_of_its_time(package: Path) -> None:
    r = autoplan("profiles", "import", "aiconfigurator", "--system", "h100-sxm", "--backend", "vllm",
                 "--version", "0.19.0")
    assert r.returncode == 0, r.stderr
    prof = parse_profile(r.stdout, "<stdout>")
    assert prof.engine_version == "0.19.0"
    (bf16,) = _by(prof.rows, kind="gemm", dtype="bf16")
    assert bf16["seconds"] == pytest.approx(40e-6)  # 0.19.0's table
    assert "moe vllm/0.24.0" in prof.meta["tables"]  # none older: the oldest there is


def test_a_directory_gets_one_file_per_engine_and_one_file_refuses_several(package: Path,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = autoplan("profiles", "import", "aiconfigurator", "--system", "h100_sxm", "--thin", "-o", f"{out}/")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "h100-sxm-sglang-0.5.14-aiconfigurator.csv", "h100-sxm-vllm-0.24.0-aiconfigurator.csv"]
    assert "stratified" in read_profile(out / "h100-sxm-vllm-0.24.0-aiconfigurator.csv").meta["thinned"]
    for target in ("/dev/null", tmp_path / "one.csv", "-"):
        r = autoplan("profiles", "import", "aiconfigurator", "-o", target)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert ("--out: 2 profiles selected (h100_sxm/vllm/0.24.0, h100_sxm/sglang/0.5.14): give a "
                "directory") in r.stderr
    r = autoplan("profiles", "import", "aiconfigurator", "--backend", "sglang", "-o", "/dev/null")
    assert r.returncode == 0 and r.stdout == ""  # a character device is written through
    assert not (tmp_path / "one.csv").exists()


@pytest.mark.parametrize(("args", "line"), [
    (("--system", "h100"), "--system: expected one of h100_sxm (or their autoplan devices h100-sxm), "
                           "got 'h100'"),
    (("--backend", "tensorrt"), "--backend: expected one of vllm, sglang, trtllm, got 'tensorrt'"),
    (("--backend", "vllm", "--version", "0.20.0"),
     "--version: h100_sxm has vllm GEMM tables of versions 0.19.0, 0.24.0, got '0.20.0'"),
    (("--version", "0.24.0"), "--version: names one engine's version: give --backend too"),
    (("--system", "h100_sxm", "--backend", "trtllm"), "--backend: h100_sxm has no trtllm GEMM table"),
])
def test_a_bad_choice_is_exit_2_naming_the_choices(package: Path, args: tuple[str, ...], line: str) -> None:
    r = autoplan("profiles", "import", "aiconfigurator", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"autoplan: error: {line}"


def test_without_the_package_the_import_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiconfigurator, "PACKAGE", "aiconfigurator_core_not_installed_here")
    r = autoplan("profiles", "import", "aiconfigurator", "--system", "h100_sxm")
    assert r.returncode == 2
    assert r.stderr.strip() == ("autoplan: error: aiconfigurator: aiconfigurator-core is not installed: "
                                "pip install 'autoplan[aiconfigurator]'")
    r = autoplan("profiles", "import", "nvidia")
    assert r.returncode == 2 and "SOURCE: expected one of aiconfigurator, got 'nvidia'" in r.stderr


def test_thinning_keeps_every_dtype_and_spreads_over_log_shapes() -> None:
    import pandas as pd

    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"m": 2 ** rng.integers(0, 15, 4000), "n": 2 ** rng.integers(7, 16, 4000),
                          "k": 2 ** rng.integers(7, 16, 4000), "dtype": rng.choice(["bf16", "fp8"], 4000)})
    kept = aiconfigurator._thinned(frame, ["m", "n", "k"], 100)
    assert kept.groupby("dtype").size().to_dict() == {"bf16": 100, "fp8": 100}
    logs = np.log2(kept["m"])
    assert logs.min() <= 1 and logs.max() >= 13  # small and large shapes keep their share
    assert aiconfigurator._thinned(frame, ["m", "n", "k"], 100).equals(kept)  # the same every time


def test_engine_versions_sort_as_their_releases() -> None:
    ordered = ["0.5.6.post2", "0.5.9", "0.5.14", "1.2.0rc5", "1.3.0rc10", "1.3.0rc20", "1.3.0", "1.3.0.post1"]
    assert sorted(reversed(ordered), key=version_key) == ordered


# --------------------------------------------------------------------------- the door

def _profile_text(**meta: str) -> str:
    head = {"device_kind": "cuda", "device_name": "x", "date": "2026-01-01", "command": "test",
            "descriptor": "h100-sxm", **meta}
    if "engine" not in meta:
        head["torch"] = "2.13.0"
    else:
        head["source"] = "test"
    rows = [{"kind": "gemm", "op": "matmul", "dtype": "bf16", "m": 2**i, "n": 4096, "k": 4096,
             "seconds": 1e-5 * 2**i, "seconds_p10": 1e-5 * 2**i, "seconds_p90": 1e-5 * 2**i}
            for i in range(8)]
    return format_profile(head, rows)


@pytest.fixture
def shelf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profiles/measured/ of one engine-less profile and three engine ones for h100-sxm."""
    folder = tmp_path / "measured"
    folder.mkdir()
    (folder / "bench.csv").write_text(_profile_text())
    for engine, version in (("vllm", "0.19.0"), ("vllm", "0.24.0"), ("sglang", "0.5.14")):
        (folder / f"{engine}-{version}.csv").write_text(
            _profile_text(engine=engine, engine_version=version))
    monkeypatch.setattr(resources, "profiles_dir", lambda: tmp_path)
    return folder


@pytest.mark.parametrize(("engine", "version", "expected"), [
    (None, None, "bench.csv"),  # training: engine-less only
    ("vllm", None, "vllm-0.24.0.csv"),  # the engine's newest
    ("vllm", "0.20.0", "vllm-0.19.0.csv"),  # the newest not after the plan's
    ("vllm", "0.24.0", "vllm-0.24.0.csv"),
    ("vllm", "0.9.0", "vllm-0.24.0.csv"),  # none not after: the newest of its major version
    ("vllm", "nightly-5b8c30d", "vllm-0.24.0.csv"),  # a nightly build: the newest
    ("sglang", "0.5.9", "sglang-0.5.14.csv"),

    ("trtllm", "1.3.0", "bench.csv"),  # no profile of the engine: the engine-less one
    ("sglang", "1.0.0", "sglang-0.5.14.csv"),  # a later major version: the newest not after
])
def test_the_door_picks_the_engine_and_version_profile(shelf: Path, engine: str | None, version: str | None,
                                                       expected: str) -> None:
    found = shipped_profile("h100-sxm", engine, version)
    assert found is not None and found.source == f"profiles/measured/{expected}"
    assert profile_for(resolve_cluster("dgx-h100"), None, engine, version) == found
    given = parse_profile(_profile_text(), "given.csv")
    assert profile_for(resolve_cluster("dgx-h100"), given, engine, version) is given


def test_an_engine_release_of_an_older_major_version_takes_no_later_tables(shelf: Path) -> None:
    # TensorRT-LLM 0.17 is priced without 1.3's kernel tables (other kernels): the engine-less
    # profile, as before engine profiles existed
    (shelf / "trtllm-1.3.0rc20.csv").write_text(_profile_text(engine="trtllm", engine_version="1.3.0rc20"))
    found = shipped_profile("h100-sxm", "trtllm", "0.17")
    assert found is not None and found.source == "profiles/measured/bench.csv"
    assert shipped_profile("h100-sxm", "trtllm", "1.2.0rc6").source.endswith("trtllm-1.3.0rc20.csv")


def test_serving_resolves_its_cluster_with_the_plans_engine() -> None:
    from autoplan.serving.engine import Engine

    for engine in (Engine.VLLM, Engine.SGLANG, Engine.TRTLLM):
        door = corrected(resolve_cluster("dgx-h100"), engine=engine)
        assert door.profile is not None and door.profile.engine == engine.value
        assert door.profile.descriptor == "h100-sxm" and door.note is None
    assert corrected(resolve_cluster("dgx-h100")).profile is None  # training: as before


def test_a_training_search_on_dgx_h100_is_unchanged_by_the_engine_profiles(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch
                                                                           ) -> None:
    job = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64", "--seq-len", "4096",
           "--top", "3", "-f", "json"]
    with_them = autoplan("search", *job)
    assert with_them.returncode == 0, with_them.stderr
    bare = tmp_path / "profiles"
    shutil.copytree(ROOT / "profiles", bare, ignore=shutil.ignore_patterns("*-aiconfigurator.csv"))
    monkeypatch.setattr(resources, "profiles_dir", lambda: bare)
    without = autoplan("search", *job)
    assert json.loads(with_them.stdout) == json.loads(without.stdout)
    assert "profile" not in json.loads(with_them.stdout)


# --------------------------------------------------------------------------- shipped profiles

SHIPPED = sorted(MEASURED.glob("*-aiconfigurator.csv"))


def test_profiles_ship_for_every_current_gpu_and_engine() -> None:
    from autoplan.measured.profile import profile_header

    headers = [profile_header(p.read_text().splitlines()) for p in SHIPPED]
    found = {(h["descriptor"], h["engine"]) for h in headers}
    assert found == {(d, e) for d in ("h100-sxm", "h200", "b200", "b300", "gb200", "gb300")
                     for e in ("vllm", "sglang", "trtllm")}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_engine_profile_is_thin_and_says_where_it_came_from(path: Path) -> None:
    prof = read_profile(path)
    assert len(prof.rows) <= 1700
    assert prof.meta["license"] == "Apache-2.0 (NVIDIA AIConfigurator)"
    assert prof.meta["source"].startswith("aiconfigurator-core 0.12.0 ")
    assert "stratified" in prof.meta["thinned"]
    kinds = set(zip(prof.rows["kind"], prof.rows["op"], strict=True))
    assert {("gemm", "matmul"), ("attention", "sdpa_fwd"), ("attention", "decode"), ("moe", "experts"),
            ("collective", "all_reduce"), ("collective", "custom_all_reduce")} <= kinds


@pytest.fixture(scope="module")
def slice_h100() -> Any:
    """A slice of the shipped H100 vLLM profile: its bf16 and fp8 GEMMs and its decode rows."""
    prof = read_profile(MEASURED / "h100-sxm-vllm-0.24.0-aiconfigurator.csv")
    rows = prof.rows
    keep = ((rows["kind"] == "gemm") & rows["dtype"].isin(["bf16", "fp8"])) | (rows["op"] == "decode")
    meta = {k: v for k, v in prof.meta.items() if k != "applies"}  # every kind of the slice applies
    return parse_profile(format_profile(meta, rows[keep].to_dict("records")), "slice.csv")


def test_the_surrogate_interpolates_held_out_shapes_better_than_the_formula(slice_h100: Any) -> None:
    report = {r.kind: r for r in surrogate.fit_report(slice_h100, resolve_cluster("dgx-h100"))}
    assert set(report) == {"gemm", "decode"}
    for kind in ("gemm", "decode"):
        row = report[kind]
        assert row.surrogate_mape is not None and row.surrogate_mape < 0.6 * row.analytic_mape, row


# --------------------------------------------------------------------------- the kernels' new functions

def test_decode_attention_is_the_serving_models_kv_read() -> None:
    """The KV read serving's iteration prices (StepModel._attention, one query per sequence)
    is decode_attention_time's, per layer, on an uncorrected device."""
    from autoplan.descriptors.library import resolve_model
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import Deployment, Precision
    from autoplan.serving.engine import Engine

    model, cluster = resolve_model("llama3-8b"), resolve_cluster("dgx-h100")
    d = Deployment(replicas=1, tp=2, weights=Precision.BF16, kv_cache=Precision.FP8)
    step = StepModel(model, cluster, d, Engine.VLLM)
    batch, context = 32, 2000.0
    _, kv_read = step._attention(batch, batch * context, 0.0, 0.0)
    per_layer = decode_attention_time(batch, context, model.heads / 2, model.kv_heads / 2, model.kv_channels,
                                      1.0, cluster.device)
    assert kv_read == pytest.approx(step._kscale * model.layers * per_layer, rel=1e-12)


def test_serving_prices_its_kv_read_with_the_measured_decode_kernel(slice_h100: Any) -> None:
    """With a profile's decode rows, the iteration's KV read is decode_attention_time on the
    corrected device (at a context on the eighth-octave grid the lookup rounds to), and the
    closed form of a decode run takes the same ratio."""
    from autoplan.descriptors.library import resolve_model
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import Deployment, Precision
    from autoplan.serving.engine import Engine

    model = resolve_model("llama3-8b")
    cluster = surrogate.calibrate(resolve_cluster("dgx-h100"), slice_h100)
    d = Deployment(replicas=1, tp=2, weights=Precision.BF16, kv_cache=Precision.BF16)
    step = StepModel(model, cluster, d, Engine.VLLM)
    batch, context = 32, 2048.0
    ratio = step.decode_ratio(batch, batch * context)
    assert ratio != pytest.approx(1.0, abs=0.02)
    _, kv_read = step._attention(batch, batch * context, 0.0, 0.0)
    per_layer = decode_attention_time(batch, context, model.heads / 2, model.kv_heads / 2, model.kv_channels,
                                      2.0, cluster.device)
    assert kv_read == pytest.approx(step._kscale * model.layers * per_layer, rel=1e-9)
    a, c = step.decode_coefficients(batch, batch * context)
    a0, c0 = step.decode_coefficients(batch)  # no context given: the analytic slope
    assert (a, c / c0) == (a0, pytest.approx(ratio, rel=1e-12))


def test_a_measured_decode_and_moe_correct_their_kernels_and_fall_back_where_unmeasured(
        slice_h100: Any) -> None:
    from autoplan.descriptors.library import resolve_model

    base = resolve_cluster("dgx-h100")
    cluster = surrogate.calibrate(base, slice_h100)
    c = cluster.device.correction
    assert c is not None
    args = (64.0, 4096.0, 32.0, 8.0, 128.0, 2.0)
    ratio = c.decode(*args)
    assert ratio is not None and ratio != pytest.approx(1.0, abs=0.05)
    assert decode_attention_time(*args, cluster.device) == pytest.approx(
        decode_attention_time(*args, base.device) * ratio)
    assert c.decode(64.0, 4096.0, 32.0, 8.0, 128.0, 0.5) is None  # no fp4 KV cache measured
    # no MoE rows in the slice: the experts keep today's GEMM ratio
    model = resolve_model("mixtral-8x7b")
    assert c.moe(512.0, model.hidden, model.expert_width, model.top_k, model.experts, 1, 8,
                 Dtype.BF16) is None
    got = batch_experts_time(model, 512.0, 8, 1, cluster.device, Dtype.BF16, 2.0)
    rows = 512.0 * model.top_k / model.experts  # per expert: the copies spread over every expert
    assert got == pytest.approx(batch_experts_time(model, 512.0, 8, 1, base.device, Dtype.BF16, 2.0)
                                * c.gemm(max(1.0, rows * model.experts / 8), model.expert_width, model.hidden,
                                         Dtype.BF16))


def test_a_measured_moe_kernel_replaces_the_gemm_ratio() -> None:
    shipped = read_profile(MEASURED / "h100-sxm-trtllm-1.3.0rc20-aiconfigurator.csv")
    # every kind applied (the shipped file's ``applies`` line keeps its MoE rows out)
    meta = {k: v for k, v in shipped.meta.items() if k != "applies"}
    prof = parse_profile(format_profile(meta, shipped.rows.to_dict("records")), "all-kinds.csv")
    base = resolve_cluster("dgx-h100")
    cluster = surrogate.calibrate(base, prof)
    c = cluster.device.correction
    assert c is not None
    shape = (2048.0, 4096.0, 1536.0, 8, 128, 1, 8)
    ratio = c.moe(*shape, Dtype.BF16)
    assert ratio is not None
    tokens, hidden, inter, top_k, experts, tp, ep = shape
    analytic = experts_time(tokens, hidden, inter, top_k, experts, ep, tp, base.device, Dtype.BF16, 2.0)
    assert experts_time(tokens, hidden, inter, top_k, experts, ep, tp, cluster.device, Dtype.BF16,
                        2.0) == pytest.approx(analytic * ratio)


def test_a_shipped_engine_profile_applies_its_prefill_attention_and_collectives_only() -> None:
    # (surrogate.ENGINE_APPLIED_KINDS: its GEMM, MoE and decode rows, applied to NVIDIA's
    # end-to-end runs, made TPOT worse); a header without the line applies every kind
    prof = read_profile(MEASURED / "h100-sxm-vllm-0.24.0-aiconfigurator.csv")
    assert prof.meta["applies"] == "attention, collective"
    c = surrogate.calibrate(resolve_cluster("dgx-h100"), prof).device.correction
    assert c is not None
    assert c.gemm(4096.0, 4096.0, 4096.0, Dtype.BF16) == 1.0
    assert c.decode(32.0, 2048.0, 32.0, 8.0, 128.0, 2.0) is None
    assert c.moe(2048.0, 4096.0, 1536.0, 8, 128, 1, 8, Dtype.BF16) is None
    assert c.attention(32.0, 4096.0, 128.0, 4.0, True, False) != 1.0
    bad = "\n".join(l if not l.startswith("# applies:") else "# applies: gemm, softmax"
                     for l in (MEASURED / "h100-sxm-vllm-0.24.0-aiconfigurator.csv").read_text().splitlines())
    with pytest.raises(InputError, match="header.applies"):
        parse_profile(bad, "bad.csv")


def test_the_engines_all_reduce_is_its_one_shot_kernel_corrected_by_its_rows() -> None:
    from autoplan.serving.cost import all_reduce_seconds

    base = resolve_cluster("dgx-h100")
    g = comm.place_group(base, 8, 1)
    one_shot = g.intra.latency_s + 2**16 * 7 / g.intra.effective_Bps
    assert comm.custom_all_reduce(2**16, g) == one_shot
    assert all_reduce_seconds(2**16, g) == min(comm.all_reduce(2**16, g), one_shot)  # as serving had it
    assert all_reduce_seconds(2**22, g) == comm.all_reduce(2**22, g)  # past one-shot's sizes: NCCL
    prof = read_profile(MEASURED / "h100-sxm-vllm-0.24.0-aiconfigurator.csv")
    cluster = surrogate.calibrate(base, prof)
    c = cluster.device.correction
    assert c is not None
    gc = comm.place_group(cluster, 8, 1)
    ratio = c.collective("custom_all_reduce", 2**16, 8, 8)
    assert ratio != 1.0 and comm.custom_all_reduce(2**16, gc) == pytest.approx(one_shot * ratio)
    # vLLM's graph-mode kernel on 8 H100s: 8 us at 128 KiB (the profile's own row, within the forest)
    assert comm.custom_all_reduce(2**17, gc) == pytest.approx(8e-6, rel=0.3)
    assert c.collective("custom_all_reduce", 2**16, 16, 8) == 1.0  # more ranks than measured


def test_a_decode_lookup_is_cached_at_an_eighth_of_an_octave(slice_h100: Any) -> None:
    c = surrogate.calibrate(resolve_cluster("dgx-h100"), slice_h100).device.correction
    assert isinstance(c, surrogate.SurrogateCorrection)
    before = len(c.fitted.optional)
    values = {c.decode(8.0, 3000.0 + i, 32.0, 8.0, 128.0, 2.0) for i in range(40)}
    assert len(c.fitted.optional) - before <= 2 and len(values) <= 2  # 3000-3039: one or two steps


def test_a_version_1_profile_reads_and_bench_still_writes_version_1() -> None:
    text = (MEASURED / "h200-2026-11-26.csv").read_text()
    prof = parse_profile(text, "h200.csv")
    assert prof.meta["autoplan-profile"] == "1" and (prof.rows[["experts", "top_k"]] == 0).all().all()
    again = format_profile({k: v for k, v in prof.meta.items() if k != "autoplan-profile"},
                           prof.rows.to_dict("records"))
    assert again.startswith("# autoplan-profile: 1\n")
    assert "experts" not in again.splitlines()[len(prof.meta)]  # the version 1 columns
    v2 = format_profile({**prof.meta, "source": "x"}, [*prof.rows.to_dict("records"), {
        "kind": "attention", "op": "decode", "dtype": "fp8", "batch": 1, "heads": 8, "kv_heads": 8, "seq": 64,
        "head_dim": 128, "seconds": 1e-5, "seconds_p10": 1e-5, "seconds_p90": 1e-5}])
    assert parse_profile(v2, "v2.csv").meta["autoplan-profile"] == "2"


def test_fit_report_of_an_engine_profile_defaults_to_its_devices_node() -> None:
    prof = read_profile(MEASURED / "h100-sxm-sglang-0.5.14-aiconfigurator.csv")
    base = surrogate.builtin_baseline(prof)
    assert base is not None and base.name == "dgx-h100"
    assert surrogate.builtin_baseline(read_profile(MEASURED / "h200-2026-11-26.csv")) is None
    assert dataclasses.replace(base, nodes=1) == resolve_cluster("dgx-h100")


def test_an_engine_profile_looks_token_counts_up_a_sixteenth_of_an_octave_apart(slice_h100: Any) -> None:
    """A serving simulation asks for every token count; an engine profile's GEMMs are looked
    up at 4% steps above 64 rows (exact below: decode batches), a bench profile's exactly."""
    c = surrogate.calibrate(resolve_cluster("dgx-h100"), slice_h100).device.correction
    assert isinstance(c, surrogate.SurrogateCorrection)
    assert c.gemm(1100.0, 4096.0, 4096.0, Dtype.BF16) == c.gemm(1110.0, 4096.0, 4096.0, Dtype.BF16)
    assert ("gemm", 2 ** (162 / 16), 4096.0, 4096.0, Dtype.BF16) in c.fitted.cache
    assert ("gemm", 1110.0, 4096.0, 4096.0, Dtype.BF16) not in c.fitted.cache
    c.gemm(33.0, 4096.0, 4096.0, Dtype.BF16)
    assert ("gemm", 33.0, 4096.0, 4096.0, Dtype.BF16) in c.fitted.cache
    bench = surrogate.calibrate(resolve_cluster("dgx-h200"), read_profile(MEASURED / "h200-2026-11-26.csv"))
    cb = bench.device.correction
    assert isinstance(cb, surrogate.SurrogateCorrection)
    cb.gemm(1010.0, 4096.0, 4096.0, Dtype.BF16)
    assert ("gemm", 1010.0, 4096.0, 4096.0, Dtype.BF16) in cb.fitted.cache


def test_bench_fit_prices_an_engine_profile_on_its_devices_node() -> None:
    r = autoplan("bench", "--profile", MEASURED / "h100-sxm-sglang-0.5.14-aiconfigurator.csv", "--fit")
    assert r.returncode == 0, r.stderr
    assert "the cost model's formula on dgx-h100" in r.stdout
    for kind in ("gemm", "attention", "collective", "decode", "moe"):
        assert any(line.startswith(f"│ {kind} ") for line in r.stdout.splitlines()), kind
    assert "attention rows are in a precision" not in r.stdout  # decode rows are counted as decode


def test_bench_fit_of_an_engine_profile_without_a_built_in_device_asks_for_a_cluster(tmp_path: Path) -> None:
    text = (MEASURED / "h100-sxm-sglang-0.5.14-aiconfigurator.csv").read_text()
    path = tmp_path / "x.csv"
    path.write_text(text.replace("# descriptor: h100-sxm", "# descriptor: h900"))
    r = autoplan("bench", "--profile", path, "--fit")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"autoplan: error: {path}: header.descriptor: no built-in cluster of h900 to price an engine "
        "profile's rows on: give a cluster (bench --fit --cluster NAME)")


def test_an_experts_rows_are_its_share_of_every_routed_copy_whatever_the_expert_parallelism() -> None:
    # DeepSeek-V3's experts (256, top-8, 7168 x 2048) over 16384 tokens: 512 rows an expert,
    # compute-bound. A rank of ep 8 computes its 32 experts' rows, an eighth of ep 1's work at
    # the same tiles an expert (before: rows counted as tokens x top_k / local experts, ep
    # times too many, which tiled ep 8's experts as 8x the rows: 10x, not 8x)
    from autoplan.kernels.compute import experts_time

    dev = resolve_cluster("dgx-b200").device
    ep8 = experts_time(16384.0, 7168, 2048, 8, 256, 8, 1, dev, Dtype.FP8, 1.0)
    ep1 = experts_time(16384.0, 7168, 2048, 8, 256, 1, 1, dev, Dtype.FP8, 1.0)
    assert ep1 == pytest.approx(8 * ep8, rel=0.02)
