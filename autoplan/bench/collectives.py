"""Collective microbenchmarks with torch.distributed: gloo on CPU, NCCL on CUDA.

Local runs spawn ``world`` worker processes that meet on 127.0.0.1 at a free port (on a CPU
each pinned to its own cores, as ``autoplan validate`` runs its ranks: :func:`pin`); under
torchrun (RANK, WORLD_SIZE and LOCAL_WORLD_SIZE set) the launched processes are the world
and only rank 0 keeps the rows. Each collective runs on the first g ranks for every power
of two g up to the world size (TP-like groups: adjacent ranks). Each timed call starts
after a barrier; a call's time is the slowest rank's (an all-reduce MAX over the ranks of
each call's elapsed time), and the row keeps the median and percentiles over the calls.

``nbytes`` follows :mod:`autoplan.measured.profile` (= :mod:`autoplan.kernels.comm`): the
all-reduce buffer, the all-gather output, the reduce-scatter input, each rank's all-to-all
buffer, the p2p message.

Every op runs in the spec's ``dtype``; the reducing ops (all-reduce, reduce-scatter) also in
each of ``reduce_dtypes``, the dtypes training reduces in: on a CPU gloo sums the buffer on
the rank's own core, and how fast depends on the dtype (torch 2.13's gloo adds bf16
element by element through fp32, about 5x slower per byte than fp32: a tensor-parallel
all-reduce of bf16 activations costs what an fp32 row cannot show).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import queue as queue_mod
import socket
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autoplan.bench.micro import ELEMENT_BYTES
from autoplan.bench.timing import BenchError, Budget, Clock, CpuClock, CudaClock, Row, Step, summarize
from autoplan.units import MiB

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
JOIN_S = 10.0  # seconds a finished worker gets to exit before it is terminated


REDUCING_OPS = ("all_reduce", "reduce_scatter")  # the ops whose cost depends on the dtype summed


@dataclass(frozen=True, slots=True)
class CollectiveCase:
    op: str
    ranks: tuple[int, ...]  # global ranks in the group (p2p: sender, receiver)
    ranks_per_node: int
    nbytes: int
    dtype: str = ""  # "": the spec's dtype

    @property
    def label(self) -> str:
        dtype = f" {self.dtype}" if self.dtype else ""
        return f"{self.op}{dtype} {len(self.ranks)} ranks {self.nbytes / MiB:g} MiB"


@dataclass(frozen=True, slots=True, kw_only=True)
class Spec:
    """What every worker runs (picklable: it crosses to the spawned processes)."""

    device_kind: str
    dtype: str
    message_bytes: tuple[int, ...]
    budget: Budget
    timeout_s: float
    threads: int  # torch threads per worker (CPU: the cores shared among the workers)
    # more dtypes the reducing ops (REDUCING_OPS) run in, beside ``dtype``
    reduce_dtypes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Result:
    rows: list[Row]
    skipped: dict[str, str]  # op -> why it was not measured


def launched() -> tuple[int, int, int] | None:
    """(rank, world size, ranks per node) when started by torchrun, else None."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")):
        return None
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_WORLD_SIZE"])


def group_sizes(world: int) -> list[int]:
    """Powers of two from 2 up to the world size."""
    return [2**i for i in range(1, int(math.log2(world)) + 1)] if world >= 2 else []


def plan_collectives(spec: Spec, world: int, per_node: int,
                     ops: tuple[str, ...] = OPS) -> list[CollectiveCase]:
    """Every op over every group size and message size in the spec's dtype, and the
    reducing ops again in each of its ``reduce_dtypes``. p2p runs between rank 0 and its
    neighbour, and between rank 0 and the first rank of the next node when there is one."""
    cases = _plan(spec, spec.dtype, world, per_node, ops)
    for dtype in spec.reduce_dtypes:
        if dtype != spec.dtype:
            reducing = tuple(o for o in ops if o in REDUCING_OPS)
            cases += [dataclasses.replace(c, dtype=dtype)
                      for c in _plan(spec, dtype, world, per_node, reducing)]
    return cases


def _plan(spec: Spec, dtype: str, world: int, per_node: int, ops: tuple[str, ...]) -> list[CollectiveCase]:
    cases = []
    for op in ops:
        pairs: list[tuple[tuple[int, ...], int]]
        if op == "p2p":
            pairs = [((0, 1), min(2, per_node))] if world >= 2 else []
            if per_node < world and per_node > 1:
                pairs.append(((0, per_node), 1))
        else:
            pairs = [(tuple(range(g)), min(g, per_node)) for g in group_sizes(world)]
        cases += [CollectiveCase(op, ranks, rpn, _whole(nbytes, op, len(ranks), dtype))
                  for ranks, rpn in pairs for nbytes in spec.message_bytes]
    return cases


def _whole(nbytes: int, op: str, ranks: int, dtype: str) -> int:
    """``nbytes`` rounded down to whole elements, and for the ops that split the buffer
    among the ranks, to whole elements per rank (at least one)."""
    unit = ELEMENT_BYTES[dtype] * (1 if op == "p2p" else ranks)
    return max(unit, nbytes // unit * unit)


def ranks_per_node(world: int) -> int:
    """Ranks on one machine: all of a local world; torchrun's LOCAL_WORLD_SIZE when launched."""
    launch = launched()
    return world if launch is None else launch[2]


# -- inside a worker: the process group is up ----------------------------------------------

@dataclass(frozen=True, slots=True)
class _Ctx:
    torch: Any
    dist: Any
    rank: int
    world: int
    device: Any  # torch.device of this rank's tensors
    clock: Clock
    groups: Mapping[int, Any]  # group size -> process group (None: the default group)

    def barrier(self) -> None:
        if self.device.type == "cuda":
            self.dist.barrier(device_ids=[self.device.index])
            self.torch.cuda.synchronize()
        else:
            self.dist.barrier()

    def all_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum over all ranks."""
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return [float(x) for x in t.tolist()]


def _fn(dist: Any, *names: str) -> Any:
    """The first of ``names`` this torch has (newer releases renamed the tensor variants)."""
    for name in names:
        if hasattr(dist, name):
            return getattr(dist, name)
    raise AttributeError(f"torch.distributed has none of {', '.join(names)}")


def _op_call(case: CollectiveCase, ctx: _Ctx, dtype: str) -> Callable[[], Any] | None:
    """The call this rank makes for one timed iteration (None: not in the group)."""
    torch, dist, rank, g = ctx.torch, ctx.dist, ctx.rank, len(case.ranks)
    if rank not in case.ranks:
        return None
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    numel = case.nbytes // ELEMENT_BYTES[dtype]

    def buf(n: int) -> Any:
        return torch.ones(n, dtype=dt, device=ctx.device)

    group = ctx.groups.get(g)
    if case.op == "all_reduce":
        x = buf(numel)
        return lambda: dist.all_reduce(x, group=group)
    if case.op == "all_gather":  # nbytes: the gathered output
        out, x = buf(numel), buf(numel // g)
        gather = _fn(dist, "all_gather_single", "all_gather_into_tensor")
        return lambda: gather(out, x, group=group)
    if case.op == "reduce_scatter":  # nbytes: the input
        out, x = buf(numel // g), buf(numel)
        scatter = _fn(dist, "reduce_scatter_single", "reduce_scatter_tensor")
        return lambda: scatter(out, x, group=group)
    if case.op == "all_to_all":  # nbytes: each rank's buffer, 1/g to each peer
        out, x = buf(numel), buf(numel)
        return lambda: dist.all_to_all_single(out, x, group=group)
    src, dst = case.ranks
    x = buf(numel)
    return (lambda: dist.send(x, dst)) if rank == src else (lambda: dist.recv(x, src))


def _timed(ctx: _Ctx, call: Callable[[], Any] | None, n: int) -> list[float]:
    """``n`` iterations, each after a barrier; the slowest rank's time per iteration."""
    mine = []
    for _ in range(n):
        ctx.barrier()
        mine.append(ctx.clock.once(call) if call is not None else 0.0)
    return ctx.all_max(mine)


def _measure(case: CollectiveCase, ctx: _Ctx, spec: Spec) -> Row:
    dtype = case.dtype or spec.dtype
    call = _op_call(case, ctx, dtype)
    warm = _timed(ctx, call, max(1, spec.budget.warmup))
    samples = _timed(ctx, call, spec.budget.repeats(warm[-1]))  # the same count on every rank
    return {"kind": "collective", "op": case.op, "dtype": dtype, "nbytes": case.nbytes,
            "ranks": len(case.ranks), "ranks_per_node": case.ranks_per_node,
            **summarize(samples).columns()}


def _supported(ctx: _Ctx, spec: Spec, per_node: int) -> dict[str, str]:
    """Ops this backend cannot run, with the reason, agreed by all ranks (an op that fails
    on any rank is skipped everywhere, so no rank waits on a peer that gave up). Keyed by
    the op (in the spec's dtype), or by "op dtype" for a reducing op in one of the
    ``reduce_dtypes``."""
    backend = ctx.dist.get_backend()
    first: dict[str, CollectiveCase] = {}  # the first case of each key: the smallest buffer
    for case in plan_collectives(spec, ctx.world, per_node):
        first.setdefault(_key(case), case)
    probes = list(first.items())
    why: dict[str, str] = {}
    for key, case in probes:
        try:
            call = _op_call(case, ctx, case.dtype or spec.dtype)
            if call is not None:
                call()
        except (RuntimeError, NotImplementedError, AttributeError, ValueError) as exc:
            why[key] = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    keys = [key for key, _ in probes]
    failed_anywhere = ctx.all_max([1.0 if key in why else 0.0 for key in keys])
    return {key: f"{backend}: {why.get(key, 'failed on another rank')}"[:200]
            for key, failed in zip(keys, failed_anywhere, strict=True) if failed}


def _key(case: CollectiveCase) -> str:
    """How :func:`_supported` names a case's op (and dtype, where not the spec's)."""
    return f"{case.op} {case.dtype}" if case.dtype else case.op


def _groups(dist: Any, world: int) -> dict[int, Any]:
    """One process group per size (every rank creates every group, in the same order)."""
    return {g: (None if g == world else dist.new_group(ranks=list(range(g)))) for g in group_sizes(world)}


def run_rank(rank: int, world: int, per_node: int, spec: Spec, step: Step | None) -> Result:
    """Measure every case on an initialised default process group; every rank returns the
    same rows (the per-call maximum over ranks)."""
    import torch
    import torch.distributed as dist

    assert world >= 2, "collectives need two ranks or more"
    device = torch.device("cuda", torch.cuda.current_device()) if spec.device_kind == "cuda" \
        else torch.device("cpu")
    clock: Clock = CudaClock() if spec.device_kind == "cuda" else CpuClock()
    ctx = _Ctx(torch, dist, rank, world, device, clock, _groups(dist, world))
    skipped = _supported(ctx, spec, per_node)
    rows = []
    for case in plan_collectives(spec, world, per_node):
        if case.op not in skipped and _key(case) not in skipped:
            rows.append(_measure(case, ctx, spec))
        if step is not None:
            step(case.label)
    return Result(rows, skipped)


# -- the local world: spawned workers ------------------------------------------------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(rank: int, threads: int) -> None:
    """Pin this process to its own ``threads`` cores (rank r: the r-th block of them), as
    ``autoplan validate`` pins each rank: gloo's transport threads then share the rank's
    core with its compute (a 1 MiB all-reduce between two pinned single-core ranks took
    3.6 ms here, unpinned 0.7-1.9 ms). Nothing where the blocks do not fit this process's
    cores or the platform cannot pin."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    block = cpus[rank * threads:(rank + 1) * threads]
    if len(block) == threads:
        os.sched_setaffinity(0, block)


def _init(rank: int, world: int, spec: Spec, init_method: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec.threads)
    if spec.device_kind == "cpu":
        pin(rank, spec.threads)
    backend = "nccl" if spec.device_kind == "cuda" else "gloo"
    if spec.device_kind == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec.timeout_s))


def _worker(rank: int, world: int, port: int, spec: Spec, out: Any) -> None:
    """A spawned rank: report progress (rank 0), then the rows or the error, on ``out``."""
    warnings.simplefilter("ignore")  # deprecation chatter from torch would reach the user's terminal
    try:
        import torch.distributed as dist

        _init(rank, world, spec, f"tcp://127.0.0.1:{port}")
        step = (lambda label: out.put(("step", label))) if rank == 0 else None
        result = run_rank(rank, world, world, spec, step)
        dist.destroy_process_group()
        if rank == 0:
            out.put(("result", result))
    except BaseException as exc:  # every failure, KeyboardInterrupt too, goes to the parent
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        out.put(("error", rank, last))
        raise SystemExit(1) from None


def _collect(out: Any, procs: list[Any], limit_s: float, step: Step | None) -> Result:
    """Messages from the workers until rank 0's result; a dead worker or the time limit is an error."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            msg = out.get(timeout=0.2)
        except queue_mod.Empty:
            dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                r, code = dead[0]
                raise BenchError(f"collectives: rank {r} exited with code {code} before reporting "
                                 "(its error, if any, is printed above)") from None
            if time.monotonic() > deadline:
                raise BenchError(f"collectives: the workers did not finish within {limit_s:.0f} s "
                                 "(the preset's timeout)") from None
            continue
        if msg[0] == "step":
            if step is not None:
                step(msg[1])
        elif msg[0] == "error":
            raise BenchError(f"collectives: rank {msg[1]} failed: {msg[2]}")
        else:
            result: Result = msg[1]
            return result


def _reap(procs: list[Any], wait_s: float) -> None:
    """Join every worker; one still running after ``wait_s`` is terminated, then killed."""
    for p in procs:
        if p.pid is None:  # never started
            continue
        p.join(wait_s)
        if p.is_alive():
            p.terminate()
            p.join(JOIN_S)
        if p.is_alive():
            p.kill()
            p.join()


def spawn_collectives(spec: Spec, world: int, step: Step | None = None) -> Result:
    """Run the collectives on ``world`` local worker processes."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")  # fork is unsafe once CUDA or OpenMP threads exist
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, spec, out), daemon=True,
                         name=f"autoplan-bench-rank{r}") for r in range(world)]
    finished = False
    try:
        for p in procs:
            p.start()
        result = _collect(out, procs, spec.timeout_s, step)
        finished = True
        return result
    finally:  # after a failure the other workers may wait on the failed one forever: stop them now
        _reap(procs, JOIN_S if finished else 0.0)
        out.close()


def launched_collectives(spec: Spec, step: Step | None = None) -> Result:
    """Run the collectives in this torchrun-launched process (every rank calls this)."""
    import torch
    import torch.distributed as dist

    launch = launched()
    assert launch is not None
    rank, world, per_node = launch
    owned = not dist.is_initialized()
    if owned:  # threads: as torchrun set them (OMP_NUM_THREADS), for the kernels rank 0 runs next
        if spec.device_kind == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % per_node)))
        dist.init_process_group("nccl" if spec.device_kind == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=spec.timeout_s))
    try:
        return run_rank(rank, world, per_node, spec, step if rank == 0 else None)
    finally:
        if owned:
            dist.destroy_process_group()
