"""What measured runs say about a new plan's step time: a random forest of the ratio
measured / predicted over features of the plan and of its prediction, fitted on a runs log
(``evaluate --runs``). Where the profile's learned correction (autoplan/measured/surrogate.py)
corrects kernels and collectives by shape, this corrects whole steps by what the runs share
with the plan: its layout, its micro-batching, and where its predicted time goes (compute,
each communication, the bubble, the fixed costs), so a run whose time went to pipeline
bubbles speaks for a plan whose time does too.

Only comparable runs speak for a plan: runs on the same device (the cluster's device, by
name). What measured / predicted is off by is mostly the device's (its kernels' real
rates, its links) and what ran on it; runs on an H100 say nothing of a CPU, so a forest is
fitted for each device the runs ran on, and a plan on a device with fewer than
``MIN_RUNS`` measured runs gets no correction: :meth:`Residual.why_not` says why, and
:meth:`Residual.band` refuses it rather than correct it with another device's runs.

The forest (scikit-learn, as the profile's) predicts ln(measured / predicted); the plan's
step time is its prediction times exp of the trees' median, with the 10th and 90th
percentile over the trees as the band. Each distinct plan is predicted once and is one
sample of the forest: its runs' mean ln(measured / predicted), weighed by its number of
runs (a plan's repeats are not independent plans), so a log of 10^5 runs of a few plans
fits as fast as one of a few runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoplan.cost.evaluate import evaluate
from autoplan.errors import InputError
from autoplan.plan import Plan, Prediction
from autoplan.tune.runs import Run, distinct_plans

MIN_RUNS = 3
FEATURES = ("ln dp", "ln tp", "ln pp", "ln cp", "ln ep", "ln vpp", "ln micro_batch", "ln microbatches",
            "ln tokens per GPU", "compute share", "communication share", "bubble share",
            "fixed share")


def features(plan: Plan, pred: Prediction) -> list[float]:
    """The plan's features (``FEATURES``): its degrees and batch shape on a log scale, and
    the shares of its predicted step."""
    lay, b = plan.layout, pred.breakdown
    step = max(pred.step_time_s, 1e-12)
    comm = b.tp_comm + b.cp_comm + b.ep_comm + b.pp_comm + b.dp_comm
    fixed = b.optimizer + b.overhead + b.offload
    tokens = plan.job.global_batch * plan.job.seq_len / lay.gpus
    return [math.log(lay.dp), math.log(lay.tp), math.log(lay.pp), math.log(lay.cp), math.log(lay.ep),
            math.log(lay.vpp), math.log(plan.micro_batch), math.log(plan.num_microbatches),
            math.log(tokens), (b.compute + b.recompute) / step, comm / step, b.bubble / step,
            fixed / step]


def comparable_key(plan: Plan) -> str:
    """What a run must share with a plan to speak for it (module doc): its device."""
    return plan.cluster.device.name


@dataclass(frozen=True, slots=True)
class Residual:
    forests: dict[str, tuple[Any, int]]  # device -> (sklearn RandomForestRegressor, measured runs)
    source: str
    measured: dict[str, int]  # device -> measured runs, those too few to fit included

    @property
    def runs(self) -> int:
        """Measured runs the forests were fitted on."""
        return sum(n for _, n in self.forests.values())

    def runs_for(self, plan: Plan) -> int:
        """Measured runs that speak for ``plan`` (0: none comparable)."""
        found = self.forests.get(comparable_key(plan))
        return 0 if found is None else found[1]

    def why_not(self, plan: Plan) -> str | None:
        """Why the runs make no correction for ``plan`` (no comparable run), or None."""
        key = comparable_key(plan)
        if key in self.forests:
            return None
        others = ", ".join(f"{n} on {d}" for d, n in sorted(self.measured.items()) if d != key)
        mine = self.measured.get(key, 0)
        return (f"{mine} measured runs on {key}, the plan's device (the learned correction "
                f"needs at least {MIN_RUNS} on the same device)"
                + (f"; the runs ran on other devices ({others})" if others else ""))

    def band(self, plan: Plan, pred: Prediction) -> tuple[float, float, float]:
        """(10th percentile, median, 90th percentile) of the step time over the trees of the
        plan's device's forest; refused (naming the runs log) where no run is comparable."""
        import numpy as np

        if (why := self.why_not(plan)) is not None:
            raise InputError.single(self.source, "", f"no correction for {plan.model.name} on "
                                    f"{comparable_key(plan)}: {why}")
        forest, _ = self.forests[comparable_key(plan)]
        x = np.array([features(plan, pred)])
        per_tree = np.array([tree.predict(x)[0] for tree in forest.estimators_])
        p10, p50, p90 = np.percentile(per_tree, [10, 50, 90])
        return tuple(pred.step_time_s * math.exp(float(v)) for v in (p10, p50, p90))  # type: ignore[return-value]

    def to_dict(self, plan: Plan, pred: Prediction) -> dict[str, Any]:
        p10, p50, p90 = self.band(plan, pred)
        return {"step_time_s": p50, "step_time_s_p10": p10, "step_time_s_p90": p90,
                "runs": self.runs_for(plan), "runs_log": self.source,
                "device": comparable_key(plan)}


def fit_residual(runs: Sequence[Run], source: str = "runs log", seed: int = 0) -> Residual:
    """A forest of ln(measured / predicted) for each device with at least ``MIN_RUNS``
    measured runs, each distinct plan predicted anew (as plans are costed now, on the stack
    each run names); refused where no device has that many."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    measured = [r for r in runs if r.ok]
    by_device: dict[str, list[Run]] = {}
    for r in measured:
        by_device.setdefault(comparable_key(r.plan), []).append(r)
    counts = {d: len(rs) for d, rs in by_device.items()}
    forests: dict[str, tuple[Any, int]] = {}
    for device, mine in sorted(by_device.items()):
        if len(mine) < MIN_RUNS:
            continue
        plans, of = distinct_plans(r.plan for r in mine)
        preds = [evaluate(p) for p in plans]
        sums = [0.0] * len(plans)
        weight = [0] * len(plans)
        for r, j in zip(mine, of, strict=True):
            assert r.measured_step_time_s is not None
            sums[j] += math.log(r.measured_step_time_s / preds[j].step_time_s)
            weight[j] += 1
        x = np.array([features(p, pred) for p, pred in zip(plans, preds, strict=True)])
        y = np.array([s / w for s, w in zip(sums, weight, strict=True)])
        forest = RandomForestRegressor(n_estimators=64, min_samples_leaf=1, random_state=seed)
        forest.fit(x, y, sample_weight=np.array(weight, dtype=float))
        forests[device] = (forest, len(mine))
    if not forests:
        shown = ", ".join(f"{n} on {d}" for d, n in sorted(counts.items())) or "none"
        raise InputError.single(source, "", f"{len(measured)} measured runs ({shown}): the learned "
                                            f"correction needs at least {MIN_RUNS} on one device")
    return Residual(forests, source, counts)
