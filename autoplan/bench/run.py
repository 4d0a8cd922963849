"""``autoplan bench``: kernel and collective microbenchmarks on the local devices, with the
provenance header a profile needs (:mod:`autoplan.measured.profile`).

Pure library: validation errors are :class:`~autoplan.errors.InputError`, failures to run
are :class:`~autoplan.bench.timing.BenchError`; progress goes through a callback.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autoplan.bench import collectives as coll
from autoplan.bench import host
from autoplan.bench.micro import MicroPlan, plan_micro, run_micro
from autoplan.bench.presets import Preset, get_preset
from autoplan.bench.timing import BenchError, Row
from autoplan.descriptors.model import Model
from autoplan.errors import InputError, Problem
from autoplan.measured.profile import Profile, achieved, layer_pass_rows, stream_rows
from autoplan.units import MiB

Progress = Callable[[int, int, str], None]  # (cases done, cases in all, the case just done)
TORCH_MISSING = "autoplan bench needs torch: pip install 'autoplan[bench]'"

# torch.cuda.get_device_name -> built-in device descriptor; the first part of the name
# found wins. Only names that identify the part: an H100 PCIe, an H200 NVL or an A100 PCIe
# has other clocks, power or memory than the SXM parts the descriptors describe, so it
# gets none (pass --descriptor to choose).
DESCRIPTORS: tuple[tuple[str, str | None], ...] = (
    ("H100 80GB HBM3", "h100-sxm"),
    ("GB200", "gb200"),  # before B200, which it contains
    ("B200", "b200"),
    ("GB300", "gb300"),  # before B300, which it contains
    ("B300", "b300"),  # torch names the HGX part "NVIDIA B300 SXM6 AC"
    ("H200 NVL", None),  # before H200, which it contains
    ("H200", "h200"),
    ("A100-SXM4-80GB", "a100-80gb"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("MI300X", "mi300x"),
    ("MI250X", "mi250x"),
)


def import_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise BenchError(TORCH_MISSING) from None


def device_kind(requested: str | None) -> str:
    """``cpu`` or ``cuda``; none requested: cuda when a GPU is visible."""
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cpu", "cuda"):
        raise InputError.single("--device", "", f"expected cpu or cuda, got {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", built without CUDA")
        raise InputError.single("--device", "", f"cuda requested but no CUDA device is available ({build})")
    return requested


def world_size(kind: str, requested: int | None) -> int:
    """Ranks of the collectives: torchrun's world, else --world, else 2 on CPU, every GPU on CUDA."""
    import torch

    launch = coll.launched()
    if launch is not None:
        return launch[1]
    if requested is not None and requested < 1:
        raise InputError.single("--world", "", f"expected at least 1 process, got {requested}")
    if kind == "cuda":
        gpus = torch.cuda.device_count()
        if requested is not None and requested > gpus:
            raise InputError.single("--world", "", f"expected at most the {gpus} visible GPUs, "
                                                   f"got {requested}")
        return requested or gpus
    return requested or 2


def resolve_models(refs: Sequence[str]) -> list[Model]:
    """Built-in names or paths; every bad one is reported."""
    from autoplan.descriptors.library import resolve_model

    models: list[Model] = []
    problems: list[Problem] = []
    for ref in refs:
        try:
            models.append(resolve_model(ref, "--model", "model"))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return models


def descriptor_name(kind: str, device_name: str, requested: str | None) -> str | None:
    """The built-in device the profile describes: --descriptor, else the table above (CUDA)."""
    from autoplan.descriptors.library import resolve_device

    if requested is not None:
        return resolve_device(requested, "--descriptor", "").name
    if kind != "cuda":
        return None
    return next((name for part, name in DESCRIPTORS if part in device_name), None)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what the platform module knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _device_name(kind: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if kind == "cuda" else cpu_name()


def _versions(kind: str) -> dict[str, str]:
    import torch

    found = {"torch": torch.__version__, "python": platform.python_version(),
             "platform": platform.platform(), "cpu_count": str(os.cpu_count() or 0),
             "torch_threads": str(torch.get_num_threads())}
    if kind == "cuda":
        found["cuda"] = torch.version.cuda or torch.version.hip or "unknown"
        try:
            found["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError, TypeError):
            found["nccl"] = "unknown"
    return found


def _collectives(preset: Preset, kind: str, world: int, step: Callable[[str], None]) -> coll.Result:
    spec = coll.Spec(device_kind=kind, dtype=preset.collective_dtype, message_bytes=preset.message_bytes,
                     budget=preset.collective_budget, timeout_s=preset.timeout_s,
                     threads=max(1, (os.cpu_count() or 1) // world) if kind == "cpu" else 1,
                     reduce_dtypes=preset.collective_reduce_dtypes)
    if coll.launched() is not None:
        return coll.launched_collectives(spec, step)
    return coll.spawn_collectives(spec, world, step)


def _collective_count(preset: Preset, world: int) -> int:
    spec = coll.Spec(device_kind="cpu", dtype=preset.collective_dtype, message_bytes=preset.message_bytes,
                     budget=preset.collective_budget, timeout_s=preset.timeout_s, threads=1,
                     reduce_dtypes=preset.collective_reduce_dtypes)
    return len(coll.plan_collectives(spec, world, coll.ranks_per_node(world))) if world >= 2 else 0


def is_writer() -> bool:
    """Whether this process keeps the results: always, except torchrun's ranks other than 0."""
    launch = coll.launched()
    return launch is None or launch[0] == 0


def run_bench(*, device: str | None = None, preset: str = "default", models: Sequence[str] | None = None,
              world: int | None = None, descriptor: str | None = None, command: str | None = None,
              progress: Progress | None = None) -> tuple[dict[str, str], list[Row]]:
    """Measure kernels and collectives here; return the profile's header and rows.

    Under torchrun every rank runs the collectives; rank 0 alone then runs the kernels and
    gets the rows (the other ranks get the header and no rows: see :func:`is_writer`).
    """
    import_torch()
    import torch

    kind = device_kind(device)
    chosen = get_preset(preset, kind)
    plan: MicroPlan = plan_micro(chosen, resolve_models(models or chosen.models))
    ranks = world_size(kind, world)
    if kind == "cpu" and "OMP_NUM_THREADS" not in os.environ and coll.launched() is None:
        # the kernels run with the threads each of ``ranks`` validate ranks computes with:
        # the cores shared evenly (OMP_NUM_THREADS, where set, decides instead)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
    name = _device_name(kind)
    meta = _meta(kind, name, descriptor_name(kind, name, descriptor), chosen, ranks, command, plan)
    total = len(plan.cases) + _collective_count(chosen, ranks) + 1  # + the host probe
    done = 0

    def step(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, label)

    if progress is not None:
        progress(0, total, f"starting {ranks} worker processes" if ranks >= 2 else "starting")
    rows: list[Row] = []
    if ranks >= 2:
        result = _collectives(chosen, kind, ranks, step)
        rows += result.rows
        meta.update(_skipped_ops(result.skipped))
    else:
        meta["skipped_collectives"] = f"world size {ranks} (collectives need 2 ranks or more)"
    if not is_writer():
        return meta, []
    rows = run_micro(plan, kind, chosen.budget, step) + rows
    rows += host.measure(kind, chosen.host_budget, "bf16" if kind == "cuda" else "fp32")
    step("host time per kernel (eager layer, forward and backward)")
    return meta, rows


def _skipped_ops(skipped: Mapping[str, str]) -> dict[str, str]:
    if not skipped:
        return {}
    return {"skipped": "; ".join(f"{op} ({why})" for op, why in skipped.items())}


def _meta(kind: str, name: str, descriptor: str | None, preset: Preset, world: int,
          command: str | None, plan: MicroPlan) -> dict[str, str]:
    meta = {"device_kind": kind, "device_name": name}
    if descriptor:
        meta["descriptor"] = descriptor
    meta.update(_versions(kind))
    meta.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command or shlex.join(sys.argv),
        "preset": preset.name,
        "world_size": str(world),
        "backend": "nccl" if kind == "cuda" else "gloo",
        "ranks_per_node": str(coll.ranks_per_node(world)),
    })
    if plan.skipped:
        meta["capped"] = "; ".join(plan.skipped)
    return meta


# -- summary ---------------------------------------------------------------------------------

# nccl-tests' bus bandwidth (doc/PERFORMANCE.md): algorithm bandwidth (nbytes / time) times
# the share of the data each rank must send over its link, so that it compares with the
# link's peak whatever the rank count. nbytes is in profile.py's convention (the all-gather
# output, the reduce-scatter input), which is nccl-tests' "size" for each.
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}


def bus_bandwidth(profile: Profile) -> list[tuple[str, str, int, int, float]]:
    """(op, dtype, ranks, nbytes, bus bytes/s) per collective op and dtype at its largest
    group and size."""
    rows = profile.of_kind("collective")
    out = []
    for op in coll.OPS:
        for dtype in sorted(set(rows.loc[rows["op"] == op, "dtype"])):
            mine = rows[(rows["op"] == op) & (rows["dtype"] == dtype)]
            top = mine.sort_values(["ranks", "nbytes"]).iloc[-1]
            n, nbytes = int(top["ranks"]), int(top["nbytes"])
            out.append((op, dtype, n, nbytes, nbytes / float(top["seconds"]) * BUS_FACTOR[op](n)))
    return out


def largest_memory_Bps(profile: Profile) -> float:
    """Bytes/s of the fastest elementwise op at each op's largest size (on a CPU, the small
    sizes run from the caches; the largest are the closest to memory bandwidth)."""
    rows = stream_rows(profile.rows)
    top = rows.sort_values("nbytes").groupby(["op", "dtype"]).tail(1)
    return float((top["nbytes"] / top["seconds"]).max())


def summary(profile: Profile) -> list[tuple[str, str]]:
    """Rows per kind, the best rates, and the collectives' bus bandwidth at the largest size."""
    lines = [(f"{kind} rows", str(len(profile.of_kind(kind))))
             for kind in ("gemm", "attention", "elementwise", "collective")]
    best = achieved(profile)
    lines += [(f"best GEMM {dt} TFLOP/s", f"{rate / 1e12:.3g}")
              for dt, rate in sorted(best.gemm_flops.items())]
    if best.attention_flops:
        lines.append(("best attention TFLOP/s", f"{best.attention_flops / 1e12:.3g}"))
    if best.memory_Bps:
        lines.append(("best memory GB/s", f"{best.memory_Bps / 1e9:.3g}"))
        lines.append(("memory GB/s, largest tensors", f"{largest_memory_Bps(profile) / 1e9:.3g}"))
    layer = layer_pass_rows(profile.rows)
    if not layer.empty:  # what the cost model counts of the passes, over their eager time
        top = layer.sort_values("nbytes").iloc[-1]
        lines.append((f"eager layer passes GB/s ({int(top['seq'])} tokens)",
                      f"{top['nbytes'] / top['seconds'] / 1e9:.3g}"))
    lines += [(f"{op} {dtype} bus GB/s ({n} ranks, {nbytes / MiB:g} MiB)", f"{bw / 1e9:.3g}")
              for op, dtype, n, nbytes, bw in bus_bandwidth(profile)]
    host = profile.of_kind("host")
    lines += [(f"host us per kernel, {r['op'].removeprefix('layer_')} ({r['k']} kernels)",
               f"{r['seconds'] * 1e6:.3g}") for r in host.to_dict("records")]
    return lines

