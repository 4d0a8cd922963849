"""What a serving plan is made of: the engine, the deployment, the workload and the SLO.

Frozen descriptors, validated where they are read (:mod:`autoplan.serving.planfile`) and
trusted here.
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass

from autoplan.descriptors.hardware import Cluster, Device, PooledCluster
from autoplan.descriptors.model import Model
from autoplan.serving.autoscale import Autoscale
from autoplan.serving.engine import Engine, EngineVersion, Resolved, engine_defaults

# a deployment's instances (autoplan.serving.instances), re-exported: plans and their readers
# import them from here
from autoplan.serving.instances import KV_PRECISIONS as KV_PRECISIONS
from autoplan.serving.instances import Deployment as Deployment
from autoplan.serving.instances import Disaggregated as Disaggregated
from autoplan.serving.instances import Pool as Pool
from autoplan.serving.instances import Precision as Precision
from autoplan.serving.instances import SpecMethod as SpecMethod
from autoplan.serving.instances import Speculative as Speculative


def resolved_limits(d: Deployment, engine: Engine, device: Device,
                    version: str | None = None) -> tuple[int, int, bool]:
    """(max_num_seqs, max_batched_tokens, chunked_prefill) as the deployment runs them: its
    own where set, else the engine's defaults at ``version`` (:func:`engine_defaults`)."""
    defaults = engine_defaults(engine, device, version)
    return (d.max_num_seqs or defaults.max_num_seqs, d.max_batched_tokens or defaults.max_batched_tokens,
            defaults.chunked_prefill if d.chunked_prefill is None else d.chunked_prefill)


class Dist(str, enum.Enum):
    FIXED = "fixed"
    LOGNORMAL = "lognormal"
    EXPONENTIAL = "exponential"
    UNIFORM = "uniform"
    TRACE = "trace"  # the lengths of an arrival trace: its mean, low/high its extremes


@dataclass(frozen=True, slots=True)
class Lengths:
    """Token counts of requests: a fixed number or a distribution with that mean."""

    mean: float
    dist: Dist = Dist.FIXED
    sigma: float = 0.0  # lognormal: sigma of the underlying normal
    low: int = 1  # uniform: bounds; every draw is clipped to [1, high] (high 0: none)
    high: int = 0

    def to_dict(self) -> int | dict[str, object]:
        if self.dist is Dist.FIXED and float(self.mean).is_integer():
            return int(self.mean)
        out: dict[str, object] = {"mean": self.mean, "dist": self.dist.value}
        if self.dist is Dist.LOGNORMAL:
            out["sigma"] = self.sigma
        if self.dist is Dist.UNIFORM:
            out.update(low=self.low, high=self.high)
        return out

    @property
    def ceiling(self) -> float:
        """A length no draw exceeds by much (for memory checks): the mean, or the high
        bound, or a lognormal's 99.9th percentile."""
        if self.dist in (Dist.UNIFORM, Dist.TRACE):
            return float(self.high)
        if self.dist is Dist.LOGNORMAL:
            return self.mean * math.exp(3.09 * self.sigma - self.sigma**2 / 2)
        if self.dist is Dist.EXPONENTIAL:
            return self.mean * 6.9
        return self.mean


class ArrivalKind(str, enum.Enum):
    RATE = "rate"  # Poisson arrivals at rate_rps
    CONCURRENCY = "concurrency"  # closed loop: a new request as soon as one finishes
    OFFLINE = "offline"  # every request queued at time 0
    TRACE = "trace"  # recorded requests: arrival times and lengths from a CSV file


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Recorded requests, sorted by arrival (``planfile.read_trace`` reads the CSV).
    Compared and hashed by identity: a trace can hold a million rows."""

    path: str  # the file, absolute (plan files write it relative to themselves)
    arrival_s: tuple[float, ...]  # from the first request's arrival (which is 0)
    input_len: tuple[int, ...]
    output_len: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.arrival_s)

    def lengths(self, which: tuple[int, ...]) -> Lengths:
        """The trace's lengths as a summary: their mean, and their extremes for the checks
        that need the longest request (:attr:`Lengths.ceiling`)."""
        return Lengths(sum(which) / len(which), Dist.TRACE, low=min(which), high=max(which))

    @property
    def mean_rate_rps(self) -> float:
        span = self.arrival_s[-1] - self.arrival_s[0]
        return (len(self) - 1) / span if span > 0 else math.inf


@dataclass(frozen=True, slots=True)
class Arrival:
    kind: ArrivalKind
    rate_rps: float = 0.0
    concurrency: int = 0
    trace: Trace | None = None  # TRACE only

    def to_dict(self, relative_to: str | None = None) -> str | dict[str, float | int | str]:
        """``relative_to``: a trace's path is written relative to this folder (the plan
        file's), so plan and trace can move together."""
        if self.kind is ArrivalKind.OFFLINE:
            return "offline"
        if self.kind is ArrivalKind.RATE:
            return {"rate_rps": self.rate_rps}
        if self.kind is ArrivalKind.TRACE:
            assert self.trace is not None
            path = self.trace.path
            if relative_to is not None:
                path = os.path.relpath(path, relative_to)
            return {"trace": path}
        return {"concurrency": self.concurrency}

    def label(self) -> str:
        if self.kind is ArrivalKind.OFFLINE:
            return "offline"
        if self.kind is ArrivalKind.RATE:
            return f"{self.rate_rps:g} req/s"
        if self.kind is ArrivalKind.TRACE:
            assert self.trace is not None
            return (f"trace {os.path.basename(self.trace.path)} ({len(self.trace):,} requests, "
                    f"{self.trace.mean_rate_rps:.3g} req/s mean)")
        return f"concurrency {self.concurrency}"


@dataclass(frozen=True, slots=True)
class Prefix:
    """Prompts that begin with a shared prefix (a system prompt, a chat's history, an agent's
    tools), for prefix caching (vLLM's automatic prefix caching, SGLang's RadixAttention,
    TensorRT-LLM's KV block reuse): ``share`` of the mean prompt is a prefix shared by the
    requests of its group, and requests fall into ``groups`` such groups in turn. A request
    whose group's prefix is computed skips it in prefill (in whole KV blocks of the engine's
    ``kv_block_tokens``, its last prompt token always computed), and each group's prefix is
    cached once in the KV cache while it fits there beside the requests: the engines evict
    unused prefixes, least recently used first (``scheduler.KVPool``), so sharing never
    takes room the requests need, and many groups only find theirs cached less often."""

    share: float
    groups: int = 1

    def tokens(self, mean_prompt: float) -> int:
        """The prefix's length: ``share`` of the mean prompt, in whole tokens."""
        return int(self.share * mean_prompt)

    def to_dict(self) -> dict[str, float | int]:
        return {"share": self.share, "groups": self.groups}

    def label(self) -> str:
        groups = f" in {self.groups:,} groups" if self.groups > 1 else ""
        return f"{self.share:.0%} shared prefix{groups}"


def prefix_hit(prefix_tokens: int, prompt: int, block: int) -> int:
    """Tokens of a ``prompt`` a warm prefix cache serves: the prefix in whole blocks, at most
    all of the prompt's whole blocks but its last token (vLLM V1's ``get_computed_blocks``
    leaves the last token to compute, for its logits)."""
    return min(prefix_tokens, prompt - 1) // block * block


@dataclass(frozen=True, slots=True)
class Workload:
    input_len: Lengths  # a trace's: its summary (Trace.lengths)
    output_len: Lengths
    arrival: Arrival
    requests: int = 1000
    prefix: Prefix | None = None  # shared prompt prefixes (prefix caching)
    # multimodal requests: images each request carries and the language-model tokens each
    # becomes (its patches merged: Model.vision), prompt tokens beside input_len's text;
    # a vision encoder runs over them before the prefill (0: text only)
    images_per_request: int = 0
    tokens_per_image: int = 0

    @property
    def image_tokens(self) -> int:
        """Prompt tokens a request's images add to its text (``input_len``)."""
        return self.images_per_request * self.tokens_per_image

    @property
    def prompt_ceiling(self) -> float:
        """The longest prompt, its images' tokens with its text."""
        return self.input_len.ceiling + self.image_tokens

    def to_dict(self, relative_to: str | None = None) -> dict[str, object]:
        out: dict[str, object]
        if self.arrival.kind is ArrivalKind.TRACE:  # the trace holds the lengths
            out = {"arrival": self.arrival.to_dict(relative_to), "requests": self.requests}
        else:
            out = {"input_len": self.input_len.to_dict(), "output_len": self.output_len.to_dict(),
                   "arrival": self.arrival.to_dict(), "requests": self.requests}
        if self.prefix is not None:
            out["prefix"] = self.prefix.to_dict()
        if self.images_per_request:
            out.update(images_per_request=self.images_per_request, tokens_per_image=self.tokens_per_image)
        return out

    @property
    def prefix_tokens(self) -> int:
        """The shared prefix's length (0: none)."""
        return 0 if self.prefix is None else self.prefix.tokens(self.input_len.mean)

    @classmethod
    def of_trace(cls, trace: Trace, requests: int | None = None, prefix: Prefix | None = None,
                 images: tuple[int, int] = (0, 0)) -> Workload:
        """The trace's first ``requests`` requests (all of them by default); ``images``:
        (images per request, tokens per image)."""
        n = len(trace) if requests is None else requests
        assert 1 <= n <= len(trace)
        return cls(trace.lengths(trace.input_len[:n]), trace.lengths(trace.output_len[:n]),
                   Arrival(ArrivalKind.TRACE, trace=trace), n, prefix, *images)


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    percentile: float = 99.0

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def to_dict(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.ttft_ms is not None:
            out["ttft_ms"] = self.ttft_ms
        if self.tpot_ms is not None:
            out["tpot_ms"] = self.tpot_ms
        out["percentile"] = self.percentile
        return out


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """What a serving plan file holds (without its prediction)."""

    model: Model
    cluster: Cluster
    engine: Engine
    deployment: Deployment
    workload: Workload
    slo: Slo
    # the engine release the plan names (None: the engine's default line, the newest
    # fitted; serving.engine); checked where the plan is read
    engine_version: str | None = None
    # the replicas a day's traffic needs and the threshold an autoscaler holds (``serve
    # --traffic``; None: a fixed deployment). With it the cluster holds the most replicas,
    # its nodes whole (serving.planfile)
    autoscale: Autoscale | None = None
    # a heterogeneous cluster whose pools the disaggregated sides run on (their
    # ``prefill_on`` / ``decode_on``); ``cluster`` is then the decode side's pool
    pools: PooledCluster | None = None

    def cluster_of(self, side: str) -> Cluster:
        """The cluster the ``prefill`` or ``decode`` side runs on: its pool of ``pools``, or
        the plan's one cluster."""
        dis = self.deployment.disaggregated
        name = "" if dis is None else dis.prefill_on if side == "prefill" else dis.decode_on
        if self.pools is None or not name:
            return self.cluster
        return self.pools.pools[self.pools.index(name)]

    @property
    def engine_resolved(self) -> Resolved:
        """The release and the line of the engine's table that predicts it."""
        return self.engine.spec.resolve(self.engine_version)

    @property
    def engine_line(self) -> EngineVersion:
        """The engine's release line the plan is predicted with."""
        return self.engine_resolved.line

    @property
    def engine_release(self) -> str:
        """The release the plan runs: the one it names, else the default line's."""
        return self.engine_resolved.release

    @property
    def max_model_len(self) -> int:
        """The longest request the engine is told to take: the workload's longest prompt
        and output, within the model's context."""
        w = self.workload
        return min(self.model.max_seq_len, math.ceil(w.prompt_ceiling + w.output_len.ceiling))

    @property
    def nodes_per_replica(self) -> int:
        """Nodes one replica spans: 1, or whole nodes (the exports refuse the rest)."""
        return max(1, self.deployment.gpus_per_replica // self.cluster.gpus_per_node)
