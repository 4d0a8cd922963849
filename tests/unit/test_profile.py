"""The profile CSV contract, and the machine descriptor fitted on a profile."""

from __future__ import annotations

import pytest

from autoplan.descriptors.library import resolve_cluster
from autoplan.descriptors.strict import parse_yaml
from autoplan.errors import InputError
from autoplan.kernels import comm
from autoplan.kernels.compute import gemm_time
from autoplan.measured.machine import cluster_yaml, describe_machine, link_terms, standin_link
from autoplan.measured.profile import COLUMNS, achieved, format_profile, parse_profile, row_flops
from autoplan.vocab import Dtype

META = {"device_kind": "cpu", "device_name": "test cpu", "torch": "2.13.0", "date": "2026-11-22",
        "command": "autoplan bench"}


def _row(kind: str, op: str, seconds: float, **shape: int) -> dict:
    return {"kind": kind, "op": op, "dtype": shape.pop("dtype", "fp32"), **shape, "seconds": seconds,
            "seconds_p10": seconds * 0.95, "seconds_p90": seconds * 1.05, "repeats": 10}


# a machine with known constants: the profile is generated from autoplan's own model
PEAK, HALF, MEM_BPS, BW, ALPHA = 2e11, 5e7, 1.5e10, 3e9, 4e-5


def _synthetic_rows() -> list[dict]:
    rows = []
    for s in (64, 128, 256, 512, 1024, 2048):
        f = 2.0 * s**3
        rows.append(_row("gemm", "matmul", (f + HALF) / PEAK, m=s, n=s, k=s))
    for nb in (10**5, 10**6, 10**7, 10**8):
        rows.append(_row("elementwise", "copy", nb / MEM_BPS, nbytes=nb))
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"):
        for nb in (10**4, 10**5, 10**6, 10**7):
            lat, wire = link_terms(op, 4, nb)
            rows.append(_row("collective", op, lat * ALPHA + wire / BW, nbytes=nb, ranks=4, ranks_per_node=4))
    attn = {"batch": 1, "heads": 8, "kv_heads": 8, "seq": 1024, "head_dim": 64, "causal": 1}
    fwd = row_flops({"kind": "attention", "op": "sdpa_fwd", **attn})
    rows.append(_row("attention", "sdpa_fwd", fwd / (0.5 * PEAK), **attn))
    rows.append(_row("attention", "sdpa_bwd", 2.5 * fwd / (0.5 * PEAK), **attn))
    return rows


def test_round_trip_keeps_rows_and_provenance():
    text = format_profile(META, _synthetic_rows())
    prof = parse_profile(text, "p.csv")
    assert tuple(prof.rows.columns) == COLUMNS
    assert len(prof.rows) == len(_synthetic_rows())
    assert prof.meta["device_name"] == "test cpu" and prof.meta["autoplan-profile"] == "1"
    assert parse_profile(text, "again.csv").digest == prof.digest
    assert format_profile(META, _synthetic_rows()) == text  # deterministic text


def test_every_problem_is_named_with_file_row_and_column():
    text = format_profile(META, _synthetic_rows()[:2])
    bad = text.replace("matmul", "matmol", 1).replace("# torch: 2.13.0\n", "")
    lines = bad.splitlines()
    lines[-1] = lines[-1].replace("gemm,", "gemmm,", 1)
    with pytest.raises(InputError) as exc:
        parse_profile("\n".join(lines) + "\n", "bad.csv")
    msg = str(exc.value)
    assert "bad.csv: header.torch: missing" in msg
    assert "bad.csv: row 1.op: expected one of matmul, linear for gemm, got 'matmol'" in msg
    assert "bad.csv: row 2.kind: expected one of gemm, attention" in msg


def test_negative_time_and_missing_column_are_refused():
    text = format_profile(META, [{**_synthetic_rows()[0], "seconds": -0.5}])
    with pytest.raises(InputError, match=r"neg.csv: row 1.seconds: expected seconds > 0, got '-5"):
        parse_profile(text, "neg.csv")
    text = format_profile(META, _synthetic_rows()[:1])
    header, row = text.splitlines()[-2:]
    cut = "\n".join(text.splitlines()[:-2] + [header.replace(",repeats", ""), row]) + "\n"
    with pytest.raises(InputError, match="neg.csv: repeats: missing column"):
        parse_profile(cut, "neg.csv")


def test_attention_flops_match_a_hand_count():
    # causal forward: QK^T and PV, 2 * 2 * s^2 * d per head, halved by the mask
    rec = {"kind": "attention", "op": "sdpa_fwd", "batch": 2, "heads": 4, "seq": 100, "head_dim": 8,
           "causal": 1}
    assert row_flops(rec) == 2 * 4 * (2 * 2 * 100 * 100 * 8) / 2


def test_describe_machine_recovers_the_constants_that_generated_the_profile():
    prof = parse_profile(format_profile(META, _synthetic_rows()), "synthetic.csv")
    c = describe_machine(prof, name="local-cpu", ranks_per_node=4, mem_bytes=8 * 2**30, compute_dtype="fp32")
    d = c.device
    assert d.peak_bf16_flops == pytest.approx(PEAK, rel=1e-3)
    assert d.gemm_half_flop == pytest.approx(HALF, rel=1e-3)
    assert d.hbm_Bps == pytest.approx(MEM_BPS, rel=1e-3)
    assert d.attention_efficiency == pytest.approx(0.5, rel=1e-3)
    assert c.intra_node.bandwidth_Bps == pytest.approx(BW, rel=1e-3)
    assert c.intra_node.latency_s == pytest.approx(ALPHA, rel=1e-3)
    # and the cost model then predicts the profile's own rows
    assert gemm_time(512, 512, 512, d, Dtype.BF16) == pytest.approx((2 * 512**3 + HALF) / PEAK, rel=1e-3)
    g = comm.place_group(c, 4, 1)
    lat, wire = link_terms("all_reduce", 4, 10**6)
    assert comm.all_reduce(10**6, g) == pytest.approx(lat * ALPHA + wire / BW, rel=1e-3)
    assert achieved(prof).gemm_flops["fp32"] < PEAK  # the best GEMM still pays the half-size


def test_linear_rows_stand_for_training_where_a_profile_has_them():
    # a CPU without native bf16: row-major products 10x slower than the training layouts
    rows = _synthetic_rows()
    slow = [_row("gemm", "matmul", 10 * r["seconds"], m=r["m"], n=r["n"], k=r["k"], dtype="bf16")
            for r in rows if r["kind"] == "gemm"]
    fast = [_row("gemm", "linear", r["seconds"], m=r["m"], n=r["n"], k=r["k"], dtype="bf16")
            for r in rows if r["kind"] == "gemm"]
    prof = parse_profile(format_profile(META, rows + slow + fast), "both.csv")
    gemm = prof.of_kind("gemm")
    assert set(zip(gemm["op"], gemm["dtype"], strict=True)) == {("matmul", "fp32"), ("linear", "bf16")}
    c = describe_machine(prof, name="x", ranks_per_node=4, mem_bytes=2**30, compute_dtype="bf16")
    assert c.device.peak_bf16_flops == pytest.approx(PEAK, rel=1e-3)  # the slow rows left out
    assert achieved(prof).gemm_flops["bf16"] == pytest.approx(achieved(prof).gemm_flops["fp32"])


def test_cluster_yaml_loads_back_as_the_same_cluster(tmp_path):
    prof = parse_profile(format_profile(META, _synthetic_rows()), "synthetic.csv")
    c = describe_machine(prof, name="local-cpu", ranks_per_node=4, mem_bytes=8 * 2**30, compute_dtype="fp32")
    path = tmp_path / "local-cpu.yaml"
    path.write_text(cluster_yaml(c, prof, "autoplan bench --describe"))
    back = resolve_cluster(str(path))
    assert back.gpus == 4 and back.name == "local-cpu"
    assert back.device.peak_bf16_flops == pytest.approx(PEAK, rel=1e-3)
    assert back.intra_node.latency_s == pytest.approx(ALPHA, rel=1e-3)
    assert "synthetic.csv" in path.read_text()
    assert parse_yaml(path.read_text(), str(path))["cluster"]["device"]["reserve_GiB"] == 0


def test_describe_machine_needs_gemm_memory_and_collective_rows():
    rows = [r for r in _synthetic_rows() if r["kind"] != "collective"]
    prof = parse_profile(format_profile(META, rows), "nocoll.csv")
    with pytest.raises(InputError, match="nocoll.csv: kind: needs collective rows"):
        describe_machine(prof, name="x", ranks_per_node=2, mem_bytes=2**30, compute_dtype="fp32")


def test_a_one_gpu_profile_borrows_the_node_link_of_its_descriptor_devices_cluster():
    # `autoplan bench` on one GPU writes no collective rows; its header names the device
    rows = [r for r in _synthetic_rows() if r["kind"] != "collective"]
    prof = parse_profile(format_profile({**META, "descriptor": "h200"}, rows), "one-gpu.csv")
    c = describe_machine(prof, name="x", ranks_per_node=1, mem_bytes=2**30, compute_dtype="fp32")
    assert standin_link(prof) == (resolve_cluster("dgx-h200").intra_node, "dgx-h200")
    assert c.intra_node == resolve_cluster("dgx-h200").intra_node
    assert c.device.peak_bf16_flops == pytest.approx(PEAK, rel=1e-6)  # the rest is still fitted
    # a device no built-in cluster holds, or none named: nothing stands in
    assert standin_link(parse_profile(format_profile(META, rows), "p.csv")) is None
