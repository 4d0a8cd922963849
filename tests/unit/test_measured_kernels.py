"""Training's measured kernel grids (autoplan/measured/kernels.py): the lookup, the GEMMs and
collectives training prices with them, the door that attaches them, and the import that
writes them (on a tiny aiconfigurator-core tree written in tmp_path, never the package)."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.commands.request import build_request
from autoplan.descriptors.library import resolve_cluster, resolve_device, resolve_model
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.compute import (
    backward_gemm_times,
    curve_gemm_time,
    gemm_time,
    layer_times,
    measured_gemm_time,
)
from autoplan.kernels.layer import Gemm
from autoplan.measured import aiconfigurator
from autoplan.measured.door import corrected, with_kernels
from autoplan.measured.kernels import (
    KernelTables,
    kernels_dir,
    parse_comm_grid,
    parse_gemm_grid,
    shipped_kernels,
)
from autoplan.vocab import Dtype

H100 = "h100-sxm"


def h100() -> tuple[KernelTables, object]:
    tables = shipped_kernels(H100, every=True)
    assert tables is not None
    return tables, dataclasses.replace(resolve_device(H100, "test", "device"), kernels=tables)


def cell(path_glob: str, dtype: str, m: int, n: int, k: int) -> float:
    """The microseconds a shipped grid file holds for one shape (read as text, not parsed)."""
    path = next(kernels_dir().glob(path_glob))
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    ks = [int(c.removeprefix("k=")) for c in lines[0].split(",")[3:]]
    row = next(ln.split(",") for ln in lines[1:] if ln.startswith(f"{dtype},{m},{n},"))
    return float(row[3 + ks.index(k)])


# --------------------------------------------------------------------------- GEMM lookup

def test_the_grid_returns_the_tables_value_exactly_at_a_grid_point():
    tables, _ = h100()
    for dtype, shape in ((Dtype.BF16, (4096, 8192, 8192)), (Dtype.FP8, (1024, 3584, 16384)),
                         (Dtype.BF16, (32768, 65536, 64))):
        found = tables.gemm(*shape, dtype)
        assert found is not None and found[1] == shape
        assert found[0] == pytest.approx(cell("h100-sxm-gemm-*.csv", dtype.value, *shape) * 1e-6, rel=1e-12)


def test_a_hand_checked_row_of_the_parquet_is_the_gemm_time_training_takes():
    # aiconfigurator-core 0.12.0, h100_sxm/gemm/<engine>/<version>/gemm_perf.parquet, the rows
    # bfloat16 m=4096 n=8192 k=8192: trtllm/1.3.0rc20 0.6727680365 ms, vllm/0.24.0 0.6977 ms,
    # sglang/0.5.14 0.6829 ms; the grid holds their median, 0.6829 ms (805 TFLOPS; the curve
    # said 0.717 ms). (The GEMM grids ship with ``applies: no``: attached here as by a user
    # who sets it to yes.)
    cluster = with_kernels(resolve_cluster("dgx-h100"), every=True)
    assert gemm_time(4096, 8192, 8192, cluster.device, Dtype.BF16) == pytest.approx(682.9e-6, rel=1e-4)
    assert curve_gemm_time(4096, 8192, 8192, cluster.device, Dtype.BF16) == pytest.approx(716.55e-6, rel=1e-3)


def test_fp16_gemms_read_the_bf16_table():
    tables, _ = h100()
    assert tables.gemm(4096, 4096, 4096, Dtype.FP16) == tables.gemm(4096, 4096, 4096, Dtype.BF16)


SHAPES = st.tuples(st.floats(64, 32768), st.floats(64, 65536), st.floats(64, 65536))


@settings(max_examples=60, deadline=None)
@given(SHAPES)
def test_a_shape_inside_the_grid_takes_a_time_between_its_corners(shape):
    tables, _ = h100()
    grid = tables.gemm_grid
    assert grid is not None
    table = grid.tables["bf16"]

    def around(axis, x):
        lo = max(v for v in axis if v <= x)
        return lo, min(v for v in axis if v >= x)

    corners = [table.seconds(a, b, c) for a in around(table.m, shape[0]) for b in around(table.n, shape[1])
               for c in around(table.k, shape[2])]
    found = tables.gemm(*shape, Dtype.BF16)
    assert found is not None and found[1] == shape
    assert min(corners) * (1 - 1e-12) <= found[0] <= max(corners) * (1 + 1e-12)


def test_between_two_grid_points_the_time_lies_between_them():
    tables, _ = h100()
    lo, hi = tables.gemm(4096, 8192, 8192, Dtype.BF16), tables.gemm(4352, 8192, 8192, Dtype.BF16)
    mid = tables.gemm(4200, 8192, 8192, Dtype.BF16)
    assert lo is not None and hi is not None and mid is not None
    assert min(lo[0], hi[0]) < mid[0] < max(lo[0], hi[0])


GRID = """\
# autoplan-kernels: 1
# kind: gemm
# descriptor: test
dtype,m,n,k=1024,k=4096
bf16,1024,1024,{a},{b}
bf16,1024,4096,{b},{c}
bf16,4096,1024,{b},{c}
bf16,4096,4096,{c},{d}
"""


def test_a_gemm_at_a_constant_rate_is_interpolated_exactly():
    # time ~ m n k (1 us at 1024^3): log-space multilinear interpolation reproduces it anywhere
    a = 1.0
    grid = parse_gemm_grid(GRID.format(a=a, b=4 * a, c=16 * a, d=64 * a), "t.csv")
    for m, n, k in ((2000, 1500, 3000), (1024, 4096, 2048), (3333, 1111, 1024)):
        found = grid.gemm(m, n, k, Dtype.BF16)
        assert found is not None
        assert found[0] == pytest.approx(1e-6 * m * n * k / 1024 ** 3, rel=1e-12)


def test_outside_the_grid_the_curve_takes_over_from_its_edge():
    tables, device = h100()
    # m past the grid's 32768: the time at 32768 times the curve's ratio
    edge = tables.gemm(32768, 8192, 8192, Dtype.BF16)
    assert edge is not None
    beyond = measured_gemm_time(65536, 8192, 8192, device, Dtype.BF16)
    ratio = (curve_gemm_time(65536, 8192, 8192, device, Dtype.BF16)
             / curve_gemm_time(32768, 8192, 8192, device, Dtype.BF16))
    assert beyond == pytest.approx(edge[0] * ratio, rel=1e-12) and 1.9 < ratio < 2.1
    # a vocabulary past the grid's n = 65536 (Llama 3's 128,256)
    assert measured_gemm_time(8192, 128256, 8192, device, Dtype.BF16) == pytest.approx(
        tables.gemm(8192, 65536, 8192, Dtype.BF16)[0] * 128256 / 65536, rel=0.03)


def test_the_fp8_table_loses_its_own_input_quantization():
    tables, device = h100()
    raw = tables.gemm(4096, 8192, 8192, Dtype.FP8)
    assert raw is not None
    quantize = 3 * 4096 * 8192 / (device.hbm_Bps * device.hbm_efficiency)
    assert measured_gemm_time(4096, 8192, 8192, device, Dtype.FP8) == pytest.approx(raw[0] - quantize)


# independent: MAMF, the best bf16 / fp8 matmul of a shape sweep (stas00/ml-engineering
# compute/accelerator/README.md, the v2 table, as the device files cite it): H100 794.5 and
# 1402.6 TFLOPS, A100 271.2, B200 1745
@pytest.mark.parametrize("device_name,dtype,mamf", [
    ("h100-sxm", Dtype.BF16, 794.5), ("h100-sxm", Dtype.FP8, 1402.6), ("a100-80gb", Dtype.BF16, 271.2),
    ("b200", Dtype.BF16, 1745.0)])
def test_the_grids_best_large_gemm_rate_is_within_ten_percent_of_mamf(device_name, dtype, mamf):
    tables = shipped_kernels(device_name, every=True)
    assert tables is not None and tables.gemm_grid is not None
    device = dataclasses.replace(resolve_device(device_name, "test", "device"), kernels=tables)
    table = tables.gemm_grid.tables[dtype.value]
    big = [v for v in table.m if 1024 <= v <= 16384]
    best = max(2 * m * n * k / measured_gemm_time(m, n, k, device, dtype) / 1e12
               for m in big for n in table.n for k in table.k if 1024 <= min(n, k) and max(n, k) <= 16384)
    assert abs(best / mamf - 1) < 0.10


# --------------------------------------------------------------------------- training's use

def test_the_backward_gemms_are_looked_up_at_their_transposed_shapes():
    tables, device = h100()
    g = Gemm(4096, 1024, 8192)
    dgrad, wgrad = backward_gemm_times([g], device, Dtype.BF16, 0.0)
    assert dgrad == tables.gemm(4096, 8192, 1024, Dtype.BF16)[0]  # (m, k, n)
    assert wgrad == tables.gemm(8192, 1024, 4096, Dtype.BF16)[0]  # (k, n, m)
    assert dgrad != gemm_time(4096, 1024, 8192, device, Dtype.BF16)  # not the forward's time
    # on the curve both take the forward's time, as before
    plain = resolve_device(H100, "test", "device")
    assert backward_gemm_times([g], plain, Dtype.BF16, 1.5) == (1.5, 1.5)


def test_a_layers_backward_passes_sum_their_transposed_gemms():
    from autoplan.kernels.layer import Shard, layer_gemms

    _, device = h100()
    model = resolve_model("llama3-70b")
    shard = Shard(micro_batch=1, seq_len=8192, tp=8, cp=1, sequence_parallel=True, dtype=Dtype.BF16,
                  kernel_efficiency=0.8)
    measured, plain = layer_times(model, shard, device), layer_times(
        model, shard, resolve_device(H100, "test", "device"))
    gemms = layer_gemms(model, shard.tokens, shard.tp)
    wgrad = sum(gemm_time(g.k, g.n, g.m, device, Dtype.BF16) for g in gemms) / shard.kernel_efficiency
    assert measured.backward_weight == pytest.approx(wgrad, rel=1e-12)
    assert plain.backward_weight != measured.backward_weight


# --------------------------------------------------------------------------- collectives

def test_an_nccl_lookup_at_a_grid_point_is_the_tables_value():
    tables, _ = h100()
    path = next(kernels_dir().glob("h100-sxm-nccl-*.csv"))
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith("#")]
    sizes = [int(c.removeprefix("bytes=")) for c in lines[0].split(",")[2:]]
    row = next(ln.split(",") for ln in lines[1:] if ln.startswith("all_reduce,8,"))
    at = sizes.index(2 ** 28)
    assert tables.collective("all_reduce", 2 ** 28, 8) == pytest.approx(float(row[2 + at]) * 1e-6, rel=1e-12)
    assert tables.collective("all_reduce", 2 ** 28, 3) is None  # no 3-GPU row


# independent: nccl-tests all_reduce_perf busbw at large sizes, 8 x H100 SXM5 NVLink 460-480
# GB/s, 8 x A100 SXM4 230-250 GB/s (docs.alayanew.com, 'NCCL-tests in practice', 2026-05-06,
# reference numbers); busbw = 2 (n - 1) / n x bytes / time
@pytest.mark.parametrize("device_name,low,high", [("h100-sxm", 460, 480), ("a100-80gb", 230, 250)])
def test_the_measured_all_reduce_reaches_the_published_nccl_tests_bus_bandwidth(device_name, low, high):
    tables = corrected(resolve_cluster({"h100-sxm": "dgx-h100", "a100-80gb": "dgx-a100"}[device_name])
                       ).cluster.device.kernels
    assert tables is not None
    nbytes = 2 ** 29
    busbw = 2 * 7 / 8 * nbytes / tables.collective("all_reduce", nbytes, 8) / 1e9
    assert low * 0.9 < busbw < high * 1.1


def test_groups_in_one_node_take_nccls_time_and_groups_across_nodes_stay_analytic():
    cluster = corrected(resolve_cluster({"name": "dgx-h100", "nodes": 2})).cluster
    tables = cluster.device.kernels  # the NCCL grid applies
    assert tables is not None
    inside, across = comm.place_group(cluster, 8, 1), comm.place_group(cluster, 16, 1)
    assert comm.all_gather(1e8, inside) == tables.collective("all_gather", 1e8, 8)
    assert comm.reduce_scatter(1e8, inside) == tables.collective("reduce_scatter", 1e8, 8)
    assert comm.all_to_all(1e8, inside) == tables.collective("all_to_all", 1e8, 8)
    plain = resolve_cluster({"name": "dgx-h100", "nodes": 2})
    assert comm.all_reduce(1e8, across) == comm.all_reduce(1e8, comm.place_group(plain, 16, 1))
    # past the largest size: the largest's bus bandwidth
    top = tables.collective("all_reduce", 2 ** 29, 8)
    assert tables.collective("all_reduce", 2 ** 30, 8) == pytest.approx(2 * top)


# --------------------------------------------------------------------------- the door

def test_the_door_attaches_the_grids_that_apply_for_training_but_not_for_serving():
    base = resolve_cluster("dgx-h100")
    training = corrected(base).cluster
    tables = training.device.kernels
    assert tables == shipped_kernels(H100) and training.device.correction is None
    # the NCCL grid applies, the GEMM grid ships with ``applies: no``
    assert isinstance(tables, KernelTables) and tables.comm_grid is not None and tables.gemm_grid is None
    assert gemm_time(4096, 8192, 8192, training.device, Dtype.BF16) == curve_gemm_time(
        4096, 8192, 8192, base.device, Dtype.BF16)
    serving = corrected(base, engine="vllm").cluster
    assert serving.device.kernels is None and serving.device.correction is not None
    req = build_request(None, model="llama3-8b", cluster="dgx-h100", global_batch=64, seq_len=4096)
    assert req.cluster.device.kernels == tables and req.profile is None


def test_a_grids_applies_line_decides_whether_the_door_attaches_it(tmp_path, monkeypatch):
    import shutil

    import autoplan.measured.kernels as kernels

    shipped = shipped_kernels(H100, every=True)
    for path in kernels_dir().glob("h100-sxm-*.csv"):
        text = path.read_text().replace("# applies: no", "# applies: yes")
        (tmp_path / path.name).write_text(text)
    shutil.copy(next(kernels_dir().glob("a100-80gb-nccl-*.csv")), tmp_path)
    monkeypatch.setattr(kernels, "kernels_dir", lambda: tmp_path)
    tables = shipped_kernels(H100)
    assert tables is not None and tables.gemm_grid is not None and tables.comm_grid is not None
    assert tables != shipped  # other files: never one memoized cost for both
    (tmp_path / "bad.csv").write_text("# autoplan-kernels: 1\n# descriptor: h100-sxm\n# applies: maybe\n")
    with pytest.raises(InputError, match="bad.csv: applies: expected yes or no, got 'maybe'"):
        shipped_kernels(H100)


def test_a_measured_profile_of_the_device_takes_precedence_over_the_grids():
    # h200 ships an ``autoplan bench`` profile (profiles/measured/h200-*.csv) and grids
    door = corrected(resolve_cluster("dgx-h200"))
    assert door.profile is not None and door.cluster.device.correction is not None
    assert door.cluster.device.kernels is None


def test_a_device_without_grids_stays_on_the_curves():
    cluster = resolve_cluster("l40s-node")  # no grid shipped for the L40S
    assert corrected(cluster).cluster == cluster


def test_devices_with_and_without_grids_never_share_memoized_costs():
    _, device = h100()
    plain = resolve_device(H100, "test", "device")
    assert device != plain and hash(device) != hash(plain)
    assert gemm_time(4096, 8192, 8192, device, Dtype.BF16) != gemm_time(4096, 8192, 8192, plain, Dtype.BF16)


# --------------------------------------------------------------------------- files

@pytest.mark.parametrize("text,match", [
    ("# kind: gemm\ndtype,m,n,k=1\n", "not an autoplan kernel grid"),
    ("# autoplan-kernels: 1\n# kind: gemm\ndtype,m,n,k=64,k=128\nbf16,64,64,1\n", "expected 5 values"),
    ("# autoplan-kernels: 1\n# kind: gemm\ndtype,m,n,k=64\nbf16,64,64,-1\n", "expected a positive number"),
    ("# autoplan-kernels: 1\n# kind: gemm\ndtype,m,n,k=64\nbf16,64,64,1\nbf16,128,128,1\n", "lacks"),
    ("# autoplan-kernels: 1\n# kind: nccl\nop,gpus,bytes=1\nbroadcast,8,1\n", "op: expected one of"),
])
def test_a_malformed_grid_is_an_input_error_naming_the_file(text, match):
    parse = parse_comm_grid if "nccl" in text else parse_gemm_grid
    with pytest.raises(InputError, match=match) as err:
        parse(text, "grid.csv")
    assert "grid.csv" in str(err.value)


def test_the_shipped_grids_are_small_and_say_where_they_came_from():
    files = sorted(kernels_dir().glob("*.csv"))
    assert all(("# applies: no" in f.read_text()) == ("-gemm-" in f.name) for f in files)
    assert {f.name.split("-gemm-")[0] for f in files if "-gemm-" in f.name} == {
        "a100-80gb", "h100-sxm", "h200", "b200", "b300", "gb200", "gb300"}
    assert sum(f.stat().st_size for f in files) < 2 << 20
    for f in files:
        head = [ln for ln in f.read_text().splitlines() if ln.startswith("#")]
        assert any(ln.startswith("# source: aiconfigurator-core 0.12.0 ") for ln in head)
        assert any(ln.startswith("# license: Apache-2.0") for ln in head)
        assert "# command: python scripts/aiconfigurator_profiles.py kernels" in head


def test_the_import_writes_a_full_grid_and_fills_what_the_table_skipped(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow")
    import pandas as pd

    root = tmp_path / "site"
    pkg = root / "aiconfigurator_core"
    data = pkg / "systems" / "data" / "h100_sxm"
    info = root / "aiconfigurator_core-0.12.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: aiconfigurator-core\nVersion: 0.12.0\n")
    (pkg / "__init__.py").parent.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("raise ImportError('never imported')\n")
    rows = [{"m": m, "n": n, "k": k, "latency": 1e-3 * m * n * k / 1024 ** 3}
            for m in (1024, 1025, 2048) for n in (32, 1024) for k in (1024, 2048)
            if (m, n, k) != (2048, 1024, 2048)]  # one cell skipped, as the collector skips 2^31
    path = data / "gemm" / "trtllm" / "1.3.0rc20" / "gemm_perf.parquet"
    path.parent.mkdir(parents=True)
    pd.DataFrame([{"framework": "TRTLLM", "version": "1.3.0rc20", "device": "NVIDIA H100 80GB HBM3",
                   "op_name": "gemm", "kernel_source": "torch_flow", "gemm_dtype": dt, **r}
                  for dt in ("bfloat16", "fp8", "int8_wo") for r in rows]).to_parquet(path)
    nccl = data / "comm" / "nccl" / "2.29.2" / "nccl_perf.parquet"
    nccl.parent.mkdir(parents=True)
    pd.DataFrame([{"op_name": op, "kernel_source": "NCCL", "nccl_dtype": "half", "num_gpus": g,
                   "message_size": s, "latency": 0.01 * g + s * 1e-9, "device": "x"}
                  for op in ("all_reduce", "alltoall") for g in (2, 8)
                  for s in (256, 2 ** 20)]).to_parquet(nccl)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    grids = aiconfigurator.kernel_grids(aiconfigurator.locate(), "h100_sxm", "cmd")
    gemm_grid = parse_gemm_grid(grids[0].text(), grids[0].name)
    assert sorted(gemm_grid.tables) == ["bf16", "fp8"]  # int8_wo left out
    table = gemm_grid.tables["bf16"]
    assert table.m == (1024.0, 2048.0) and table.n == (1024.0,)  # m + 1 rows and n below 64 left out
    # the skipped cell: the nearest measured m's rate (the rows are at one rate: exact)
    filled = gemm_grid.gemm(2048, 1024, 2048, Dtype.BF16)
    assert filled is not None and filled[0] == pytest.approx(1e-6 * 2048 * 1024 * 2048 / 1024 ** 3, rel=1e-4)
    assert "bf16 1; fp8 1 cells" in grids[0].header["filled"]
    nccl_grid = parse_comm_grid(grids[1].text(), grids[1].name)
    assert nccl_grid.collective("all_to_all", 512, 8) == pytest.approx(0.08e-3, rel=1e-4)  # ms: 0.01 x 8
    assert math.isclose(nccl_grid.sizes[-1], 2 ** 21)
