"""What is being trained: batch, sequence and precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Dtype, StateDtype

# The capacity factor at which Switch Transformer drops almost no tokens (Fedus et al.
# 2022, Sec. 2.2 and Table 1): the busiest expert takes about 1.25x its fair share.
DEFAULT_MOE_IMBALANCE = 1.25
# Limits past any run: 16.7M sequences a step (Llama 3 405B: 2,048 to 16,384), 16.7M tokens
# a sequence (the longest published contexts: 10M). Refused at loading, not searched.
MAX_GLOBAL_BATCH = 1 << 24
MAX_SEQ_LEN = 1 << 24


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    global_batch: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    dtype: Dtype = Dtype.BF16
    # tokens the busiest expert-parallel rank receives over the mean (dropless routing)
    moe_imbalance: float = DEFAULT_MOE_IMBALANCE
    # gradients accumulated and reduced in (Megatron-LM --grad-reduce-in-bf16; fp32 is its
    # default for bf16 training), and Adam's moments kept in (the precision-aware optimizer,
    # --use-precision-aware-optimizer --exp-avg-dtype/--exp-avg-sq-dtype); the master
    # weights stay fp32 either way
    main_grads: StateDtype = StateDtype.FP32
    optimizer_states: StateDtype = StateDtype.FP32

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"global_batch": self.global_batch, "seq_len": self.seq_len,
                               "dtype": self.dtype.value}
        if self.moe_imbalance != DEFAULT_MOE_IMBALANCE:
            out["moe_imbalance"] = self.moe_imbalance
        if self.main_grads is not StateDtype.FP32:
            out["main_grads"] = self.main_grads.value
        if self.optimizer_states is not StateDtype.FP32:
            out["optimizer_states"] = self.optimizer_states.value
        return out



def read_job(f: Fields) -> Job | None:
    before = len(f.problems)
    values = dict(
        global_batch=f.int("global_batch", min=1, max=MAX_GLOBAL_BATCH),
        seq_len=f.int("seq_len", min=1, max=MAX_SEQ_LEN),
        dtype=f.enum("dtype", Dtype, Dtype.BF16),
        # the busiest rank takes at most every token: at most ep x the mean (ep <= 2^14)
        moe_imbalance=f.float("moe_imbalance", DEFAULT_MOE_IMBALANCE, min=1.0, max=1 << 14),
        main_grads=f.enum("main_grads", StateDtype, StateDtype.FP32),
        optimizer_states=f.enum("optimizer_states", StateDtype, StateDtype.FP32),
    )
    f.close()
    if len(f.problems) > before:
        return None
    if values["dtype"] is Dtype.FP16 and values["main_grads"] is StateDtype.BF16:
        f.fail("main_grads", "bf16 gradients go with bf16 or fp8 training, not fp16 "
               "(fp16 keeps fp16 gradients and an fp32 copy: Megatron-LM's distributed optimizer)")
        return None
    return Job(**values)
