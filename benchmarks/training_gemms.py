"""Training's GEMMs: the measured kernel grid against the efficiency curve, per device.

    python benchmarks/training_gemms.py [--dtype bf16|fp8] [--detail]

For public model configs (profiles/models/*.yaml: Llama-2-70B, Llama-3-70B, Llama-3.1-405B,
Nemotron-4-340B, GPT-3 175B, Mixtral-8x7B's attention and expert MLP as a dense one) at
tensor-parallel sizes 1, 2, 4 and 8 and 4,096 and 8,192 tokens per micro-batch, each layer's
forward GEMMs (kernels/layer.py ``layer_gemms``) and their backward GEMMs (data gradient
(m, k, n), weight gradient (k, n, m)) are timed twice on each device with shipped grids
(profiles/measured/kernels/, applied or not): by the grid (``kernels.compute.measured_gemm_time``, what
training costs with now) and by the curve (``curve_gemm_time``, what it costed with before).
Printed: per device and pass, the ratio grid / curve of the summed GEMM time of a layer,
median and range over the models x tp x tokens, and the median over every single GEMM.
Kernel times only: no step time, no calibration row. (The GEMM grids ship with ``applies:
no``: training prices its GEMMs on the curve; profiles/measured/README.md says why.)
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence

from autoplan.descriptors.library import resolve_device, resolve_model
from autoplan.kernels.compute import curve_gemm_time, measured_gemm_time
from autoplan.kernels.layer import Gemm, layer_gemms
from autoplan.measured.kernels import shipped_kernels
from autoplan.vocab import Dtype

MODELS = ("llama2-70b", "llama3-70b", "llama3-405b", "nemotron-4-340b", "gpt3-175b", "mixtral-8x7b")
DEVICES = ("a100-80gb", "h100-sxm", "h200", "b200", "gb200", "b300", "gb300")
TPS = (1, 2, 4, 8)
TOKENS = (4096, 8192)
PASSES = ("forward", "dgrad", "wgrad")


def shapes(g: Gemm) -> dict[str, tuple[float, float, float]]:
    """The forward GEMM's shape and its backward GEMMs' (kernels/compute.py
    ``backward_gemm_times``)."""
    return {"forward": (g.m, g.n, g.k), "dgrad": (g.m, g.k, g.n), "wgrad": (g.k, g.n, g.m)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--detail", action="store_true", help="one line per model x tp x tokens")
    args = ap.parse_args(argv)
    dtype = Dtype(args.dtype)
    w = sys.stdout.write
    w(f"training GEMMs, {dtype.value}: measured grid / efficiency curve (1.00: the curve was right; "
      "> 1: the grid is slower)\n")
    w(f"{'device':<11} {'pass':<8} {'layer median':>12} {'layer min':>10} {'layer max':>10} "
      f"{'GEMM median':>12} {'GEMMs':>6}  grid\n")
    for name in DEVICES:
        tables = shipped_kernels(name, every=True)  # the GEMM grids ship without applying
        device = resolve_device(name, "benchmarks/training_gemms.py", "device")
        if tables is None or tables.gemm_grid is None or not device.supports(dtype):
            w(f"{name:<11} no {dtype.value} grid shipped\n")
            continue
        measured = dataclasses.replace(device, kernels=tables)
        if measured.kernels is None or measured.kernels.gemm(4096, 4096, 4096, dtype) is None:
            w(f"{name:<11} no {dtype.value} grid shipped\n")
            continue
        layer: dict[str, list[float]] = {p: [] for p in PASSES}
        single: dict[str, list[float]] = {p: [] for p in PASSES}
        for model_name in MODELS:
            model = resolve_model(model_name)
            for tp in TPS:
                for tokens in TOKENS:
                    grid = dict.fromkeys(PASSES, 0.0)
                    curve = dict.fromkeys(PASSES, 0.0)
                    for g in layer_gemms(model, tokens, tp):
                        for p, shape in shapes(g).items():
                            t = measured_gemm_time(*shape, measured, dtype)
                            c = curve_gemm_time(*shape, device, dtype)
                            assert t is not None
                            grid[p] += t
                            curve[p] += c
                            single[p].append(t / c)
                    for p in PASSES:
                        layer[p].append(grid[p] / curve[p])
                    if args.detail:
                        w(f"  {name:<11} {model_name:<16} tp{tp} {tokens:>5} tokens: "
                          + "  ".join(f"{p} {grid[p] / curve[p]:.2f}" for p in PASSES) + "\n")
        source = tables.gemm_grid.meta.get("source", tables.gemm_grid.source)
        for p in PASSES:
            w(f"{name:<11} {p:<8} {statistics.median(layer[p]):>12.2f} {min(layer[p]):>10.2f} "
              f"{max(layer[p]):>10.2f} {statistics.median(single[p]):>12.2f} {len(single[p]):>6}  "
              f"{source if p == 'forward' else ''}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
