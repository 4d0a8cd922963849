"""Serving's measured token-mixer tables (issue 51, "Kernels"): the shipped files parse and
carry their provenance, a lookup at a row answers the row, the serving cost takes a table's
time where it covers a layer and the roofline where not, and says which in the prediction."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import CSA, HCA, Model
from autoplan.errors import InputError
from autoplan.measured.aiconfigurator_mixers import fill
from autoplan.measured.door import corrected, with_mixers
from autoplan.measured.mixer_tables import MixerTables, mixers_dir, parse_mixer_table, shipped_mixers
from autoplan.serving.cost import StepModel, prefill_prompts
from autoplan.serving.deployment import Deployment, Precision
from autoplan.serving.engine import Engine
from autoplan.serving.engines.trtllm import FIRST_RELEASE
from autoplan.serving.kinds import table_key
from autoplan.serving.trust import mixer_kernels, mixer_tables
from tests.helpers import autoplan
from tests.unit.test_serving_hybrid import nemotron_h_like, qwen3_next_like

AIC = "aiconfigurator-0.12.0"
GDN_FILE = f"h200-vllm-0.24.0-gdn-{AIC}.csv"
QNEXT_KEY = "16/32/128/128/4"  # Qwen3-Next's Gated DeltaNet on one GPU: 16 key, 32 value heads


def _row(name: str, phase: str, key: str, batch: int) -> tuple[list[float], list[float]]:
    """(lengths, microseconds) of one row of a shipped file, read as text."""
    lines = (mixers_dir() / name).read_text().splitlines()
    meta = dict(ln[2:].split(": ", 1) for ln in lines if ln.startswith("# "))
    axis = [float(v) for v in meta[f"axis.{phase}"].split()[1:]]
    row = next(ln.split(",") for ln in lines if ln.startswith(f"{phase},{key},{batch},"))
    return axis, [float(v) for v in row[3:]]


def _step(model: Model, engine: Engine, version: str, gpus: int = 1, cluster: str = "dgx-h200",
          tables: bool = True, every: bool = False, **deployment) -> StepModel:
    c = corrected(with_gpus(resolve_cluster(cluster), gpus), engine=engine, version=version).cluster
    if not tables:
        c = dataclasses.replace(c, device=dataclasses.replace(c.device, mixer_kernels=None))
    elif every:  # every phase of every shipped table, applied or not (shipped_mixers every)
        c = dataclasses.replace(c, device=dataclasses.replace(
            c.device, mixer_kernels=shipped_mixers(c.device.name, engine.value, version, every=True)))
    return StepModel(model, c, Deployment(replicas=1, tp=gpus, **deployment), engine, version)


# ------------------------------------------------------------------ the files

def test_every_shipped_mixer_table_parses_and_says_where_it_came_from() -> None:
    paths = sorted(mixers_dir().glob("*.csv"))
    # 6 GPUs: GDN of 3 engines, DSA of vLLM and TensorRT-LLM, Mamba-2 of TRT-LLM; DeepSeek-V4's C
    # and H modules of vLLM (6 GPUs) and TensorRT-LLM (the 4 Blackwell ones)
    assert len(paths) == 36 + 2 * (6 + 4)
    assert sum(p.stat().st_size for p in paths) < 500_000
    for path in paths:
        table = parse_mixer_table(path.read_text(), path.name)
        for line in ("descriptor", "device_name", "engine", "engine_version", "source", "license", "command",
                     "kernels", "key", "units", "filled"):
            assert table.meta[line], (path.name, line)
        assert table.meta["source"].startswith("aiconfigurator-core 0.12.0 ")
        assert table.meta["command"] == "python scripts/aiconfigurator_profiles.py mixers"
        assert path.name.startswith(f"{table.meta['descriptor']}-{table.meta['engine']}-"
                                    f"{table.meta['engine_version']}-{table.kind}-")
        assert table.applies == (frozenset() if table.kind == "dsa" else {"context", "generation"})


def test_the_mixer_tables_come_at_the_versions_the_serving_profiles_ship() -> None:
    for path in mixers_dir().glob("*.csv"):
        table = parse_mixer_table(path.read_text(), path.name)
        version = table.meta["engine_version"]
        if table.kind.startswith("dsv4") and table.meta["engine"] == "trtllm":
            # TensorRT-LLM's DeepSeek-V4 tables: its first release that runs the model, of the
            # line its profile ships (1.3.0rc20)
            assert version == str(FIRST_RELEASE[CSA]) == "1.3.0rc23", path.name
            version = "1.3.0rc20"
        name = f"{table.meta['descriptor']}-{table.meta['engine']}-{version}-aiconfigurator.csv"
        profile = path.parent.parent / name
        assert profile.is_file(), path.name


def test_a_table_with_a_row_of_the_wrong_length_is_refused_naming_the_line() -> None:
    text = (mixers_dir() / GDN_FILE).read_text().rstrip("\n") + "\ncontext,1/2/128/128/4,1,5.0\n"
    with pytest.raises(InputError, match=r"line \d+: expected 15 values, got 4"):
        parse_mixer_table(text, "bad.csv")


def test_an_applies_line_naming_no_phase_is_refused() -> None:
    text = (mixers_dir() / GDN_FILE).read_text().replace("# applies: yes", "# applies: sometimes")
    with pytest.raises(InputError, match="applies: expected yes, no or phases"):
        parse_mixer_table(text, "bad.csv")


def test_a_missing_cell_is_filled_from_the_nearest_smaller_batch_at_its_rate_per_sequence() -> None:
    cells = {(1, 1): 2.0, (4, 1): 3.0, (1, 8): 5.0}
    full, filled = fill(cells, [1, 4], [1, 8])
    assert full[(4, 8)] == 5.0 * 4 and filled == 1


# ------------------------------------------------------------------ the lookup

def test_a_lookup_at_a_table_row_returns_the_rows_time() -> None:
    tables = shipped_mixers("h200", "vllm", "0.24.0")
    assert tables is not None
    lengths, us = _row(GDN_FILE, "context", QNEXT_KEY, 4)
    for length, want in zip(lengths, us, strict=True):
        got = tables.seconds("gdn", "context", QNEXT_KEY, 4, length)
        assert got == (pytest.approx(want * 1e-6), 4, length)
    _, (decode,) = _row(GDN_FILE, "generation", QNEXT_KEY, 64)
    assert tables.seconds("gdn", "generation", QNEXT_KEY, 64, 1)[0] == pytest.approx(decode * 1e-6)


def test_between_rows_the_time_is_the_log_log_interpolation_and_past_the_edge_the_edges_point() -> None:
    tables = shipped_mixers("h200", "vllm", "0.24.0")
    assert tables is not None
    (_, (t1,)), (_, (t4,)) = (_row(GDN_FILE, "generation", QNEXT_KEY, b) for b in (1, 4))
    got, _, _ = tables.seconds("gdn", "generation", QNEXT_KEY, 2, 1)
    assert got == pytest.approx(math.sqrt(t1 * t4) * 1e-6)
    assert tables.seconds("gdn", "context", QNEXT_KEY, 4, 1e6)[1:] == (4, 32768)  # clamped
    assert tables.seconds("gdn", "context", "3/7/128/128/4", 4, 64) is None  # heads never timed


def test_a_training_door_attaches_no_mixer_tables_and_the_serving_door_those_of_its_engine() -> None:
    assert corrected(with_gpus(resolve_cluster("dgx-h100"), 8)).cluster.device.mixer_kernels is None
    cluster = with_gpus(resolve_cluster("dgx-h200"), 8)
    vllm = with_mixers(cluster, "vllm", "0.24.0").device.mixer_kernels
    trt = with_mixers(cluster, "trtllm", "1.3.0rc20").device.mixer_kernels
    assert isinstance(vllm, MixerTables) and isinstance(trt, MixerTables)
    # DSA's tables ship unapplied (aiconfigurator_mixers.APPLIES): only with every phase
    assert set(vllm.tables) == {"gdn", "dsv4_csa", "dsv4_hca"} and set(trt.tables) == {"gdn", "mamba2"}
    assert "dsa" in shipped_mixers("h200", "vllm", "0.24.0", every=True).tables


# ------------------------------------------------------------------ the serving cost

def test_equal_chunks_give_back_how_many_prompts_a_prefill_is() -> None:
    for b, c, p in ((1, 8192, 0), (8, 1000, 0), (4, 512, 3000)):
        pairs = b * (c * p + c * (c + 1) / 2)
        assert prefill_prompts(b * c, pairs, b * p) == pytest.approx(b)


def test_a_gated_deltanet_prefill_and_decode_take_the_tables_time_where_it_covers_the_layer() -> None:
    model = qwen3_next_like(1)  # three GDN layers, one full
    step, bare = _step(model, Engine.VLLM, "0.24.0"), _step(model, Engine.VLLM, "0.24.0", tables=False)
    tables = step.device.mixer_kernels
    assert tables is not None
    n = 8192
    prefill = step.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=n * (n + 1) / 2,
                             prefill_context=0.0, sampled=1).attention
    full = bare._kscale * bare._pair_s["A"] * n * (n + 1) / 2
    gdn = tables.seconds("gdn", "context", QNEXT_KEY, 1, n)[0]
    assert prefill == pytest.approx(full + step._kscale * 3 * gdn)
    const, slope = step._decode_kinds(64, 64 * 1000)
    assert const == pytest.approx(3 * tables.seconds("gdn", "generation", QNEXT_KEY, 64, 1)[0])
    assert slope == pytest.approx(bare._decode_kinds(64, 64 * 1000)[1])  # the full layer's reads
    assert step.table_sources() == {"G": {"context": f"profiles/measured/mixers/{GDN_FILE}",
                                          "generation": f"profiles/measured/mixers/{GDN_FILE}"}}
    assert dict(mixer_kernels(step)) == {"gated delta net": "measured", "full attention": "measured"}


def test_a_layer_no_table_covers_keeps_the_roofline_and_is_reported_as_roofline() -> None:
    # TensorRT-LLM timed Gated DeltaNet only at 16 key heads a GPU: TP 2 leaves 8
    model = qwen3_next_like(1)
    step = _step(model, Engine.TRTLLM, "1.3.0rc20", gpus=2)
    bare = _step(model, Engine.TRTLLM, "1.3.0rc20", gpus=2, tables=False)
    n = 4096
    assert step.table_sources() == {}
    pairs = n * (n + 1) / 2
    assert step.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=pairs, prefill_context=0.0,
                          sampled=1) == bare.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=pairs,
                                                       prefill_context=0.0, sampled=1)
    assert step._decode_kinds(16, 16 * 500) == bare._decode_kinds(16, 16 * 500)
    assert dict(mixer_kernels(step))["gated delta net"] == "roofline" and mixer_tables(step) == ()


def test_a_mamba_layer_takes_its_conv_from_the_table_and_its_scan_from_the_roofline() -> None:
    model = nemotron_h_like()  # 6,144 conv channels: Nemotron-3-Nano's, timed by TensorRT-LLM
    step = _step(model, Engine.TRTLLM, "1.3.0rc20")
    tables = step.device.mixer_kernels
    assert tables is not None
    conv = tables.seconds("mamba2", "context", "6144/4", 1, 2048)[0]
    assert step._prefill_table("M", 1, 2048, 0, 2048) == pytest.approx(conv + step._scan_s * 2048)
    assert dict(mixer_kernels(step))["mamba-2"] == "partly measured"
    (name, covers, prefill, decode), = mixer_tables(step)
    assert (name, covers) == ("mamba-2", "its conv (the SSD scan from the roofline)")
    assert prefill == decode == f"profiles/measured/mixers/h200-trtllm-1.3.0rc20-mamba2-{AIC}.csv"


def test_deepseek_v32s_sparse_layers_take_the_blocks_time_less_their_projections() -> None:
    model = resolve_model("deepseek-v3.2")
    # shipped, not applied: the roofline prices sparse attention
    plain = _step(model, Engine.VLLM, "0.24.0", gpus=8, weights=Precision.FP8)
    assert plain.table_sources() == {} and dict(mixer_kernels(plain)) == {"sparse attention": "roofline"}
    # taken where asked for (every phase): the block less the projections priced apart
    step = _step(model, Engine.VLLM, "0.24.0", gpus=8, every=True, weights=Precision.FP8)
    tables = step.device.mixer_kernels
    assert tables is not None
    key = f"{':'.join(map(str, (7168, 1536, 512, 128, 64, 128, 2048, 64, 128)))}/16/bf16"
    block = tables.seconds("dsa", "context", key, 4, 1024)[0]
    projections = step._gemms(4096, step._sparse_mixer_shapes)
    assert step._prefill_table("D", 4, 1024, 0, 4096) == pytest.approx(block - projections)
    assert dict(mixer_kernels(step)) == {"sparse attention": "measured"}
    (_, _, prefill, decode), = mixer_tables(step)
    assert prefill.endswith("h200-vllm-0.24.0-dsa-aiconfigurator-0.12.0.csv") and decode is not None
    # fp4 weights: GEMM dtypes the tables never timed
    assert _step(model, Engine.VLLM, "0.24.0", gpus=8, weights=Precision.FP4,
                 cluster="dgx-b200").table_sources() == {}


# ------------------------------------------------------------------ serve end to end

def _model_file(tmp_path: Path, model: Model) -> Path:
    path = tmp_path / f"{model.name}.yaml"
    path.write_text(yaml.safe_dump({"model": model.to_dict()}, sort_keys=False))
    return path


@pytest.mark.parametrize(("model", "engine", "version", "mixer", "how", "kind"), [
    (qwen3_next_like(1), "vllm", "0.24.0", "gated delta net", "measured", "gdn"),
    (nemotron_h_like(), "trtllm", "1.3.0rc20", "mamba-2", "partly measured", "mamba2"),
])
def test_serve_says_which_mixers_the_tables_priced(tmp_path, model, engine, version, mixer, how,
                                                   kind) -> None:
    job = ("serve", "--model", _model_file(tmp_path, model), "--cluster", "dgx-h200", "--gpus", "1",
           "--engine", engine, "--engine-version", version, "--input-len", "500", "--output-len", "32",
           "--rate", "2", "--requests", "20", "--top", "1")
    got = autoplan(*job, "--format", "json")
    assert got.returncode == 0, got.stderr
    provenance = json.loads(got.stdout)["plans"][0]["prediction"]["evidence"]["provenance"]
    assert provenance["mixers"][mixer] == how
    assert provenance["mixer_tables"][mixer]["prefill"] == (
        f"profiles/measured/mixers/h200-{engine}-{version}-{kind}-{AIC}.csv")
    assert f"token mixers: {mixer} {how} (" in autoplan(*job).stdout.replace("#1: ", "")


# ------------------------------------------------------------------ the extraction

def _parquet(path: Path, rows: list[dict], **common) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{**common, **r} for r in rows]).to_parquet(path)


def test_the_extraction_sums_a_phases_kernels_over_the_median_of_d_model_and_writes_what_it_read(tmp_path):
    from autoplan.measured.aiconfigurator import Package
    from autoplan.measured.aiconfigurator_mixers import mixer_files

    data = tmp_path / "data"
    heads = {"num_k_heads": 16, "head_k_dim": 128, "num_v_heads": 32, "head_v_dim": 128, "d_conv": 4,
             "device": "NVIDIA H200", "op_name": "gdn"}
    rows = []
    for b in (1, 4):
        for s in (1, 16):
            for d_model, scale in ((2048, 1.0), (2560, 1.1), (4096, 0.9)):  # the median: scale 1
                cell = {"phase": "context", "batch_size": b, "seq_len": s, "d_model": d_model}
                rows += [{**cell, "kernel_source": "causal_conv1d_fn", "latency": 0.001 * b * s * scale},
                         {**cell, "kernel_source": "chunk_gated_delta_rule_flashinfer",
                          "latency": 0.01 * b * s * scale}]
        cell = {"phase": "generation", "batch_size": b, "seq_len": 1, "d_model": 2048}
        rows += [{**cell, "kernel_source": "causal_conv1d_update", "latency": 0.002 * b},
                 {**cell, "kernel_source": "fused_recurrent_gated_delta_rule_packed_decode",
                  "latency": 0.005 * b}]
    rows = [r for r in rows if not (r["batch_size"] == 4 and r["seq_len"] == 16 and r["phase"] == "context")]
    _parquet(data / "h200_sxm" / "linear_attention" / "vllm" / "0.24.0" / "gdn_perf.parquet", rows, **heads)
    (file,) = mixer_files(Package(data, "0.12.0"), "h200_sxm", versions={"vllm": "0.24.0"})
    assert file.name == "h200-vllm-0.24.0-gdn-aiconfigurator-0.12.0.csv"
    assert file.header["source"] == ("aiconfigurator-core 0.12.0 "
                                     "h200_sxm/linear_attention/vllm/0.24.0/gdn_perf.parquet")
    assert file.header["filled"].startswith("1 cells")  # batch 4 x 16 tokens, from batch 1's rate
    tables = MixerTables({"gdn": parse_mixer_table(file.text(), file.name)})
    assert tables.seconds("gdn", "context", QNEXT_KEY, 1, 16)[0] == pytest.approx(0.011 * 16e-3)
    assert tables.seconds("gdn", "context", QNEXT_KEY, 4, 16)[0] == pytest.approx(4 * 0.011 * 16e-3)
    assert tables.seconds("gdn", "generation", QNEXT_KEY, 4, 1)[0] == pytest.approx(0.007 * 4e-3)


def test_a_sparse_layers_measured_decode_is_linear_about_the_context_it_reads() -> None:
    model = resolve_model("deepseek-v3.2")
    cluster = with_gpus(resolve_cluster("dgx-h200"), 8)
    every = shipped_mixers("h200", "vllm", "0.24.0", every=True)  # the decode block applied too
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, mixer_kernels=every))
    deployment = Deployment(replicas=1, tp=8, weights=Precision.FP8)
    step = StepModel(model, cluster, deployment, Engine.VLLM, "0.24.0")
    assert step.table_sources()["D"]["generation"] is not None
    key = f"{':'.join(map(str, (7168, 1536, 512, 128, 64, 128, 2048, 64, 128)))}/16/bf16"
    const, slope = step._decode_table("D", 64, 64 * 4096)
    block = every.seconds("dsa", "generation", key, 64, 4096)[0] - step._gemms(64, step._sparse_mixer_shapes)
    assert const + slope * 64 * 4096 == pytest.approx(block)
    assert slope > 0


# ------------------------------------------------------------------ DeepSeek-V4's C and H modules

FLASH_C = "4096:64:1024:512:8:1024:128:4:64:128:512"  # hidden:heads:q_lora:head_dim:o_groups:o_lora:w:r:index
FLASH_H = "4096:64:1024:512:8:1024:128:128"
V4_CSA_FILE = f"h200-vllm-0.24.0-dsv4_csa-{AIC}.csv"
V4_HCA_FILE = f"h200-vllm-0.24.0-dsv4_hca-{AIC}.csv"
V4_TABLE = f"""# autoplan-mixer-kernels: 1
# kind: dsv4_csa
# arch.a0: flash {FLASH_C} (dims)
# axis.context: seq 1 1024
# axis.generation: context 1 4096
phase,key,batch,us...
context,a0/8/fp8,1,100,400
context,a0/8/fp8,4,120,1600
generation,a0/8/fp8,1,90,95
generation,a0/8/fp8,4,92,100
"""


def test_a_compressed_layer_is_keyed_by_its_dims_its_heads_on_a_gpu_and_an_fp8_cache() -> None:
    flash = resolve_model("deepseek-v4-flash")
    assert table_key(flash, CSA, 8, "fp8", "bf16") == f"{FLASH_C}/8/fp8"
    assert table_key(flash, HCA, 2, "fp8", "fp4") == f"{FLASH_H}/32/fp8"  # any weights: taken off at fp8
    assert table_key(flash, CSA, 8, "bf16", "fp8") is None  # the tables hold an fp8 cache alone
    assert table_key(flash, HCA, 3, "fp8", "fp8") is None  # a fraction of a head
    tables = MixerTables({"dsv4_csa": parse_mixer_table(V4_TABLE, "v4.csv")})
    key = table_key(flash, CSA, 8, "fp8", "fp8")
    assert key is not None
    got, b, s = tables.seconds("dsv4_csa", "context", key, 2, 1024)  # the architecture's alias
    assert got == pytest.approx(math.sqrt(400 * 1600) * 1e-6) and (b, s) == (2, 1024)
    assert tables.seconds("dsv4_csa", "generation", key, 1, 4096)[0] == pytest.approx(95e-6)
    # other heads on a GPU (TP 16), another architecture's dims: no grid, the roofline keeps them
    assert tables.source("dsv4_csa", "context", f"{FLASH_C}/4/fp8") is None
    pro_like = dataclasses.replace(flash, index_topk=1024)
    assert tables.source("dsv4_csa", "context", table_key(pro_like, CSA, 8, "fp8", "fp8") or "") is None


def _flash_step(**deployment) -> StepModel:
    deployment = {"kv_cache": Precision.FP8, "weights": Precision.FP8, **deployment}
    return _step(resolve_model("deepseek-v4-flash"), Engine.VLLM, "0.24.0", gpus=8, **deployment)


def test_flash_prices_its_compressed_layers_by_the_module_less_its_projections_at_fp8() -> None:
    step = _flash_step()
    tables = step.device.mixer_kernels
    assert tables is not None
    assert step.table_sources() == {
        "C": {"context": f"profiles/measured/mixers/{V4_CSA_FILE}",
              "generation": f"profiles/measured/mixers/{V4_CSA_FILE}"},
        "H": {"context": f"profiles/measured/mixers/{V4_HCA_FILE}",
              "generation": f"profiles/measured/mixers/{V4_HCA_FILE}"}}
    key = f"{FLASH_C}/8/fp8"
    block = tables.seconds("dsv4_csa", "context", key, 4, 1024)[0]
    projections = step._block_gemms("C", 4096)
    assert 0 < projections < block
    assert step._prefill_table("C", 4, 1024, 0, 4096) == pytest.approx(block - projections)
    # bf16 weights: the same core (the module's fp8 projections taken off), the layer's GEMMs
    # priced at bf16 apart
    assert _flash_step(weights=Precision.BF16)._prefill_table("C", 4, 1024, 0, 4096) == pytest.approx(
        block - projections)
    # decode: linear about the mean context, the module less its projections there
    const, slope = step._decode_table("H", 64, 64 * 4096)
    module = tables.seconds("dsv4_hca", "generation", f"{FLASH_H}/8/fp8", 64, 4096)[0]
    assert const + slope * 64 * 4096 == pytest.approx(module - step._block_gemms("H", 64))
    # past the grid's 1,024 sequences: the edge's time scaled by the roofline's ratio
    edge = tables.seconds("dsv4_csa", "context", key, 1024, 1024)[0]
    roof = step._table_roofline
    ratio = roof("C", "context", 2048, 1024) / roof("C", "context", 1024, 1024)
    assert step._table("C", "context", 2048, 1024) == pytest.approx(edge * ratio)
    assert 1.9 < ratio < 2.1  # twice the sequences: twice the work
    assert dict(mixer_kernels(step)) == {"sliding-window attention": "roofline",
                                         "compressed sparse attention": "measured",
                                         "heavily compressed attention": "measured"}


def test_a_compressed_shape_no_table_holds_keeps_the_roofline() -> None:
    bf16_cache = _flash_step(kv_cache=Precision.BF16)
    bare = _step(resolve_model("deepseek-v4-flash"), Engine.VLLM, "0.24.0", gpus=8, tables=False,
                 kv_cache=Precision.BF16, weights=Precision.FP8)
    assert bf16_cache.table_sources() == {} and mixer_tables(bf16_cache) == ()
    n = 4096
    pairs = n * (n + 1) / 2
    assert bf16_cache.iteration(n, decodes=0, decode_context=0.0, prefill_pairs=pairs, prefill_context=0.0,
                                sampled=1) == bare.iteration(n, decodes=0, decode_context=0.0,
                                                             prefill_pairs=pairs, prefill_context=0.0,
                                                             sampled=1)
    assert bf16_cache._decode_kinds(16, 16 * 3000) == bare._decode_kinds(16, 16 * 3000)
    assert dict(mixer_kernels(bf16_cache))["compressed sparse attention"] == "roofline"
    # an indexer of other dims: its C layers keep the roofline, its H layers the table
    other = dataclasses.replace(resolve_model("deepseek-v4-flash"), index_topk=2048)
    step = _step(other, Engine.VLLM, "0.24.0", gpus=8, kv_cache=Precision.FP8, weights=Precision.FP8)
    assert set(step.table_sources()) == {"H"}
    assert dict(mixer_kernels(step)) == {"sliding-window attention": "roofline",
                                         "compressed sparse attention": "roofline",
                                         "heavily compressed attention": "measured"}


def test_serve_says_flashs_compressed_layers_are_measured_and_names_the_files() -> None:
    def job(kv: str) -> tuple[str, ...]:
        return ("serve", "--model", "deepseek-v4-flash", "--cluster", "dgx-h200", "--gpus", "8",
                "--kv-cache", kv, "--weights", "fp8", "--engine-version", "0.24.0", "--input-len", "2000",
                "--output-len", "64", "--rate", "2", "--requests", "20", "--top", "1")

    got = autoplan(*job("fp8"), "--format", "json")
    assert got.returncode == 0, got.stderr
    provenance = json.loads(got.stdout)["plans"][0]["prediction"]["evidence"]["provenance"]
    files = (("compressed sparse attention", V4_CSA_FILE), ("heavily compressed attention", V4_HCA_FILE))
    for mixer, name in files:
        assert provenance["mixers"][mixer] == "measured"
        assert provenance["mixer_tables"][mixer]["prefill"] == f"profiles/measured/mixers/{name}"
        assert provenance["mixer_tables"][mixer]["decode"] == f"profiles/measured/mixers/{name}"
    text = autoplan(*job("fp8")).stdout
    assert "compressed sparse attention measured (its whole attention module" in text
    assert V4_HCA_FILE in text
    # the default bf16 cache: no table holds it, the line says roofline
    plain = autoplan(*job("bf16"))
    assert plain.returncode == 0, plain.stderr
    assert "compressed sparse attention roofline; heavily compressed attention roofline" in plain.stdout


def _flash_config(path: Path) -> None:
    """DeepSeek-V4-Flash's config.json (tests/data/hf) where a package keeps its model configs."""
    hf = Path(__file__).resolve().parents[1] / "data" / "hf"
    source = hf / "deepseek-ai--DeepSeek-V4-Flash.config.json"
    path.mkdir(parents=True, exist_ok=True)
    (path / "sgl-project--DeepSeek-V4-Flash-FP8_config.json").write_text(
        source.read_text().replace('"deepseek_v4"', '"deepseek_ref"'))  # as the FP8 repack names it


def test_the_v4_extraction_keeps_rank_local_rows_drops_partial_keys_and_takes_trtllms_own_release(tmp_path):
    from autoplan.measured.aiconfigurator import Package
    from autoplan.measured.aiconfigurator_mixers import mixer_files

    data = tmp_path / "aic" / "systems" / "data"
    _flash_config(tmp_path / "aic" / "model_configs")
    common = {"model": "sgl-project/DeepSeek-V4-Flash-FP8", "kv_cache_dtype": "fp8", "gemm_type": "fp8_block",
              "device": "NVIDIA B200", "kernel_source": "DeepseekV4TrtllmAttention"}
    for which, ratio in (("csa", 4), ("hca", 128)):
        for phase in ("context", "generation"):
            rows = []
            for heads, tp in ((8, 8), (16, 4), (32, 8)):  # 32 heads at TP 8: not Flash's, left out
                for b in (1, 4):
                    for s in (1, 1024):
                        if heads == 16 and b == 1 and s == 1:
                            continue  # a partial collection: the key is left out
                        step, isl = (0, s) if phase == "context" else (s, 1)
                        rows.append({"op_name": f"dsv4_{which}_{phase}_module", "num_heads": heads,
                                     "tp_size": tp, "batch_size": b, "isl": isl, "step": step,
                                     "compress_ratio": ratio,
                                     "latency": 0.1 * b * (1 + s / 1024) * (2 if heads == 32 else 1)})
            if phase == "context":  # a prefix row, left out (no prefix in the grid)
                rows.append({**rows[0], "step": 128, "latency": 99.0})
            _parquet(data / "b200_sxm" / "sparse_attention" / "trtllm" / "1.3.0rc23"
                     / f"dsv4_{which}_{phase}_module_perf.parquet", rows, **common)
    files = mixer_files(Package(data, "0.12.0"), "b200_sxm", versions={"trtllm": "1.3.0rc20"})
    assert [f.name for f in files] == [f"b200-trtllm-1.3.0rc23-dsv4_csa-{AIC}.csv",
                                       f"b200-trtllm-1.3.0rc23-dsv4_hca-{AIC}.csv"]
    csa = parse_mixer_table(files[0].text(), files[0].name)
    assert csa.applies == {"context", "generation"} and csa.meta["skipped"].startswith("a0/16/fp8 ")
    assert csa.meta["arch.a0"].startswith(f"sgl-project/DeepSeek-V4-Flash-FP8 {FLASH_C} ")
    tables = MixerTables({"dsv4_csa": csa})
    key = table_key(resolve_model("deepseek-v4-flash"), CSA, 8, "fp8", "fp8")
    assert key is not None
    assert tables.seconds("dsv4_csa", "context", key, 4, 1024)[0] == pytest.approx(0.8e-3)
    # three significant digits of microseconds, as written
    assert tables.seconds("dsv4_csa", "generation", key, 1, 1)[0] == pytest.approx(0.1e-3, rel=1e-3)
    assert tables.source("dsv4_csa", "context", f"{FLASH_C}/16/fp8") is None  # the partial key
