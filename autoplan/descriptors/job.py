"""What is being trained: batch, sequence and precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    global_batch: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    dtype: Dtype = Dtype.BF16

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {"global_batch": self.global_batch, "seq_len": self.seq_len, "dtype": self.dtype.value}


def read_job(f: Fields) -> Job | None:
    before = len(f.problems)
    values = dict(
        global_batch=f.int("global_batch", min=1),
        seq_len=f.int("seq_len", min=1),
        dtype=f.enum("dtype", Dtype, Dtype.BF16),
    )
    f.close()
    if len(f.problems) > before:
        return None
    return Job(**values)
