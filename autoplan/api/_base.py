"""What every API function shares: the results' ``to_json`` and DataFrames, descriptors
given as names, paths or objects, the options' checks that typer makes on the command
line (made here too, so a script is refused as the command is), and the words a plan is
named by in tables and on fronts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoplan.errors import InputError
from autoplan.text import json_text

if TYPE_CHECKING:
    import pandas

    from autoplan.plan import Plan, Prediction
    from autoplan.vocab import Dtype

# more plans than anyone reads: past it a search would evaluate every candidate (seconds to
# minutes) to rank plans no table or script uses
MAX_TOP = 1000

# what a long-running function tells of its progress: one line per finished part (a GPU
# count searched, a trial run); the command line shows them on stderr, a script may log them
Progress = Callable[[str], None]


def _nothing(_: str) -> None:
    return None


def told(progress: Progress | None) -> Progress:
    return progress if progress is not None else _nothing


class Result:
    """A result's JSON: ``to_dict()`` is the document ``--format json`` prints for the same
    inputs, ``to_json()`` its text as the command writes it."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_json(self) -> str:
        return json_text(self.to_dict())


def frame(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pandas.DataFrame:
    """``rows`` as a DataFrame with ``columns`` in order (pandas, a core dependency, is
    imported here only: a command that makes no table loads none of it)."""
    import pandas

    return pandas.DataFrame([dict(r) for r in rows], columns=list(columns))


def ref(value: Any) -> Any:
    """A descriptor as the library's resolvers take it: a built-in name or a path as a
    string, a mapping as it is, an object (a Model, a Cluster, a pooled cluster) as its
    mapping (``to_dict``, which reads back to an equal object)."""
    if value is None or isinstance(value, (str, Mapping)):
        return value
    if isinstance(value, Path):
        return str(value)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return value  # refused by the resolver, naming what it is


def path_or_none(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def check_top(top: int, flag: str = "--top", most: int = MAX_TOP) -> int:
    """``--top``'s range, as typer checks it on the command line."""
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= most:
        raise InputError.single(flag, "", f"expected a whole number from 1 to {most}, got {top!r}")
    return top


def check_at_least(flag: str, value: float | None, least: float, most: float = math.inf) -> None:
    """A number option's range, as typer's ``min=``/``max=`` checks it on the command line."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not least <= value <= most:
        bound = f"a value >= {least:g}" + (f" and <= {most:g}" if math.isfinite(most) else "")
        raise InputError.single(flag, "", f"expected {bound}, got {value!r}")


def choice(flag: str, value: Any, kind: Any) -> Any:
    """A member of ``kind`` (an enum, a registry, or names) given as itself or its value;
    a usage error listing the valid ones otherwise."""
    for member in kind:
        if value is member or getattr(member, "value", member) == value:
            return member
    valid = ", ".join(str(getattr(m, "value", m)) for m in kind)
    raise InputError.single(flag, "", f"expected one of {valid}, got {value!r}")


def training_dtype(value: Dtype | str | None) -> Dtype | None:
    """``--dtype``: a training precision, as the command's parser takes it."""
    from autoplan.vocab import TRAINING_DTYPES, Dtype

    if value is None or isinstance(value, Dtype) and value in TRAINING_DTYPES:
        return value
    for d in TRAINING_DTYPES:
        if isinstance(value, str) and value.lower() == d.value:
            return d
    words = ", ".join(d.value for d in TRAINING_DTYPES)
    shown = getattr(value, "value", value)
    hint = (f": {str(shown).lower()} GEMMs are a serving precision (serve's weights), not a training one"
            if any(str(shown).lower() == d.value for d in Dtype) else "")
    raise InputError.single("--dtype", "", f"expected one of {words}, got {shown!r}{hint}")


def gpu_counts(gpus: int | str | Sequence[int] | None) -> tuple[int, ...] | None:
    """``--gpus``: one count, several (``64,128,256``, ``64..1024`` or a list), or None."""
    from autoplan.whatif.counts import check_gpu_counts, parse_gpu_counts

    if gpus is None:
        return None
    if isinstance(gpus, str):
        return parse_gpu_counts(gpus)
    if isinstance(gpus, bool) or not isinstance(gpus, (int, Sequence)):
        raise InputError.single("--gpus", "", f"expected a GPU count, a list of them or text such as "
                                              f"64..1024, got {gpus!r}")
    counts: list[Any] = [gpus] if isinstance(gpus, int) else list(gpus)
    if not counts or any(isinstance(n, bool) or not isinstance(n, int) for n in counts):
        raise InputError.single("--gpus", "", f"expected whole GPU counts, got {gpus!r}")
    return check_gpu_counts(sorted(set(counts)), "--gpus")


def layout_text(plan: Plan) -> str:
    """A plan's layout in a few words: ``dp8 tp2 pp4 vpp2``, with the axes it uses."""
    from autoplan.vocab import CpComm, MoeDispatch

    lay = plan.layout
    text = f"dp{lay.dp} tp{lay.tp} pp{lay.pp}"
    if lay.dp_shard < lay.dp:
        text += f" shard{lay.dp_shard}"  # HSDP: ZeRO over dp_shard, replicated over the rest
    if lay.cp > 1:
        text += f" cp{lay.cp}" + (" a2a" if plan.cp_comm is CpComm.A2A else "")
    if plan.model.is_moe:
        text += f" ep{lay.ep}" + (f" etp{lay.etp}" if lay.etp != lay.tp else "")
        if plan.moe_dispatch is not MoeDispatch.ALLTOALL:
            text += f" {plan.moe_dispatch.value}"
        if plan.ep_overlap:
            text += " ep-overlap"
    if lay.vpp > 1:
        text += f" vpp{lay.vpp}"
    if len(set(plan.stage_layers)) > 1:
        text += " stages " + "/".join(str(n) for n in plan.stage_layers)
    return text


def offload_text(plan: Plan) -> str:
    """What the plan keeps in host memory: ``optimizer``, ``act 50%``, both, or ``-``."""
    parts = (["optimizer"] if plan.offload.optimizer else []) + (
        [f"act {plan.offload.activations:.0%}"] if plan.offload.activations else [])
    return " + ".join(parts) or "-"


PLAN_COLUMNS = ("rank", "gpus", "layout", "dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch",
                "schedule", "recompute", "zero", "feasible", "step_time_s", "tokens_per_s", "mfu",
                "tflops_per_gpu", "peak_memory_gib", "launchers")


def plan_row(rank: int, plan: Plan, pred: Prediction, launchers: Sequence[str] | None = None
             ) -> dict[str, Any]:
    """One ranked training plan as a table row (:data:`PLAN_COLUMNS`)."""
    from autoplan.units import GiB

    lay = plan.layout
    return {"rank": rank, "gpus": lay.gpus, "layout": layout_text(plan), "dp": lay.dp, "tp": lay.tp,
            "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "vpp": lay.vpp, "micro_batch": plan.micro_batch,
            "schedule": plan.schedule.value, "recompute": plan.recompute.value, "zero": int(plan.zero),
            "feasible": pred.feasible, "step_time_s": pred.step_time_s, "tokens_per_s": pred.tokens_per_s,
            "mfu": pred.mfu, "tflops_per_gpu": pred.tflops_per_gpu,
            "peak_memory_gib": pred.memory.peak / GiB,
            "launchers": None if launchers is None else ",".join(launchers)}
