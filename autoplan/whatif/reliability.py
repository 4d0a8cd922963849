"""A run's wall clock on a cluster that fails: its home is :mod:`autoplan.cost.reliability`
(on the cost floor, where a Plan's figures are worked out, so the exporters read its
checkpoint interval without importing the what-if package). Its names stay importable here.
"""

from __future__ import annotations

from autoplan.cost.reliability import (
    Reliability,
    checkpoint_bytes,
    checkpoint_steps,
    daly_interval,
    rank_state_bytes,
    reliability,
    wall_factor,
    young_interval,
)

__all__ = ["Reliability", "checkpoint_bytes", "checkpoint_steps", "daly_interval", "rank_state_bytes",
           "reliability", "wall_factor", "young_interval"]
