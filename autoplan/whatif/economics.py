"""What a whole training run on one plan takes: days, GPU-hours, dollars and energy.

A plan's prediction gives the step time; a run of ``train_tokens`` tokens takes
``train_tokens / tokens_per_s`` seconds (the step count need not be whole: the last
step's share is what a token budget buys). From there:

- GPU-hours = GPUs x hours: what a cloud bills, and the cost is that times the
  device's ``price_per_gpu_hour`` (or ``--price``).
- Energy = GPUs x mean board power x time x the cluster's PUE. Within a step a GPU
  runs kernels (compute, exposed communication, the optimizer) at its load power and
  waits (the pipeline bubble, host overhead, an offloaded step) at its idle power, so the mean power is
  ``(busy x load + waiting x idle) / step``, with the split taken from the step's
  breakdown on its critical stage (the cost model's ``TimeBreakdown``, which sums to
  the step time). Load is the datasheet's maximum board power (device files cite it):
  measured training draws 76-82% of it (Newkirk et al. 2025, arXiv:2506.14551), so the
  figure is an upper estimate of the GPUs' share; CPUs, NICs and switches are not
  counted beyond what the PUE factor covers.
- Where the cluster file gives its failure rate and checkpoint storage, the wall clock is
  the training time times the failures' and checkpoints' factor
  (``cost/reliability.py``: Daly's optimum interval and expected wall clock), and
  GPU-hours, cost and energy grow with it (the GPUs are held, and draw their mean power,
  through lost work, restarts and checkpoint stalls alike: an upper estimate).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from autoplan.cost.reliability import Reliability, reliability
from autoplan.plan import Plan, Prediction

SECONDS_PER_DAY = 86_400.0
JOULES_PER_MWH = 3.6e9


class Objective(str, enum.Enum):
    """What a sweep ranks by: days to train, dollars (GPU-hours), or energy."""

    TIME = "time"
    COST = "cost"
    ENERGY = "energy"


@dataclass(frozen=True, slots=True, kw_only=True)
class Economics:
    gpus: int
    step_time_s: float
    tokens_per_s: float
    train_days: float
    gpu_hours: float
    cost_usd: float | None  # None: no price for the device
    energy_mwh: float | None  # None: no power figures for the device
    mean_power_W: float | None  # per GPU, at the board (PUE not applied)
    # failures and checkpoints, where the cluster file describes them (None: the wall
    # clock is the steps alone)
    reliability: Reliability | None = None

    @property
    def goodput(self) -> float | None:
        return None if self.reliability is None else self.reliability.goodput

    def key(self, objective: Objective) -> tuple[float, float]:
        """Smaller is better. Cost ranks by GPU-hours: with one price per GPU-hour
        the order is the same, and it exists without a price."""
        if objective is Objective.TIME:
            return (self.train_days, self.gpu_hours)
        if objective is Objective.COST:
            return (self.gpu_hours, self.train_days)
        assert self.energy_mwh is not None, "the energy objective needs the device's power"
        return (self.energy_mwh, self.train_days)

    @property
    def finishes(self) -> bool:
        """The run ends: its wall clock is finite (failures can make it endless,
        ``Reliability.finishes``)."""
        return math.isfinite(self.train_days)

    def to_dict(self) -> dict[str, object]:
        """Plain values for JSON; a run that never finishes has null days, GPU-hours, cost
        and energy (JSON has no infinity) and its reliability says ``finishes: false``."""
        return {"gpus": self.gpus, "step_time_s": self.step_time_s,
                "tokens_per_s": self.tokens_per_s, "train_days": _finite(self.train_days),
                "gpu_hours": _finite(self.gpu_hours), "cost_usd": _finite(self.cost_usd),
                "energy_mwh": _finite(self.energy_mwh),
                **({"reliability": self.reliability.to_dict()} if self.reliability else {})}


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def mean_power_W(plan: Plan, pred: Prediction) -> float | None:
    """Mean board power of one GPU over a step: load while running kernels, idle while
    waiting in the pipeline bubble or on the host, offload included (see module doc; the
    host CPU's own draw is not counted)."""
    dev = plan.cluster.device
    if dev.power_load_W is None or dev.power_idle_W is None or pred.step_time_s <= 0:
        return None
    step = pred.step_time_s
    waiting = min(step, pred.breakdown.bubble + pred.breakdown.overhead + pred.breakdown.offload)
    return (dev.power_load_W * (step - waiting) + dev.power_idle_W * waiting) / step


def economics(plan: Plan, pred: Prediction, train_tokens: float,
              price_per_gpu_hour: float | None, asynchronous: bool = False) -> Economics:
    """Time, GPU-hours, cost and energy of ``train_tokens`` tokens on ``plan``;
    ``asynchronous``: checkpoints saved behind training (cost/reliability.py)."""
    assert train_tokens > 0 and pred.tokens_per_s > 0
    gpus = plan.cluster.gpus
    fails = reliability(plan, asynchronous)
    seconds = train_tokens / pred.tokens_per_s * (fails.wall_factor if fails else 1.0)
    gpu_hours = gpus * seconds / 3600.0
    power = mean_power_W(plan, pred)
    return Economics(
        gpus=gpus,
        step_time_s=pred.step_time_s,
        tokens_per_s=pred.tokens_per_s,
        train_days=seconds / SECONDS_PER_DAY,
        gpu_hours=gpu_hours,
        cost_usd=None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour,
        energy_mwh=(None if power is None
                    else gpus * power * seconds * plan.cluster.pue / JOULES_PER_MWH),
        mean_power_W=power,
        reliability=fails,
    )
