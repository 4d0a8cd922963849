"""What is being trained: batch, sequence and precision."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from autoplan.descriptors.precision import STATE_FIELDS, StatePrecision, read_states, resolved
from autoplan.descriptors.strict import Fields, shown
from autoplan.vocab import TRAINING_DTYPES, Dtype, MasterWeights, StateDtype, ZeroStage

# The capacity factor at which Switch Transformer drops almost no tokens (Fedus et al.
# 2022, Sec. 2.2 and Table 1): the busiest expert takes about 1.25x its fair share.
DEFAULT_MOE_IMBALANCE = 1.25
# Limits past any run: 16.7M sequences a step (Llama 3 405B: 2,048 to 16,384), 16.7M tokens
# a sequence (the longest published contexts: 10M). Refused at loading, not searched.
MAX_GLOBAL_BATCH = 1 << 24
MAX_SEQ_LEN = 1 << 24
SAMPLES = 4096  # document lengths a distribution is read at (kernels/packing.py)
MAX_BINS = 4096  # histogram bins


@dataclass(frozen=True, slots=True)
class Documents:
    """A document-length distribution: ``fixed`` (every document ``length`` tokens),
    ``lognormal`` (median ``length``, log-space standard deviation ``sigma``) or
    ``histogram`` (``bins``: (length, weight) pairs)."""

    kind: str
    length: float = 0.0
    sigma: float = 0.0
    bins: tuple[tuple[int, float], ...] = ()
    source: str = field(default="", compare=False)  # where a histogram was read from

    def to_dict(self) -> dict[str, object]:
        if self.kind == "fixed":
            return {"fixed": int(self.length)}
        if self.kind == "lognormal":
            return {"lognormal": {"median": self.length, "sigma": self.sigma}}
        return {"histogram": [[n, w] for n, w in self.bins]}

    def lengths(self) -> list[int]:
        """``SAMPLES`` lengths at the distribution's quantiles, in a fixed shuffled order."""
        if self.kind == "fixed":
            out = [max(1, round(self.length))] * SAMPLES
        elif self.kind == "lognormal":
            out = [max(1, round(self.length * math.exp(self.sigma * _normal_quantile((i + 0.5) / SAMPLES))))
                   for i in range(SAMPLES)]
        else:
            total = sum(w for _, w in self.bins)
            shares = [(n, SAMPLES * w / total) for n, w in self.bins]
            counts = [(n, math.floor(x)) for n, x in shares]
            left = SAMPLES - sum(c for _, c in counts)
            # largest remainders take the rest (deterministic: ties by length)
            order = sorted(range(len(shares)), key=lambda i: (-(shares[i][1] % 1), shares[i][0]))
            extra = set(order[:left])
            out = [n for i, (n, c) in enumerate(counts) for _ in range(c + (i in extra))]
        random.Random(0).shuffle(out)
        return out


def _normal_quantile(q: float) -> float:
    """The standard normal's q-quantile: bisection on erf to machine precision."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    global_batch: int  # sequences per optimizer step
    seq_len: int  # tokens per sequence
    dtype: Dtype = Dtype.BF16
    # tokens the busiest expert-parallel rank receives over the mean (dropless routing)
    moe_imbalance: float = DEFAULT_MOE_IMBALANCE
    # gradients accumulated and reduced in (Megatron-LM --grad-reduce-in-bf16; fp32 is its
    # default for bf16 training), the optimizer's master weights (vocab.MasterWeights) and
    # Adam's moments (the precision-aware optimizer, --use-precision-aware-optimizer
    # --exp-avg-dtype/--exp-avg-sq-dtype; NeMo 1.x optim.dtype). None: as the plan's stack
    # keeps them (``Stack.states``; descriptors/precision.py), which a plan resolves
    # (``Plan.states``)
    main_grads: StateDtype | None = None
    optimizer_states: StateDtype | None = None
    master_weights: MasterWeights | None = None
    # the documents packed into each sequence (kernels/packing.py); None: every sequence
    # is one document of seq_len tokens
    documents: Documents | None = None

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def state_fields(self) -> tuple[StateDtype | None, MasterWeights | None, StateDtype | None]:
        """(main_grads, master_weights, optimizer_states) as the job sets them (None:
        its stack's): what a search keys the states of its jobs on (one stack each)."""
        return self.main_grads, self.master_weights, self.optimizer_states

    def states_at(self, defaults: StatePrecision, zero: ZeroStage) -> StatePrecision:
        """The states it keeps on a stack keeping ``defaults``, at ``zero``
        (``precision.resolved``)."""
        return resolved(self.main_grads, self.master_weights, self.optimizer_states, defaults,
                        self.dtype, zero)

    def to_dict(self, states: dict[str, str] | None = None) -> dict[str, Any]:
        """The job-file mapping. ``states``: the states to write (a plan's,
        ``precision.written_states``); None: those the job sets."""
        out: dict[str, Any] = {"global_batch": self.global_batch, "seq_len": self.seq_len,
                               "dtype": self.dtype.value}
        if self.moe_imbalance != DEFAULT_MOE_IMBALANCE:
            out["moe_imbalance"] = self.moe_imbalance
        if states is None:
            states = {k: v.value for k, v in zip(STATE_FIELDS, self.state_fields, strict=True)
                      if v is not None}
        for key in STATE_FIELDS:
            if key in states:
                out[key] = states[key]
        if self.documents is not None:
            out["documents"] = self.documents.to_dict()
        return out



def read_job(f: Fields) -> Job | None:
    before = len(f.problems)
    values = dict(
        global_batch=f.int("global_batch", min=1, max=MAX_GLOBAL_BATCH),
        seq_len=f.int("seq_len", min=1, max=MAX_SEQ_LEN),
        dtype=_read_dtype(f),
        # the busiest rank takes at most every token: at most ep x the mean (ep <= 2^14)
        moe_imbalance=f.float("moe_imbalance", DEFAULT_MOE_IMBALANCE, min=1.0, max=1 << 14),
        **read_states(f),
        documents=_read_documents(f, f.raw("documents", None)),
    )
    f.close()
    if len(f.problems) > before:
        return None
    if values["dtype"] is Dtype.FP16 and values["main_grads"] is StateDtype.BF16:
        f.fail("main_grads", "bf16 gradients go with bf16 or fp8 training, not fp16 "
               "(fp16 keeps fp16 gradients and an fp32 copy: Megatron-LM's distributed optimizer)")
        return None
    if values["dtype"] is Dtype.FP16 and values["master_weights"] is MasterWeights.REMAINDERS:
        f.fail("master_weights", "int16 remainders complete bf16 weights (apex "
               "DistributedFusedAdam store_param_remainders), not fp16 ones: fp32 or none")
        return None
    return Job(**values)


def _read_dtype(f: Fields) -> Dtype | None:
    """``dtype``: a training precision (:data:`autoplan.vocab.TRAINING_DTYPES`); a serving
    one (fp4) refused saying what it is for, others as any unknown choice."""
    raw = f.raw("dtype", None)
    serving = next((d for d in Dtype if not d.trains and isinstance(raw, str)
                    and raw.lower() == d.value), None)
    if serving is not None:
        choices = " | ".join(d.value for d in TRAINING_DTYPES)
        f.fail("dtype", f"expected one of {choices}, got {serving.value}: {serving.value} GEMMs are "
                        f"a serving precision (autoplan serve --weights {serving.value}), not a "
                        "training one")
        return None
    return f.enum("dtype", Dtype, Dtype.BF16, members=TRAINING_DTYPES)


MAX_SIGMA = 5.0  # a log-space spread past this puts documents past any sequence at both ends


def _read_documents(f: Fields, raw: Any) -> Documents | None:
    """``documents: {fixed: N} | {lognormal: {median, sigma}} | {histogram: [[length,
    weight], ...] | PATH}`` (a CSV of ``length,count`` rows); every problem recorded on
    ``f`` under ``documents``."""
    if raw is None:
        return None
    kinds = ("fixed", "lognormal", "histogram")
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in kinds:
        f.fail("documents", "expected one of {fixed: LENGTH}, {lognormal: {median, sigma}}, "
                            "{histogram: [[length, weight], ...] or a CSV path}")
        return None
    kind, value = next(iter(raw.items()))
    d = f.child("documents", raw)
    if kind == "fixed":
        n = d.int("fixed", min=1, max=MAX_SEQ_LEN)
        d.close()
        return None if n is None else Documents("fixed", length=float(n))
    if kind == "lognormal":
        ln = d.child("lognormal", d.raw("lognormal"))
        median = ln.float("median", positive=True, max=MAX_SEQ_LEN)
        sigma = ln.float("sigma", min=0.0, max=MAX_SIGMA)
        ln.close()
        d.close()
        return None if median is None or sigma is None else Documents("lognormal", length=median,
                                                                      sigma=sigma)
    d.raw("histogram")
    d.close()
    source = ""
    if isinstance(value, str):
        source = value
        value = _histogram_file(f, value)
        if value is None:
            return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BINS:
        f.fail("documents.histogram", f"expected 1 to {MAX_BINS} [length, weight] pairs or a CSV path")
        return None
    bins = []
    for i, pair in enumerate(value):
        ok = (isinstance(pair, list | tuple) and len(pair) == 2
              and all(isinstance(x, int | float) and not isinstance(x, bool) for x in pair))
        if ok:
            n, w = pair
            ok = (float(n).is_integer() and 1 <= n <= MAX_SEQ_LEN and math.isfinite(w) and 0 <= w <= 1e15)
        if not ok:
            f.fail(f"documents.histogram[{i}]", f"expected [length, weight]: a whole length from 1 "
                                                f"to {MAX_SEQ_LEN} and a weight from 0, got {shown(pair)}")
            return None
        bins.append((int(n), float(w)))
    if not sum(w for _, w in bins) > 0:
        f.fail("documents.histogram", "expected a weight above 0 somewhere")
        return None
    return Documents("histogram", bins=tuple(sorted(bins)), source=source)


def _numeric(cell: str) -> bool:
    """Whether a CSV cell is meant as a number (Python reads it as one: 1e2, -5, 2_5,
    inf), valid or not: a row of them is data, never a header."""
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _histogram_file(f: Fields, path: str) -> list[list[float]] | None:
    """A histogram CSV (``length,count`` per row; a first row with no number in it is a
    header) as [length, weight] pairs. A relative path is read beside the job file
    (``f.source``) where the file is there, as a model or cluster file a job file names
    (``library.beside``). A row that is numbers but not a whole
    length from 1 to MAX_SEQ_LEN and a count from 0 is refused, naming the file and row."""
    import csv
    import io

    from autoplan.descriptors.library import beside
    from autoplan.descriptors.strict import decimal, read_limited
    from autoplan.errors import InputError

    try:
        text = read_limited(beside(path, f.source), 1 << 20, "a histogram CSV of length,count rows",
                            source=f.source, field=f.key_path("documents.histogram"),
                            label=path).decode("utf-8")
    except InputError as exc:
        f.problems.extend(exc.problems)
        return None
    except UnicodeDecodeError:
        f.fail("documents.histogram", f"{shown(path)}: not UTF-8 text")
        return None
    out: list[list[float]] = []
    first = True
    for i, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not any(cells):
            continue  # a blank line
        if first and not any(_numeric(c) for c in cells):
            first = False
            continue  # the header: words, no number
        first = False
        n, w = (decimal(c) for c in (cells + ["", ""])[:2])
        if not (n is not None and w is not None and n.is_integer() and 1 <= n <= MAX_SEQ_LEN
                and 0 <= w <= 1e15):
            f.fail("documents.histogram", f"{shown(path)}: row {i}: expected length,count: a "
                                          f"whole length from 1 to {MAX_SEQ_LEN:,} and a count "
                                          f"from 0, got {shown(','.join(row))}")
            return None
        out.append([n, w])
        if len(out) > MAX_BINS:
            f.fail("documents.histogram", f"{shown(path)}: more than {MAX_BINS} rows")
            return None
    return out
