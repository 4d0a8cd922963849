"""A serving plan's autoscaling: the replicas each period of a day's traffic needs, and the
per-replica threshold an autoscaler holds (the plan file's ``autoscale:`` block, written by
``serve --traffic``; :mod:`autoplan.serving.traffic_plan` works it out).

The threshold is a per-replica average an autoscaler compares with its target: the requests
in flight on a replica (running and queued) or the share of its KV cache in use. Both are
taken at the replica's capacity, the highest rate one replica serves while meeting the SLO:
below it a replica holds fewer requests and less cache, so holding the metric under its
value at capacity holds each replica's rate under its capacity.

Kubernetes' HorizontalPodAutoscaler (and KEDA, which drives one) leaves the replicas alone
while the metric is within a tolerance of its target, 10% by default
(kube-controller-manager ``--horizontal-pod-autoscaler-tolerance``; Kubernetes docs,
"Horizontal Pod Autoscaling", Algorithm details): it scales out only once the metric passes
target x 1.1. So ``target`` is the value at capacity over 1.1, and the autoscaler acts
before a replica passes its capacity rather than 10% after.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# the HorizontalPodAutoscaler's default tolerance (module doc)
HPA_TOLERANCE = 0.1


class ScalingMetric(str, enum.Enum):
    """What an autoscaler reads per replica."""

    REQUESTS_IN_FLIGHT = "requests_in_flight"  # running + waiting requests on the replica
    KV_CACHE_USAGE = "kv_cache_usage"  # share of the replica's KV cache in use, 0..1


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingPeriod:
    """One period of the traffic and the replicas it needs."""

    start_h: float  # hours from the traffic's origin
    hours: float
    rate_rps: float  # offered requests/s (a closed loop's: what its clients send at that load)
    replicas: int

    def to_dict(self) -> dict[str, float | int]:
        return {"start_h": self.start_h, "hours": self.hours, "rate_rps": self.rate_rps,
                "replicas": self.replicas}


@dataclass(frozen=True, slots=True, kw_only=True)
class Autoscale:
    """The plan's autoscaling (module doc): replica bounds, the metric and its per-replica
    target, the figures at capacity the target comes from, and each period's replicas."""

    min_replicas: int
    max_replicas: int
    metric: ScalingMetric
    target: float  # per replica: the metric's value at capacity / (1 + HPA_TOLERANCE)
    capacity_rps: float  # per replica, meeting the SLO
    requests_in_flight: float  # per replica at capacity
    kv_cache_usage: float  # per replica at capacity, 0..1
    periods: tuple[ScalingPeriod, ...]

    def target_of(self, metric: ScalingMetric) -> float:
        """The per-replica target of either metric (the plan names one; both are known)."""
        at_capacity = (self.requests_in_flight if metric is ScalingMetric.REQUESTS_IN_FLIGHT
                       else self.kv_cache_usage)
        return at_capacity / (1.0 + HPA_TOLERANCE)

    def to_dict(self) -> dict[str, object]:
        return {
            "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
            "metric": self.metric.value, "target": self.target,
            "at_capacity": {"rate_rps": self.capacity_rps, "requests_in_flight": self.requests_in_flight,
                            "kv_cache_usage": self.kv_cache_usage},
            "periods": [p.to_dict() for p in self.periods],
        }
