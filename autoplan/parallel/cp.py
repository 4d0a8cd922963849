"""Context parallel: the sequence split over cp ranks, exchanged by ring attention
(Liu et al. 2023) or all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023): rules, the
degrees and exchanges the search tries, and the exposed exchange per layer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from autoplan.kernels import comm
from autoplan.kernels.compute import LayerTimes
from autoplan.kernels.layer import BF16_BYTES, Shard
from autoplan.parallel.common import Rule, Scope, capped_divisors
from autoplan.vocab import CpComm

if TYPE_CHECKING:
    from autoplan.descriptors.hardware import Cluster
    from autoplan.descriptors.model import Model
    from autoplan.descriptors.space import SearchSpace
    from autoplan.plan import Layout, Plan


# ----------------------------------------------------------------------------- rules

def _seq_len(plan: Plan) -> str | None:
    cp, seq = plan.layout.cp, plan.job.seq_len
    if seq % cp or (cp > 1 and seq % (2 * cp)):
        return (f"2*cp = {2 * cp} must divide seq_len={seq} "
                "(causal load balancing splits the sequence in 2*cp chunks)")
    return None


def a2a_head_split(model: Model, lay: Layout, replicate_kv: bool = True) -> tuple[int, int] | None:
    """(query heads, kv heads) per TP rank when the all-to-all cannot split them over
    cp; None when it can. ``replicate_kv``: a cp that is a multiple of the kv heads is
    taken too, each replicated (``SearchSpace.a2a_replicates_kv``)."""
    heads = model.heads // lay.tp if model.heads >= lay.tp else 1
    kv = model.kv_heads // lay.tp if model.kv_heads >= lay.tp else 1
    if heads % lay.cp or (kv % lay.cp and (not replicate_kv or lay.cp % kv)):
        return heads, kv
    return None


def _a2a_heads(plan: Plan) -> str | None:
    lay = plan.layout
    if lay.cp == 1 or plan.cp_comm is not CpComm.A2A or _seq_len(plan):
        return None
    split = a2a_head_split(plan.model, lay)
    if split is None:
        return None
    heads, kv = split
    return (f"all-to-all context parallelism splits heads over cp: cp={lay.cp} "
            f"must divide the {heads} query heads per TP rank and divide (or "
            f"be a multiple of) its {kv} key-value heads")


RULES = (
    Rule("cp-seq-len", "layout.cp", Scope.LAYOUT,
         "2*cp must divide seq_len (causal load balancing)", _seq_len),
    Rule("cp-a2a-heads", "cp_comm", Scope.CP_COMM,
         "all-to-all context parallelism needs cp to divide the heads per TP rank", _a2a_heads),
)


# ----------------------------------------------------------------------------- degrees

def degrees(rest: int, space: SearchSpace) -> Iterator[int]:
    """cp dividing the ``rest`` of the GPUs, up to the space's cap."""
    return iter(capped_divisors(rest, space.cp_max))


def exchanges(model: Model, lay: Layout, seq_len: int, space: SearchSpace) -> tuple[CpComm, ...]:
    """Exchanges to try: none to choose without CP; the all-to-all only where the
    sequence splits (``cp-seq-len``) and cp divides the heads each TP rank holds."""
    if lay.cp == 1:
        return (CpComm.RING,)
    a2a = (seq_len % (2 * lay.cp) == 0
           and a2a_head_split(model, lay, space.a2a_replicates_kv) is None)
    return tuple(c for c in space.cp_comm if c is CpComm.RING or a2a)


# ----------------------------------------------------------------------------- cost terms

def exposed(model: Model, cluster: Cluster, shard: Shard, lt: LayerTimes,
            group: comm.Group) -> tuple[float, float]:
    """Exposed context-parallel communication of one layer, (forward, backward).

    Ring (Liu et al. 2023; Megatron-LM/Transformer Engine p2p with causal load balancing,
    so every step carries equal work): cp - 1 steps, each passing this rank's K and V
    chunk to the next rank while attention runs on the chunk in hand, so a step costs
    max(0, transfer - attention/cp) beyond compute; backward passes K, V and their grads.
    All-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023, Sec. 3.1): Q, K, V are exchanged
    before attention and the output after it, forward and (as their grads) backward,
    with nothing to hide behind."""
    cp, tp = shard.cp, shard.tp
    if cp == 1:
        return 0.0, 0.0
    q, k, v, out = model.attn_widths
    tokens = shard.tokens
    if not shard.cp_ring:  # all-to-all
        qkv = comm.all_to_all(BF16_BYTES * tokens * (q + k + v) / tp, group)
        after = comm.all_to_all(BF16_BYTES * tokens * out / tp, group)
        return qkv + after, qkv + after
    kv_chunk = BF16_BYTES * tokens * (k + v) / tp
    step = comm.p2p(kv_chunk, group.domains > 1, cluster)
    steps = cp - 1
    return (steps * max(0.0, step - lt.attention_forward / cp),
            steps * max(0.0, 2 * step - lt.attention_backward / cp))
