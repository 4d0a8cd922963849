"""Reference tests for the devices people buy now and the models NVIDIA's serving runs use
(issue 49): Blackwell Ultra (B300, GB300) and their systems against the vendor's datasheet
figures, the Blackwell dense fp4 peaks, and Kimi-K2.5, MiniMax-M2.5 and DeepSeek-V3.1
against their published parameter counts (each row cites its source and the tolerance's
reason).

The profiles are inputs (datasheets, each model's config.json); the counts are predictions
of Model's formulas, never fed back in.
"""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_device, resolve_model
from autoplan.descriptors.model import read_model
from autoplan.descriptors.strict import Fields
from autoplan.errors import Problem
from autoplan.units import GiB
from autoplan.vocab import Dtype

DEVICES = ("b300", "gb300")
CLUSTERS = ("dgx-b300", "gb300-nvl72")
MODELS = ("kimi-k2.5", "minimax-m2.5", "deepseek-v3.1")


def test_every_new_system_and_model_is_built_in() -> None:
    assert set(DEVICES) <= set(builtin_names("device"))
    assert set(CLUSTERS) <= set(builtin_names("cluster"))
    assert set(MODELS) <= set(builtin_names("model"))


@pytest.mark.parametrize(
    ("name", "bf16", "fp8", "fp4", "mem_MiB", "hbm_GBps", "load_W"),
    [
        # NVIDIA Blackwell Ultra datasheet, HGX B300, per GPU, dense; 275,040 MiB reported by the
        # driver (both as NVIDIA AIConfigurator 0.12's systems/b300_sxm.yaml quotes them)
        ("b300", 2250, 4500, 14000, 275_040, 7750, 1100),
        # GB300 NVL72 specifications / 72, dense; 284,208 MiB reported (systems/gb300.yaml)
        ("gb300", 2500, 5000, 15000, 284_208, 8000, 1400),
    ],
)
def test_blackwell_ultra_carries_its_datasheet_figures(name, bf16, fp8, fp4, mem_MiB, hbm_GBps, load_W):
    d = resolve_device(name, "test", "device")
    assert (d.peak_flops(Dtype.BF16), d.peak_flops(Dtype.FP8), d.peak_flops(Dtype.FP4)) == pytest.approx(
        (bf16 * 1e12, fp8 * 1e12, fp4 * 1e12))
    # the driver's capacity in whole GiB, rounded down (the file says 268 / 277)
    assert d.mem_GiB == int(mem_MiB / 1024)
    assert d.hbm_Bps == pytest.approx(hbm_GBps * 1e9)
    assert d.power_load_W == load_W and d.power_idle_W is not None and 0 < d.power_idle_W < load_W


@pytest.mark.parametrize(("name", "fp4"), [
    ("b200", 9000),  # HGX B200: FP4 144 PFLOPS sparse | 72 PFLOPS dense for 8 GPUs
    ("gb200", 10000),  # GB200 NVL72: FP4 1,440 PFLOPS sparse / 72 / 2
])
def test_blackwell_devices_price_fp4_at_their_dense_peak(name, fp4):
    assert resolve_device(name, "test", "device").peak_flops(Dtype.FP4) == pytest.approx(fp4 * 1e12)


def test_blackwell_ultra_raises_dense_fp4_not_fp8_or_bf16():
    """The Blackwell Ultra blog: ~1.5x B200's dense NVFP4 at the same fp8/bf16 peaks."""
    for ultra, base in (("b300", "b200"), ("gb300", "gb200")):
        u, b = (resolve_device(n, "test", "device") for n in (ultra, base))
        assert 1.5 <= u.peak_flops(Dtype.FP4) / b.peak_flops(Dtype.FP4) <= 1.6
        assert (u.peak_flops(Dtype.FP8), u.peak_flops(Dtype.BF16)) == (b.peak_flops(Dtype.FP8),
                                                                        b.peak_flops(Dtype.BF16))
        assert u.mem_bytes > 1.45 * b.mem_bytes  # 288 GB of HBM3e for 180-186 GB usable


# NVIDIA AIConfigurator 0.12's kernel tables (systems/data/<system>/gemm/trtllm/1.3.0rc20/
# gemm_perf.parquet, Apache-2.0): the median over the 88 GEMMs with m, n, k >= 8192 of fp8's
# latency over nvfp4's. The device files take each dtype's efficiency from the table's best
# GEMM, not from these medians; 15 %: the best and the median shape differ by that much.
MEASURED_FP4_OVER_FP8 = {"b200": 1.30, "b300": 1.63, "gb200": 1.39, "gb300": 1.55}


@pytest.mark.parametrize(("name", "measured"), sorted(MEASURED_FP4_OVER_FP8.items()))
def test_a_large_fp4_gemm_outruns_fp8_by_what_tensorrt_llms_kernels_measure(name, measured):
    from autoplan.kernels.compute import gemm_time

    d = resolve_device(name, "test", "device")
    ratio = gemm_time(16384, 16384, 16384, d, Dtype.FP8) / gemm_time(16384, 16384, 16384, d, Dtype.FP4)
    assert ratio == pytest.approx(measured, rel=0.15)
    assert ratio < 0.9 * d.peak_flops(Dtype.FP4) / d.peak_flops(Dtype.FP8)  # far from the peaks' 2-3x


@pytest.mark.parametrize(
    ("name", "device", "gpus_per_node", "domain", "intra_GBps", "inter_GBps"),
    [
        ("dgx-b300", "b300", 8, 8, 900, 100),  # DGX B300: NVLink 5, 8x ConnectX-8 800 Gb/s
        ("gb300-nvl72", "gb300", 4, 72, 900, 100),  # GB300 NVL72: 72-GPU NVLink, CX-8 800 Gb/s per GPU
    ],
)
def test_blackwell_ultra_systems_load_with_their_links(name, device, gpus_per_node, domain, intra_GBps,
                                                       inter_GBps):
    c = resolve_cluster(name)
    assert c.device == resolve_device(device, "test", "device")
    assert (c.gpus_per_node, c.nvlink_domain) == (gpus_per_node, domain)
    assert c.intra_node.bandwidth_Bps == pytest.approx(intra_GBps * 1e9)
    assert c.inter_node.bandwidth_Bps == pytest.approx(inter_GBps * 1e9)
    assert 1.0 <= c.pue < 2.0


@pytest.mark.parametrize(("cuda_name", "descriptor"), [
    ("NVIDIA B300 SXM6 AC", "b300"),  # torch.cuda.get_device_name on HGX B300
    ("NVIDIA GB300", "gb300"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),
])
def test_bench_knows_blackwell_ultra_by_its_cuda_name(cuda_name, descriptor):
    from autoplan.bench.run import descriptor_name

    assert descriptor_name("cuda", cuda_name, None) == descriptor


# -- models ------------------------------------------------------------------------------

def test_kimi_k25_counts_the_checkpoints_parameters_exactly():
    """The Kimi-K2.5 checkpoint's language-model tensors hold 1,026,408,232,448 elements (Kimi K2's
    checkpoint, the same language model, holds as many), its vision tower 416,866,032 and projector
    54,277,888 more. The built-in is the config.json's import: the 60 sparse layers' router
    score-correction biases (384 each, stored in the checkpoint) counted, MoonViT and its
    patch-merger projector included."""
    m = resolve_model("kimi-k2.5")
    assert m.vision is not None and m.vision.params == 416_866_032 + 54_277_888
    assert m.params_total - m.vision.params == 1_026_408_232_448
    assert (m.experts, m.top_k, m.shared_experts, m.dense_layers, m.moe_layers) == (384, 8, 1, 1, 60)


def test_kimi_k25_active_count_matches_moonshots_32b_without_the_input_embedding():
    """Kimi K2 model card: 32B activated. On DeepSeek's basis (the input embedding, a lookup,
    left out) the count is 31.69B: within 2 % (the card's figure is whole billions, +-1.6 %)."""
    m = resolve_model("kimi-k2.5")
    assert m.params_active - m.vocab * m.hidden == pytest.approx(32e9, rel=0.02)


def test_minimax_m25_counts_are_near_the_published_230b_and_10b():
    """MiniMax-M2.5 model card: 230B total, 10B activated. Total within 1 % (228.7B); the
    active count without the input embedding (10.42B) within 5 %: the card's 10B is whole
    billions (+-5 %)."""
    m = resolve_model("minimax-m2.5")
    assert m.params_total == pytest.approx(230e9, rel=0.01)
    assert m.params_active - m.vocab * m.hidden == pytest.approx(10e9, rel=0.05)
    assert (m.experts, m.top_k, m.shared_experts, m.dense_layers, m.kv_heads) == (256, 8, 0, 0, 8)


def test_deepseek_v31_is_deepseek_v3s_architecture_under_its_own_name():
    """The DeepSeek-V3.1 model card: "The model structure of DeepSeek-V3.1 is the same as
    DeepSeek-V3"; 671B total, 37B activated, as V3."""
    v31, v3 = resolve_model("deepseek-v3.1"), resolve_model("deepseek-v3")
    assert dataclasses.replace(v31, name="deepseek-v3") == v3
    assert v31.params_total == pytest.approx(671e9, rel=0.01)


@pytest.mark.parametrize("name", MODELS)
def test_new_model_profile_round_trips_through_to_dict_and_read_model(name):
    model = resolve_model(name)
    problems: list[Problem] = []
    again = read_model(Fields(model.to_dict(), f"{name}.to_dict()", "model", problems))
    assert problems == [] and again == model


def test_kimi_k25_in_fp4_fits_one_gb300_tray_and_runs_fp4_gemms_there():
    """NVFP4 weights (half a byte each: 478 GiB for the language model) over a 4-GPU GB300 tray
    at TP 4: each GPU holds under half its 277 GiB in weights, and the GEMMs run in fp4."""
    from autoplan.descriptors.library import with_gpus
    from autoplan.serving.cost import StepModel
    from autoplan.serving.deployment import Deployment, Precision
    from autoplan.serving.engine import Engine

    m = resolve_model("kimi-k2.5")
    assert m.params_total * 0.5 / GiB == pytest.approx(478, abs=1)
    step = StepModel(m, with_gpus(resolve_cluster("gb300-nvl72"), 4),
                     Deployment(replicas=1, tp=4, weights=Precision.FP4), Engine.TRTLLM)
    assert step.dtype is Dtype.FP4
    assert step.memory_weights() < 0.5 * step.device.mem_bytes
