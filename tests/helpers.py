"""Small builders shared by tests."""

from __future__ import annotations

from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.model import Model
from autoplan.plan import Layout, Plan
from autoplan.vocab import CpComm, Dtype, Recompute, Schedule, ZeroStage


def make_plan(model: str | Model = "llama3-8b", cluster: str = "dgx-h100", gpus: int = 8,
              global_batch: int = 64, seq_len: int = 4096, dtype: Dtype = Dtype.BF16,
              dp: int = 8, tp: int = 1, pp: int = 1, cp: int = 1, vpp: int = 1,
              micro_batch: int = 1, schedule: Schedule = Schedule.ONE_F_ONE_B,
              recompute: Recompute = Recompute.NONE, zero: ZeroStage = ZeroStage.OPTIMIZER,
              sequence_parallel: bool = False, stages: tuple[int, ...] | None = None,
              ep: int = 1, etp: int = 0, cp_comm: CpComm = CpComm.RING,
              moe_imbalance: float = 1.25) -> Plan:
    return Plan(
        model=model if isinstance(model, Model) else resolve_model(model),
        cluster=with_gpus(resolve_cluster(cluster), gpus),
        job=Job(global_batch=global_batch, seq_len=seq_len, dtype=dtype,
                moe_imbalance=moe_imbalance),
        layout=Layout(dp=dp, tp=tp, pp=pp, cp=cp, vpp=vpp, ep=ep, etp=etp),
        micro_batch=micro_batch, schedule=schedule, recompute=recompute, zero=zero,
        sequence_parallel=sequence_parallel, stages=stages, cp_comm=cp_comm,
    )
