"""A deployment's instances, apart from the engine that runs them: their widths (replicas x
TP x PP x attention DP x EP), the precisions of weights and KV cache, the batch limits,
prefill/decode disaggregation and speculative decoding.

Below :mod:`autoplan.serving.engine` (nothing here names an engine), so an engine's facts
that depend on a deployment (:attr:`autoplan.serving.engine.EngineVersion.overlap_off`) take
it typed; :mod:`autoplan.serving.deployment` re-exports every name, where plans read them.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from autoplan.descriptors.model import Model


class Precision(str, enum.Enum):
    """Bytes of a stored weight or KV element; ``compute`` is what its GEMMs run in."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP4 = "fp4"

    @property
    def bytes(self) -> float:
        return {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}[self.value]


KV_PRECISIONS = (Precision.BF16, Precision.FP16, Precision.FP8)


@dataclass(frozen=True, slots=True)
class Pool:
    """One side of a disaggregated deployment: ``replicas`` workers (instances), each of
    ``tp x pp x attention_dp`` GPUs, with the widths an aggregated deployment's replica
    has (:class:`Deployment`): attention tensor parallel ``tp``, ``pp`` pipeline stages,
    ``attention_dp`` attention data-parallel ranks (MoE; each rank its own batch) and the
    experts over ``ep`` of a stage's ``tp x attention_dp`` GPUs (MoE): the widths NVIDIA's
    measured disaggregated runs give each pool's workers (wide-EP decode: tp 1,
    attention_dp and ep 8 to 32)."""

    replicas: int
    tp: int
    pp: int = 1
    attention_dp: int = 1
    ep: int = 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def schedulers(self) -> int:
        """Batches the pool runs at once: per worker one per attention-DP rank and per
        pipeline batch in flight (as :func:`autoplan.serving.evaluate.schedulers_of`)."""
        return self.replicas * self.attention_dp * self.pp

    def label(self) -> str:
        return _shape_label(self.replicas, self.tp, self.pp, self.attention_dp, self.ep)

    def to_dict(self) -> dict[str, int]:
        """The plan file's pool: replicas and tp, and the other widths where not 1 (a pool of
        replicas x tp reads and writes as before they existed)."""
        out = {"replicas": self.replicas, "tp": self.tp}
        out.update({k: v for k, v in (("pp", self.pp), ("attention_dp", self.attention_dp),
                                      ("ep", self.ep)) if v != 1})
        return out


def _shape_label(replicas: int, tp: int, pp: int, attention_dp: int, ep: int) -> str:
    """``2x tp4 pp2 adp8 ep8``: the widths above 1 after replicas and tp."""
    out = f"{replicas}x tp{tp}"
    if pp > 1:
        out += f" pp{pp}"
    if attention_dp > 1:
        out += f" adp{attention_dp}"
    if ep > 1:
        out += f" ep{ep}"
    return out


@dataclass(frozen=True, slots=True)
class Disaggregated:
    """Prefill/decode disaggregation (Zhong et al. 2024 "DistServe"; Patel et al. 2024
    "Splitwise"): prefill instances run each prompt and its first token, hand its KV cache
    to a decode instance, which generates the rest. The prefill pool's GPUs come first.
    ``prefill_on`` / ``decode_on``: the pools of a heterogeneous cluster each side runs on
    (Splitwise's prefill and decode on different GPU generations; ``ServingPlan.pools``),
    empty where the plan has one cluster."""

    prefill: Pool
    decode: Pool
    prefill_on: str = ""
    decode_on: str = ""


class SpecMethod(str, enum.Enum):
    """Where speculative decoding's proposals come from."""

    DRAFT = "draft"  # a smaller model of the same vocabulary (Leviathan et al. 2023)
    EAGLE = "eagle"  # a one-layer head on the target's hidden states (Li et al. 2024 "EAGLE")
    MTP = "mtp"  # the model's own multi-token-prediction module (DeepSeek-V3 Sec. 2.2)
    NGRAM = "ngram"  # prompt lookup: n-grams of the context, no GPU work (vLLM's "ngram")


@dataclass(frozen=True, slots=True)
class Speculative:
    """Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): each decode iteration
    proposes ``tokens`` tokens per sequence, then the target verifies them in one pass of
    ``tokens + 1`` positions and keeps the accepted prefix plus one token of its own.
    Acceptance is given as ``acceptance_length`` (mean tokens a verify step yields, the
    EAGLE papers' tau) or ``acceptance_rate`` (alpha, each proposed token accepted with that
    probability, independently). ``draft``: the draft model (method draft)."""

    method: SpecMethod
    tokens: int
    acceptance_rate: float | None = None
    acceptance_length: float | None = None
    draft: Model | None = None

    @property
    def mean_tokens(self) -> float:
        """Tokens one verify step yields on average: given, or with per-token acceptance
        alpha, (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, Eq. 1)."""
        if self.acceptance_length is not None:
            return self.acceptance_length
        a, k = self.acceptance_rate or 0.0, self.tokens
        return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"method": self.method.value, "tokens": self.tokens}
        if self.acceptance_length is not None:
            out["acceptance_length"] = self.acceptance_length
        if self.acceptance_rate is not None:
            out["acceptance_rate"] = self.acceptance_rate
        if self.draft is not None:
            out["draft_model"] = self.draft.name
        return out

    def label(self) -> str:
        return f"{self.method.value} k{self.tokens}"


@dataclass(frozen=True, slots=True)
class Deployment:
    """A deployment's instances. With ``disaggregated`` the fields replicas, tp, pp, ep and
    attention_dp are the decode pool's (what reads them sees the instances that hold the
    running batch; :meth:`split` builds it so), and :meth:`pool` gives either pool's
    instances as a deployment of their own."""

    replicas: int
    tp: int
    pp: int = 1
    ep: int = 1  # MoE: experts split over ep of a stage's tp * attention_dp GPUs
    attention_dp: int = 1  # MoE: attention data parallel ranks within a replica (DEP)
    weights: Precision = Precision.BF16
    kv_cache: Precision = Precision.BF16
    max_num_seqs: int | None = None  # None: the engine's default
    max_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    disaggregated: Disaggregated | None = None
    speculative: Speculative | None = None

    @classmethod
    def split(cls, prefill: Pool, decode: Pool, on: tuple[str, str] = ("", ""),
              **rest: object) -> Deployment:
        """A disaggregated deployment of these pools, its own widths the decode pool's;
        ``on``: the cluster pools the prefill and decode sides run on (a heterogeneous
        cluster's); ``rest``: the precisions and batch limits both pools run."""
        return cls(replicas=decode.replicas, tp=decode.tp, pp=decode.pp, ep=decode.ep,
                   attention_dp=decode.attention_dp,
                   disaggregated=Disaggregated(prefill, decode, on[0], on[1]),
                   **rest)  # type: ignore[arg-type]

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def gpus(self) -> int:
        if self.disaggregated is not None:
            return self.disaggregated.prefill.gpus + self.disaggregated.decode.gpus
        return self.replicas * self.gpus_per_replica

    def pool(self, side: str) -> Deployment:
        """The ``prefill`` or ``decode`` pool's instances, with their widths and this
        deployment's precisions and batch limits."""
        assert self.disaggregated is not None
        p = self.disaggregated.prefill if side == "prefill" else self.disaggregated.decode
        return dataclasses.replace(self, replicas=p.replicas, tp=p.tp, pp=p.pp, ep=p.ep,
                                   attention_dp=p.attention_dp, disaggregated=None)

    def label(self) -> str:
        if self.disaggregated is not None:
            dis = self.disaggregated
            at_p = f" @{dis.prefill_on}" if dis.prefill_on else ""
            at_d = f" @{dis.decode_on}" if dis.decode_on else ""
            return f"P {dis.prefill.label()}{at_p} + D {dis.decode.label()}{at_d}"
        out = _shape_label(self.replicas, self.tp, self.pp, self.attention_dp, self.ep)
        if self.speculative is not None:
            out += f" {self.speculative.label()}"
        return out
