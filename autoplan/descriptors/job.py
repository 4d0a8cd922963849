"""What is being trained: batch, sequence and precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Dtype

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

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"global_batch": self.global_batch, "seq_len": self.seq_len,
                               "dtype": self.dtype.value}
        if self.moe_imbalance != DEFAULT_MOE_IMBALANCE:
            out["moe_imbalance"] = self.moe_imbalance
        return out



def read_job(f: Fields) -> Job | None:
    before = len(f.problems)
    values = dict(
        global_batch=f.int("global_batch", min=1, max=MAX_GLOBAL_BATCH),
        seq_len=f.int("seq_len", min=1, max=MAX_SEQ_LEN),
        dtype=f.enum("dtype", Dtype, Dtype.BF16),
        moe_imbalance=f.float("moe_imbalance", DEFAULT_MOE_IMBALANCE, min=1.0),
    )
    f.close()
    if len(f.problems) > before:
        return None
    return Job(**values)
