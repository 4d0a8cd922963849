"""A run's wall clock on a cluster that fails: checkpoints, their optimal interval, lost
work and restarts, and the goodput left (the share of the wall clock that is training).

A plan's step time is not the run's wall clock. At 16,384 H100 the Llama 3 run saw 419
unexpected interruptions in 54 days (Llama 3 paper, Sec. 3.3.4), one every ~3 hours: each
costs the work since the last checkpoint and a restart, and each checkpoint costs a stall.
Where a cluster file gives ``reliability`` and ``storage`` (descriptors/hardware.py):

- **The checkpoint** is the model's states, once: its weights in the training dtype and
  the optimizer's fp32 master weights and Adam moments (the bytes per parameter of
  ``kernels.memory``; gradients are not saved). It is written and read fully in parallel,
  each distinct piece once and spread over every node (Megatron-Core's
  ``--ckpt-fully-parallel-save``/``-load``, on by default; PyTorch DCP's planner dedups
  replicated tensors): D / min(the file system's bandwidth, nodes x a node's), and no
  faster than each rank's own states leave its GPU over its host link.
- **The stall**: a synchronous save stops training for the write. An asynchronous one
  (Megatron-Core ``--async-save``, torchtitan ``checkpoint.async_mode``) stops it only for
  the copy of each rank's own states to host memory, over its host link (its shard: a rank
  that holds the whole optimizer, ZeRO-0, copies more than one holding 1/dp of it), and
  the write runs behind training, so checkpoints can be no closer than the write takes.
- **A failure** arrives as a Poisson process of rate failures per GPU-hour x GPUs (mean
  time between failures M); it costs the restart (``restart_minutes``: detection,
  rescheduling, start) plus the checkpoint's load, R, and the work since the last
  checkpoint.
- **The interval** between checkpoints is Daly's higher-order optimum (J. T. Daly, "A
  higher order estimate of the optimum checkpoint interval for restart dumps", Future
  Generation Computer Systems 22(3), 2006, Eq. 37), which refines Young's sqrt(2 delta M)
  (J. W. Young, CACM 17(9), 1974); and the expected wall clock per unit of work is Daly's
  Eq. 20, exact for exponential failures: (M / tau) e^(R/M) (e^((tau + delta)/M) - 1).
  Goodput is its inverse.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from autoplan.cost.stage import stage_work
from autoplan.kernels import memory
from autoplan.parallel import dp
from autoplan.plan import Plan
from autoplan.vocab import ZeroStage


@dataclass(frozen=True, slots=True, kw_only=True)
class Reliability:
    """What failures and checkpoints cost a run on one plan."""

    mtbf_s: float  # mean time between failures of the whole job
    checkpoint_bytes: float  # one checkpoint: the model's states, once
    write_s: float  # its write (and read) over the file system
    stall_s: float  # training stopped per checkpoint (the write, or the copy to host)
    restart_s: float  # per failure: the restart and the checkpoint's load
    interval_s: float  # training between checkpoints
    asynchronous: bool
    wall_factor: float  # wall clock over training time (>= 1; infinite: never finishes)

    @property
    def goodput(self) -> float:
        """The share of the wall clock that is training (0 where the run never finishes)."""
        return 1.0 / self.wall_factor

    @property
    def finishes(self) -> bool:
        """The expected wall clock is finite: failures leave training some time between
        the restarts and checkpoints (``wall_factor``)."""
        return math.isfinite(self.wall_factor)

    def to_dict(self) -> dict[str, float | bool]:
        return {"mtbf_hours": self.mtbf_s / 3600, "checkpoint_gib": self.checkpoint_bytes / 2**30,
                "checkpoint_write_s": self.write_s, "checkpoint_stall_s": self.stall_s,
                "restart_s": self.restart_s, "checkpoint_interval_s": self.interval_s,
                "asynchronous": self.asynchronous, "goodput": self.goodput,
                "finishes": self.finishes}


def young_interval(delta: float, mtbf: float) -> float:
    """Young's first-order optimum checkpoint interval, sqrt(2 delta M) (Young 1974)."""
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum (Daly 2006, Eq. 37): for delta < 2M,
    sqrt(2 delta M) [1 + sqrt(delta/2M)/3 + (delta/2M)/9] - delta; else M."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def wall_factor(interval: float, delta: float, restart: float, mtbf: float) -> float:
    """Expected wall clock per second of training (Daly 2006, Eq. 20, exponential
    failures): (M / tau) e^(R/M) (e^((tau + delta)/M) - 1); infinite where that passes the
    largest float (the run never finishes: failures come faster than a checkpoint and a
    restart, e.g. R/M past 709).

    Summed as logarithms, log(M/tau) + R/M + log(e^x - 1) with x = (tau + delta)/M, so no
    factor overflows on its way to a finite product (log(e^x - 1) = x + log(1 - e^-x)
    past x = 1, ``math.log(math.expm1(x))`` below it, exact at small x)."""
    assert interval > 0 and delta >= 0 and restart >= 0 and mtbf > 0
    x = (interval + delta) / mtbf
    growth = x + math.log(-math.expm1(-x)) if x > 1 else math.log(math.expm1(x))
    log_factor = math.log(mtbf) - math.log(interval) + restart / mtbf + growth
    return math.exp(log_factor) if log_factor < _LOG_FLOAT_MAX else math.inf


_LOG_FLOAT_MAX = math.log(sys.float_info.max)


def checkpoint_bytes(plan: Plan) -> float:
    """The model's states, once: its weights in the training dtype and the optimizer's
    master weights and moments (``kernels.memory.sharded_state_bytes`` of the whole model
    on one rank, gradients left out)."""
    whole = memory.sharded_state_bytes(plan.model.params_total, plan.job.dtype, ZeroStage.NONE, 1,
                                       plan.states)
    return whole.weights + whole.optimizer


def rank_state_bytes(plan: Plan) -> float:
    """The most any rank holds of the checkpoint: its stage's weights and its share of the
    optimizer states (on the host where they are offloaded)."""
    most = 0.0
    for work in stage_work(plan):
        states = dp.state_bytes(plan, work.params, work.expert_params)
        host = dp.host_state_bytes(plan, work.params, work.expert_params)
        most = max(most, states.weights + states.optimizer + host)
    return most


def reliability(plan: Plan, asynchronous: bool = False) -> Reliability | None:
    """Failures and checkpoints of a run on ``plan`` (module doc); None where its cluster
    file gives no reliability and storage."""
    c = plan.cluster
    if not c.fails:
        return None
    assert c.failures_per_gpu_hour is not None and c.storage_Bps is not None
    mtbf = 3600.0 / (c.failures_per_gpu_hour * c.gpus)
    size = checkpoint_bytes(plan)
    bandwidth = c.storage_Bps if c.storage_node_Bps is None else min(
        c.storage_Bps, c.nodes * c.storage_node_Bps)
    # every rank's states leave its GPU over its host link on the way to storage
    copy = rank_state_bytes(plan) / c.host_link_Bps if c.host_link_Bps else 0.0
    write = max(size / bandwidth, copy)
    restart = (c.restart_s or 0.0) + write  # the load reads what the write wrote
    if asynchronous:
        assert c.host_link_Bps is not None, "an asynchronous save needs the cluster's host link"
        stall = copy
        # the write runs behind training: the next save waits for it
        interval = max(daly_interval(stall, mtbf), write)
    else:
        stall = write
        interval = daly_interval(stall, mtbf)
    return Reliability(mtbf_s=mtbf, checkpoint_bytes=size, write_s=write, stall_s=stall,
                       restart_s=restart, interval_s=interval, asynchronous=asynchronous,
                       wall_factor=wall_factor(interval, stall, restart, mtbf))


def checkpoint_steps(plan: Plan) -> int | None:
    """Steps between checkpoints at the optimum interval for the plan's cluster (saved
    synchronously), for a launcher's save interval; None where the cluster gives no
    failure rate and storage."""
    from autoplan.cost.evaluate import evaluate

    found = reliability(plan)
    if found is None:
        return None
    return max(1, round(found.interval_s / evaluate(plan).step_time_s))
