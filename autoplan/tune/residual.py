"""What measured runs say about a new plan's step time: a random forest of the ratio
measured / predicted over features of the plan and of its prediction, fitted on a runs log
(``evaluate --runs``). Where the profile's learned correction (autoplan/measured/surrogate.py)
corrects kernels and collectives by shape, this corrects whole steps by what the runs share
with the plan: its layout, its micro-batching, and where its predicted time goes (compute,
each communication, the bubble, the fixed costs), so a run whose time went to pipeline
bubbles speaks for a plan whose time does too.

The forest (scikit-learn, as the profile's) predicts ln(measured / predicted); the plan's
step time is its prediction times exp of the trees' median, with the 10th and 90th
percentile over the trees as the band. Fewer than ``MIN_RUNS`` measured runs fit nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoplan.cost.evaluate import evaluate
from autoplan.errors import InputError
from autoplan.plan import Plan, Prediction
from autoplan.tune.runs import Run

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


@dataclass(frozen=True, slots=True)
class Residual:
    forest: Any  # sklearn.ensemble.RandomForestRegressor
    runs: int
    source: str

    def band(self, plan: Plan, pred: Prediction) -> tuple[float, float, float]:
        """(10th percentile, median, 90th percentile) of the step time over the trees."""
        import numpy as np

        x = np.array([features(plan, pred)])
        per_tree = np.array([tree.predict(x)[0] for tree in self.forest.estimators_])
        p10, p50, p90 = np.percentile(per_tree, [10, 50, 90])
        return tuple(pred.step_time_s * math.exp(float(v)) for v in (p10, p50, p90))  # type: ignore[return-value]

    def to_dict(self, plan: Plan, pred: Prediction) -> dict[str, Any]:
        p10, p50, p90 = self.band(plan, pred)
        return {"step_time_s": p50, "step_time_s_p10": p10, "step_time_s_p90": p90,
                "runs": self.runs, "runs_log": self.source}


def fit_residual(runs: Sequence[Run], source: str = "runs log", seed: int = 0) -> Residual:
    """The forest of ln(measured / predicted) over the measured runs, each predicted anew
    (as the plans are costed now, on the stack each run names)."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    measured = [r for r in runs if r.ok]
    if len(measured) < MIN_RUNS:
        raise InputError.single(source, "", f"{len(measured)} measured runs: the learned correction "
                                            f"needs at least {MIN_RUNS}")
    x, y = [], []
    for r in measured:
        pred = evaluate(r.plan)
        assert r.measured_step_time_s is not None
        x.append(features(r.plan, pred))
        y.append(math.log(r.measured_step_time_s / pred.step_time_s))
    forest = RandomForestRegressor(n_estimators=64, min_samples_leaf=1, random_state=seed)
    forest.fit(np.array(x), np.array(y))
    return Residual(forest, len(measured), source)
