"""Measure what offload costs on this machine: host<->device copies and a CPU optimizer step.

    python benchmarks/host_offload.py [--json FILE]     (needs torch; CUDA for the copies)

Prints a table:
- pinned and pageable host->device and device->host copy bandwidth per GPU (1 GiB and
  256 MiB transfers) and both directions at once: the ``host_link_GBps`` a cluster file gives;
- how much a GEMM loop slows while a side stream copies device->host (does offload traffic
  steal compute? PipeOffload and ZeRO-Offload assume it overlaps);
- torch's CPU AdamW step over fp32 master weights (foreach and fused), as parameters per
  second and the host memory traffic it implies (16 bytes read + 12 written per parameter:
  weight, gradient, two moments), against a plain host copy's bandwidth: what the offload
  model's ``host memory bandwidth`` is checked against.

No autoplan import: the numbers go beside the cluster files' sources (profiles/hardware/,
docs/ACCURACY.md "Offload"). Deterministic inputs; times are medians of repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

GiB = 1 << 30


def median_time(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copies(torch, out: dict) -> None:
    for size in (GiB, GiB // 4):
        copies_of(torch, size, out)
        torch.cuda.empty_cache()


def copies_of(torch, size: int, out: dict) -> None:
    """Pinned and pageable copies of ``size`` bytes each way, and both ways at once."""
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    n = size // 2
    gpu = torch.empty(n, dtype=torch.bfloat16, device=dev)
    gpu2 = torch.empty(n, dtype=torch.bfloat16, device=dev)
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pinned2 = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    pageable = torch.empty(n, dtype=torch.bfloat16)
    pageable.fill_(1.0)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def both() -> None:
        with torch.cuda.stream(s1):
            gpu.copy_(pinned, non_blocking=True)
        with torch.cuda.stream(s2):
            pinned2.copy_(gpu2, non_blocking=True)

    cases = {
        "h2d_pinned": lambda: gpu.copy_(pinned, non_blocking=True),
        "d2h_pinned": lambda: pinned.copy_(gpu, non_blocking=True),
        "h2d_pageable": lambda: gpu.copy_(pageable),
        "d2h_pageable": lambda: pageable.copy_(gpu),
    }
    mib = size // (1 << 20)
    for name, fn in cases.items():
        fn()
        out[f"{name}_{mib}MiB_GBps"] = size / median_time(fn, 5, sync) / 1e9
    both()
    out[f"bidir_pinned_{mib}MiB_GBps_each"] = size / median_time(both, 5, sync) / 1e9


def overlap(torch, out: dict) -> None:
    """A bf16 8192^3 GEMM loop alone, then while a side stream copies device->host: the
    GEMMs' own time (CUDA events on their stream), so a copy that outlasts them does not count."""
    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    src = torch.empty(GiB // 2, dtype=torch.bfloat16, device=dev)
    dst = torch.empty(GiB // 2, dtype=torch.bfloat16, pin_memory=True)
    side = torch.cuda.Stream()
    n_gemm, n_copy = 100, 4  # ~0.16 s of GEMMs, ~0.08 s of copies on an H200

    def gemm_time(with_copies: bool) -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if with_copies:
            with torch.cuda.stream(side):
                for _ in range(n_copy):
                    dst.copy_(src, non_blocking=True)
        start.record()
        for _ in range(n_gemm):
            a @ b
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    gemm_time(False)
    alone = statistics.median(gemm_time(False) for _ in range(5))
    both = statistics.median(gemm_time(True) for _ in range(5))
    flops = n_gemm * 2 * 8192**3
    out["gemm_alone_tflops"] = flops / alone / 1e12
    out["gemm_during_d2h_tflops"] = flops / both / 1e12
    out["gemm_slowdown_during_d2h"] = both / alone


def cpu_adam(torch, out: dict) -> None:
    """torch.optim.AdamW on CPU fp32 tensors (16M elements each), foreach and fused."""
    n_tensors, each = 16, 16 << 20  # 256M parameters, 1 GiB per state
    params = [torch.nn.Parameter(torch.zeros(each)) for _ in range(n_tensors)]
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    out["cpu_threads"] = torch.get_num_threads()
    nparams = n_tensors * each
    for name, kw in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        try:
            opt = torch.optim.AdamW(params, lr=1e-4, **kw)
            opt.step()  # allocates the moments
        except (RuntimeError, TypeError) as err:  # fused CPU AdamW needs torch >= 2.4
            out[f"adamw_{name}_error"] = str(err)[:200]
            continue
        t = median_time(opt.step, 3, lambda: None)
        out[f"adamw_{name}_Gparams_per_s"] = nparams / t / 1e9
        out[f"adamw_{name}_implied_GBps"] = nparams * 28 / t / 1e9
        del opt
    big = torch.empty(GiB // 2)  # 2 GiB fp32
    big.fill_(1.0)
    dst = torch.empty_like(big)
    t = median_time(lambda: dst.copy_(big), 5, lambda: None)
    out["host_copy_GBps"] = 2 * big.numel() * 4 / t / 1e9  # read + write


def machine(torch, out: dict) -> None:
    out["python"] = platform.python_version()
    out["torch"] = torch.__version__
    out["cpu_count"] = os.cpu_count()
    for cmd, key in ((["lscpu"], "lscpu"), (["free", "-g"], "free_g"),
                     (["nvidia-smi", "--query-gpu=name,memory.total,driver_version,pcie.link.gen.max,"
                       "pcie.link.width.max,pcie.link.gen.current,pcie.link.width.current",
                       "--format=csv,noheader"], "gpu"),
                     (["nvidia-smi", "topo", "-m"], "topo")):
        try:
            out[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError) as err:
            out[key] = f"unavailable: {err}"
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
        out["device_name"] = torch.cuda.get_device_name(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the measurements here")
    parser.add_argument("--skip-cpu", action="store_true", help="copies only")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: pip install 'autoplan[bench]'")
        return
    out: dict = {"date": time.strftime("%Y-%m-%d", time.gmtime())}
    machine(torch, out)
    if torch.cuda.is_available():
        copies(torch, out)
        overlap(torch, out)
    if not args.skip_cpu:
        cpu_adam(torch, out)
    width = max(len(k) for k in out)
    for key, value in out.items():
        if isinstance(value, float):
            print(f"{key:<{width}}  {value:10.3f}")
        elif "\n" not in str(value):
            print(f"{key:<{width}}  {value}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
