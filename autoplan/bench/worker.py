"""One rank of ``autoplan validate``: ``python -m autoplan.bench.worker SPEC.json RANK``.

The parent (:mod:`autoplan.bench.validate`) writes the spec (the plan as a plan-file
mapping and how to run it) and starts one such process per rank; each writes
``rank<R>.json`` beside the spec: its step times and peak memory, or the error that
stopped it. Nothing here prints; a failure is a JSON ``error`` and exit status 1.

Each rank runs ``warmup`` untimed steps, one memory step, one more untimed step and
``steps`` timed ones.

Peak memory on CPU: the process starts with the C allocator returning memory at once
(the parent sets ``MALLOC_MMAP_THRESHOLD_=65536`` and ``MALLOC_TRIM_THRESHOLD_=131072``:
every tensor of 64 KiB or more is its own mmap, unmapped when freed), so the resident set
follows the bytes alive. Before the memory step the heap is trimmed (``malloc_trim``) and
the resident-set high-water mark reset (``5`` to /proc/self/clear_refs); the peak is
VmHWM over the resident set taken after the process group came up and before the model
was built. It counts every tensor of the step (fp32 parameter shards, bf16 gathered
weights, gradients, optimizer states, activations, pipeline receive buffers,
communication buffers) to the page; not the interpreter, torch's libraries or gloo's
startup. Where /proc cannot be reset the peak is ``getrusage``'s (process lifetime). On
CUDA (slice mode): ``max_memory_allocated`` over the memory step.

Time: wall time of a whole step (every microbatch's forward and backward, the gradient
reduction, the optimizer step), after a barrier of all ranks. Before the timed steps the
allocator is switched to keep what it frees (``mallopt``: no mmap, no trimming), as a
GPU's caching allocator does, from a heap whose pages are touched once beforehand (as
many bytes as the memory step's peak, at most 1.5 GiB): otherwise large tensors land on
fresh pages whose faults (here a virtual machine's, ~0.3 GB/s) cost more than the kernels
on them, which a GPU never pays.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoplan.units import GiB, KiB

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4


def _status_kib(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB


def peak_rss_bytes() -> int:
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KiB  # Linux reports KiB


def start_memory_window() -> str:
    """Reset the resident-set high-water mark (after trimming the C heap); say over what."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        if _status_kib("VmHWM") is not None:
            return "one step after the warm-up"
    except OSError:
        pass
    return "the process lifetime (getrusage)"


POOL_MAX = 3 * GiB // 2  # glibc trims a free heap top over M_TRIM_THRESHOLD (an int: < 2 GiB)


def use_caching_allocator(pool_bytes: int) -> bool:
    """From now on keep freed memory for reuse instead of returning it, in a heap of
    ``pool_bytes`` whose pages are touched once here (see the module docstring): a GPU
    caching allocator's reserved memory. False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        ok = bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
        size = min(pool_bytes, POOL_MAX)
        block = libc.malloc(ctypes.c_size_t(size)) if ok and size > 0 else None
        if block:
            ctypes.memset(block, 0, size)
            libc.free(block)
        return ok
    except (OSError, AttributeError):
        return False


def main(argv: list[str]) -> int:
    spec_path, rank = Path(argv[0]), int(argv[1])
    out_path = spec_path.parent / f"rank{rank}.json"
    try:
        spec = json.loads(spec_path.read_text())
        result = run_rank(spec, rank)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        out_path.write_text(json.dumps({"rank": rank, "error": message,
                                        "traceback": traceback.format_exc(), "time": time.time()}))
        return 1
    out_path.write_text(json.dumps(result))
    return 0


def run_rank(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(int(spec["threads"]))
    if spec.get("cpus") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(spec["cpus"][rank]))
    if spec.get("slice"):
        return _run_slice(spec)
    return _run_distributed(spec, rank)


def _timed(spec: dict[str, Any], step: Callable[[int], float], barrier: Callable[[], None],
           peak: Callable[[], int], baseline: int) -> dict[str, Any]:
    """Warm-up, the memory step, one more warm-up with the caching allocator, the timed
    steps; ``step(i)`` returns its own time."""
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    times = []
    for i in range(warmup):
        barrier()
        times.append(step(i))
    barrier()
    window = spec["memory_window"]()
    barrier()
    step(warmup)
    peak_bytes = peak() - baseline
    caching = use_caching_allocator(0 if spec.get("device") == "cuda" else peak_bytes)
    for i in range(warmup + 1, warmup + 2 + steps):
        barrier()
        times.append(step(i))
    return {"step_times_s": times[warmup + 1:], "warmup_times_s": times[:warmup + 1],
            "peak_memory_bytes": peak_bytes, "baseline_bytes": baseline, "peak_window": window,
            "caching_allocator": caching}


# --------------------------------------------------------------------------- distributed

def _run_distributed(spec: dict[str, Any], rank: int) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    from autoplan.plans.file import read_plan

    plan = read_plan(spec["plan"], "<validate spec>", correct=False)  # run, not predicted
    world = plan.layout.gpus
    store = dist.FileStore(spec["store"], world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(spec["collective_timeout_s"])))
    try:
        return _train(spec, plan, rank)
    finally:
        dist.destroy_process_group()


def _train(spec: dict[str, Any], plan: Any, rank: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from autoplan.bench import torch_model as tm
    from autoplan.schedules.orders import stage_chunks

    lay, model = plan.layout, plan.model
    fsdp = tm.fsdp_settings(plan.zero, lay.dp)
    mesh = init_device_mesh("cpu", (lay.pp, fsdp.replicate, fsdp.shard, lay.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    stage = mesh["pp"].get_local_rank()
    dp_index = mesh["dp_replicate"].get_local_rank() * fsdp.shard + mesh["dp_shard"].get_local_rank()
    tp_rank = mesh["tp"].get_local_rank()
    tm.preload(torch.device("cpu"))
    dist.barrier()
    baseline = rss_bytes()

    layers = tm.chunk_layers(plan.stage_layers, lay.pp, lay.vpp, plan.chunks)
    n_virtual = lay.pp * lay.vpp
    chunk_ids = stage_chunks(plan.schedule, lay.pp, lay.vpp, stage)
    # dp > 1: FSDP2 keeps fp32 parameters and casts them to bf16 (torch_model.FsdpSettings);
    # dp = 1: bf16 parameters with Megatron-LM's fp32 main gradients, master weights and
    # Adam moments (torch_model.RankStates): nothing to reduce or shard
    use_fsdp = lay.dp > 1
    chunks = []
    for vid in chunk_ids:
        with torch.device("meta"), tm.default_dtype(torch.float32 if use_fsdp else torch.bfloat16):
            chunk = tm.Chunk(model, layers[vid], first=vid == 0, last=vid == n_virtual - 1,
                             tied=model.tied_embeddings and n_virtual == 1)
        if lay.tp > 1:
            tm.apply_tp(chunk, mesh["tp"], plan.sequence_parallel)
        tm.apply_recompute(chunk, plan.recompute)
        if use_fsdp:
            tm.apply_fsdp(chunk, mesh["dp_replicate", "dp_shard"], fsdp)
        chunk.to_empty(device="cpu")
        tm.init_weights(chunk, 17 + vid)
        chunk.train()
        chunks.append(chunk)

    params = [p for c in chunks for p in c.parameters()]
    if use_fsdp:
        optimizer = tm.adamw(params)

        def optimizer_step() -> dict[str, int]:
            optimizer.step()
            held = tm.state_bytes(chunks, optimizer)
            optimizer.zero_grad(set_to_none=True)
            return held
    else:
        rank_states = tm.RankStates(params, plan.zero, 1)

        def optimizer_step() -> dict[str, int]:
            held = rank_states.bytes()
            rank_states.step()
            return held

    loss_fn = tm.make_loss(mesh["tp"].get_group(), tp_rank, lay.tp, model.vocab)
    m, b, s = plan.num_microbatches, plan.micro_batch, plan.job.seq_len

    if lay.pp > 1:
        from torch.distributed.pipelining import PipelineStage

        stages = [PipelineStage(c, vid, n_virtual, torch.device("cpu"), group=mesh["pp"].get_group())
                  for c, vid in zip(chunks, chunk_ids, strict=True)]
        schedule = tm.make_schedule(plan.schedule, stages, m, loss_fn)
        holds_first, holds_last = 0 in chunk_ids, n_virtual - 1 in chunk_ids

        def microbatches(tokens: torch.Tensor, targets: torch.Tensor) -> None:
            args = (tokens,) if holds_first else ()
            kwargs: dict[str, Any] = {"target": targets, "losses": []} if holds_last else {}
            schedule.step(*args, return_outputs=False, **kwargs)
            if holds_last:
                tm.check_finite(kwargs["losses"][-1])
    else:
        root: Any = chunks[0]  # an FSDPModule when dp > 1

        def microbatches(tokens: torch.Tensor, targets: torch.Tensor) -> None:
            for i in range(m):
                last = i == m - 1
                if use_fsdp:  # ZeRO-2 keeps parameters gathered over the microbatches
                    root.set_requires_gradient_sync(last or fsdp.sync_every_microbatch)
                    root.set_reshard_after_backward(last or fsdp.reshard_after_forward)
                rows = slice(i * b, (i + 1) * b)
                loss = loss_fn(root(tokens[rows]), targets[rows]) / m
                loss.backward()
            tm.check_finite(loss)

    states: dict[str, int] = {}

    def step(i: int) -> float:
        tokens, targets = tm.random_batch(model.vocab, m * b, s, tm.seeds(dp_index, i))
        t0 = time.perf_counter()
        microbatches(tokens, targets)
        states.update(optimizer_step())
        return time.perf_counter() - t0

    spec = {**spec, "memory_window": start_memory_window}
    result = _timed(spec, step, lambda: dist.barrier(), peak_rss_bytes, baseline)
    return {**result, "rank": rank, "stage": stage, "dp_index": dp_index, "tp_rank": tp_rank,
            "chunks": chunk_ids, "layers": [layers[v] for v in chunk_ids], "state_bytes": states,
            "threads": torch.get_num_threads()}


# --------------------------------------------------------------------------- slice

def _run_slice(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank's share of the plan, no communication (see validate.py's module docstring):
    the chunks of pipeline stage ``spec['stage']`` at one TP rank's widths (dp rank 0, tp
    rank 0), the stage's operation order from autoplan's schedule, and the states a rank
    keeps under Megatron-LM's distributed optimizer: bf16 weights, an fp32 main-gradient
    buffer (the rank's 1/d shard of it under ZeRO-2) and fp32 master weights and Adam
    moments (1/d under ZeRO-1 and 2)."""
    import torch

    from autoplan.bench import torch_model as tm
    from autoplan.plans.file import read_plan
    from autoplan.schedules.orders import stage_chunks, stage_orders

    plan = read_plan(spec["plan"], "<validate spec>", correct=False)  # run, not predicted
    lay, stage = plan.layout, int(spec["stage"])
    cuda = spec["device"] == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(0)
    tm.preload(device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated() if cuda else rss_bytes()

    local = tm.tp_local_model(plan.model, lay.tp)
    layers = tm.chunk_layers(plan.stage_layers, lay.pp, lay.vpp, plan.chunks)
    n_virtual = lay.pp * lay.vpp
    chunk_ids = stage_chunks(plan.schedule, lay.pp, lay.vpp, stage)
    chunks = []
    for vid in chunk_ids:
        with torch.device(device), tm.default_dtype(torch.bfloat16):
            chunk = tm.Chunk(local, layers[vid], first=vid == 0, last=vid == n_virtual - 1,
                             tied=plan.model.tied_embeddings and n_virtual == 1 and lay.tp == 1)
            tm.init_weights(chunk, 17 + vid)
        tm.use_standins(chunk, lay.tp, plan.sequence_parallel)
        tm.apply_recompute(chunk, plan.recompute)
        chunk.train()
        chunks.append(chunk)
    states = tm.RankStates([p for c in chunks for p in c.parameters()], plan.zero, lay.dp * lay.cp)
    loss_fn = tm.make_loss(None, 0, 1, local.vocab)
    m, b, s = plan.num_microbatches, plan.micro_batch, plan.job.seq_len
    seq_local = s // lay.tp if plan.sequence_parallel else s
    order = stage_orders(plan.schedule, lay.pp, m, lay.vpp)[stage]

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step(i: int) -> float:
        gen = torch.Generator(device=device).manual_seed(i)
        held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        sync()
        t0 = time.perf_counter()
        for kind, j, c in order:
            vid, chunk = chunk_ids[c], chunks[c]
            if kind == "F":
                if vid == 0:
                    x = torch.randint(0, local.vocab, (b, s), device=device, generator=gen)
                else:
                    x = torch.randn(b, seq_local, local.hidden, device=device, dtype=torch.bfloat16,
                                    generator=gen, requires_grad=True)
                out = chunk(x)
                if vid == n_virtual - 1:
                    target = torch.randint(0, local.vocab, (b, s), device=device, generator=gen)
                    held[(j, c)] = (loss_fn(out, target) / m, None)
                else:
                    held[(j, c)] = (out, torch.randn(out.shape, device=device, dtype=out.dtype,
                                                     generator=gen))
            else:  # "B": the whole backward (split schedules are refused in slice mode)
                out, grad = held.pop((j, c))
                out.backward(grad)
        sync()
        elapsed = time.perf_counter() - t0
        states.step()
        sync()
        return elapsed

    if cuda:
        def peak() -> int:
            return int(torch.cuda.max_memory_allocated())

        def window() -> str:
            torch.cuda.reset_peak_memory_stats()
            return "one step after the timed ones (torch.cuda.max_memory_allocated)"
    else:
        peak, window = peak_rss_bytes, start_memory_window
    result = _timed({**spec, "memory_window": window}, step, sync, peak, baseline)
    return {**result, "rank": 0, "stage": stage, "chunks": chunk_ids,
            "layers": [layers[v] for v in chunk_ids], "state_bytes": states.bytes(),
            "threads": torch.get_num_threads(),
            "slice_widths": {"heads": local.heads, "kv_heads": local.kv_heads,
                             "ffn_hidden": local.ffn_hidden, "vocab": local.vocab,
                             "hidden": local.hidden, "seq_tokens": seq_local},
            "slice_layers": sum(len(layers[v]) for v in chunk_ids)}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
