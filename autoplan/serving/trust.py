"""How far to trust a serving prediction: what it was predicted from, and how far off
predictions of its kind were on measured runs kept out of the fit.

:func:`evidence_of` gives a prediction's :class:`Evidence` (``evidence`` in its JSON):

- ``engine``: the engine release the plan names and the release line that predicts it, and
  whether that line's constants were fitted on measured runs, taken from another line, or
  a prior set by hand (``serving.engine``);
- ``provenance``: which parts of an iteration (``serving.cost.Breakdown``'s: gemm, moe,
  attention, kv_read, elementwise, tp_comm, ep_comm, pp_comm, logits) the measured profile
  that corrects the plan's device covers (the one door, ``measured.door.corrected``: its
  source, the device it was taken on, the engine and release its header names) and which
  come from the analytic model alone (roofline and alpha-beta). A part is measured where
  the device's correction has something to say for the plan's shape of it: the correction
  returns exactly 1 where its profile measured nothing of the kind (a dtype it did not
  measure, a collective over more ranks or domains than it reached; autoplan.measured.
  surrogate). The KV read of decode and the fused elementwise kernels are priced from the
  HBM bandwidth alone (``serving.cost``), measured or not; for a model whose layers differ,
  each token mixer's kernels (``mixers``): full and sliding-window GQA attention measured
  where the profile's attention or decode rows correct them; gated delta net, Mamba-2,
  sparse attention and DeepSeek-V4's compressed sparse and heavily compressed attention
  where a measured mixer table of the plan's engine and device covers the layer's shape
  (``Device.mixer_kernels``: profiles/measured/mixers/, AIConfigurator's timings;
  ``mixer_tables`` names the file per phase): "measured" where it prices both
  prefill and decode, "partly measured" where one phase or, for Mamba-2, the conv alone
  (no table times its SSD scan), else "roofline"; Kimi delta attention and MLA from the
  roofline (no shipped table of the shipped engine versions measures them);
- ``held_out_error``: the mean absolute percentage error of TTFT and TPOT that the serving
  accuracy benchmark measured on runs of the same regime (engine, GPU, mode agg or disagg)
  held out of the fit, read from ``autoplan/serving/accuracy.json``
  (:func:`held_out_error`); "not measured" where the file has no such regime.

``accuracy.json``::

    {"about": "...", "source": "the command and data that wrote it",
     "regimes": {"<engine>": {"<device name>": {"agg" | "disagg":
                 {"ttft_mape": 0.18, "tpot_mape": 0.07, "rows": 120}}}}}

MAPEs as fractions (0.18 is 18%), devices by autoplan's descriptor names (h100-sxm, b200,
gb200); :func:`write_accuracy` writes it (``benchmarks/serving_accuracy.py`` calls it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from autoplan.descriptors.model import CSA, FULL, GDN, HCA, MAMBA, MIXERS, NO_MIXER, SLIDING, SPARSE
from autoplan.errors import InputError
from autoplan.kernels.comm import Group
from autoplan.serving.cost import ACT_BYTES, TABLE_PHASES, StepModel
from autoplan.serving.deployment import ServingPlan
from autoplan.vocab import Dtype

ACCURACY_FILE = "accuracy.json"
MODES = ("agg", "disagg")
PROBE_TOKENS = 256  # the rows of the GEMMs and the tokens of the collectives a probe asks about
# the parts of an iteration no correction reaches (serving.cost prices them from the HBM
# bandwidth alone; the decode KV read is measured where a profile has decode rows)
UNCORRECTED = ("elementwise",)
PROBE_DECODES, PROBE_CONTEXT = 32, 2048  # the decode batch and context a probe asks about


@dataclass(frozen=True, slots=True)
class EngineEvidence:
    """The engine release a prediction ran and where its constants come from."""

    name: str
    release: str  # the plan's release, else the default line's
    line: str  # the release line that predicts it
    constants: str  # "fitted" (for this line), "fitted for <line>", "prior", or "calibrated"
    source: str  # what the constants were fitted on, or why they are a prior
    note: str | None = None  # a release older than every line

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"name": self.name, "release": self.release, "line": self.line,
                                  "constants": self.constants, "source": self.source}
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class Provenance:
    """Which parts of the plan's iterations a measured profile corrects (module doc)."""

    profile: str | None  # the profile's source (None: none applies; all analytic)
    device: str | None  # the device it was taken on
    engine: str | None  # the engine and release its header names (None: engine-less)
    engine_version: str | None
    measured: tuple[str, ...]
    roofline: tuple[str, ...]
    # a model whose layers differ: (token mixer, "measured" | "partly measured" | "roofline")
    # per kind it has
    mixers: tuple[tuple[str, str], ...] = ()
    # the mixers a measured mixer table prices: (token mixer, what the table times, the file
    # that prices its prefill, its decode; None: the roofline)
    mixer_tables: tuple[tuple[str, str, str | None, str | None], ...] = ()

    def to_dict(self) -> dict[str, object]:
        profile = None if self.profile is None else {
            "source": self.profile, "device": self.device, "engine": self.engine,
            "engine_version": self.engine_version}
        out: dict[str, object] = {"profile": profile, "measured": list(self.measured),
                                  "roofline": list(self.roofline)}
        if self.mixers:
            out["mixers"] = dict(self.mixers)
        if self.mixer_tables:
            out["mixer_tables"] = {name: {"covers": covers, "prefill": prefill, "decode": decode}
                                   for name, covers, prefill, decode in self.mixer_tables}
        return out

    def mixer_lines(self) -> list[str]:
        """The token mixers in words: each one's measured or roofline, and which file."""
        if not self.mixers:
            return []
        tables = {name: (covers, prefill, decode) for name, covers, prefill, decode in self.mixer_tables}
        parts = []
        for name, how in self.mixers:
            if name not in tables:
                parts.append(f"{name} {how}")
                continue
            covers, prefill, decode = tables[name]
            where = (f"prefill and decode: {prefill}" if prefill == decode else
                     f"prefill: {prefill or 'roofline'}, decode: {decode or 'roofline'}")
            parts.append(f"{name} {how} ({covers}; {where})")
        return ["token mixers: " + "; ".join(parts)]


@dataclass(frozen=True, slots=True)
class HeldOutError:
    """The held-out error of a regime, or that none was measured."""

    engine: str
    gpu: str
    mode: str
    ttft_mape: float | None = None
    tpot_mape: float | None = None
    rows: int = 0

    @property
    def measured(self) -> bool:
        return self.rows > 0

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "gpu": self.gpu, "mode": self.mode, "measured": self.measured,
                "ttft_mape": self.ttft_mape, "tpot_mape": self.tpot_mape, "rows": self.rows}

    def label(self) -> str:
        regime = f"{self.engine}, {self.gpu}, {self.mode}"
        if not self.measured:
            return f"held-out error ({regime}): not measured"
        return (f"held-out error ({regime}): TTFT {_pct(self.ttft_mape)}, TPOT {_pct(self.tpot_mape)} "
                f"MAPE over {self.rows:,} runs")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a serving prediction stands on (module doc)."""

    engine: EngineEvidence
    provenance: Provenance
    held_out_error: HeldOutError

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine.to_dict(), "provenance": self.provenance.to_dict(),
                "held_out_error": self.held_out_error.to_dict()}

    def lines(self) -> list[str]:
        """The evidence in words (the tables' footnote)."""
        e, p = self.engine, self.provenance
        constants = {"fitted": "constants fitted for it", "prior": "constants a prior (not fitted)",
                     "calibrated": f"constants calibrated {e.source}"}.get(e.constants,
                                                                            f"constants {e.constants}")
        out = [f"engine {e.name} {e.release}: predicted as release line {e.line}, {constants}"]
        if e.note:
            out.append(e.note)
        if p.profile is None:
            out.append("kernels: all from the roofline (no measured profile for this device)")
        else:
            taken = f"{p.profile}, taken on {p.device or '?'}" + (
                f" with {p.engine} {p.engine_version or ''}".rstrip() if p.engine else "")
            out.append(f"kernels measured ({taken}): {', '.join(p.measured) or 'none'}; from the "
                       f"roofline: {', '.join(p.roofline) or 'none'}")
        out += p.mixer_lines()
        out.append(self.held_out_error.label())
        return out


# -- the engine ---------------------------------------------------------------------------

def engine_evidence(plan: ServingPlan) -> EngineEvidence:
    resolved = plan.engine_resolved
    line = resolved.line
    fitted = line.fitted
    if fitted is not None and fitted.calibration:
        constants = "calibrated"
    elif fitted is None or fitted.prior:
        constants = "prior"
    elif line.is_fitted:
        constants = "fitted"
    else:
        constants = f"fitted for {line.fitted_line}"
    source = "" if fitted is None else fitted.calibration or fitted.source
    return EngineEvidence(plan.engine.value, resolved.release, line.version or "-", constants, source,
                          resolved.note)


# -- which kernels were measured ----------------------------------------------------------

def _collective_measured(op: str, nbytes: float, group: Group | None) -> bool | None:
    """Whether the group's correction covers the collective (None: no such collective)."""
    if group is None or group.size < 2:
        return None
    return group.correction is not None and group.correction.collective(
        op, nbytes, group.size, group.per_domain) != 1.0


def _parts(step: StepModel) -> dict[str, bool]:
    """Part -> measured, for the parts the step's iterations have (module doc)."""
    m, d, dev = step.model, step.deployment, step.device
    corr = dev.correction
    act = ACT_BYTES * PROBE_TOKENS * m.hidden
    out: dict[str, bool] = {}
    n, k, _ = step._dense_shapes[0]
    out["gemm"] = corr is not None and corr.gemm(PROBE_TOKENS, n, k, step.dtype) != 1.0
    if m.is_moe:
        out["moe"] = corr is not None and corr.gemm(PROBE_TOKENS, m.expert_width, m.hidden, step.dtype) != 1.0
    call = step._prefill_call
    out["attention"] = corr is not None and corr.attention(*call) != 1.0
    out["kv_read"] = step.decode_ratio(PROBE_DECODES, PROBE_DECODES * PROBE_CONTEXT) != 1.0
    for part in UNCORRECTED:
        out[part] = False
    # the collectives serving.cost runs: TP all-reduces; EP's all-to-alls, or without EP
    # the attention-DP ranks' all-reduce at the experts; a send between pipeline stages
    collectives: list[tuple[str, str, float, Group | None]] = [
        ("tp_comm", "all_reduce", act, step.tp_group if d.tp > 1 else None)]
    if m.is_moe and step.ep_group is not None:
        collectives.append(("ep_comm", "all_to_all", act * m.top_k * d.attention_dp / d.ep, step.ep_group))
    elif m.is_moe and d.attention_dp > 1:
        collectives.append(("ep_comm", "all_reduce", act * d.attention_dp, step.stage_group))
    for part, op, nbytes, group in collectives:
        found = _collective_measured(op, nbytes, group)
        if found is not None:
            out[part] = found
    if d.pp > 1:  # a send between stages (comm.p2p asks the correction for 2 ranks)
        out["pp_comm"] = corr is not None and corr.collective(
            "p2p", act / d.tp, 2, 1 if step.pp_cross else 2) != 1.0
    out["logits"] = corr is not None and corr.gemm(PROBE_TOKENS, m.vocab / d.tp, m.hidden, Dtype.BF16) != 1.0
    return out


def mixer_kernels(step: StepModel) -> tuple[tuple[str, str], ...]:
    """(token mixer, "measured" | "roofline") for each kind of mixer a model whose layers
    differ has (module doc); () for one whose layers are alike."""
    if not step.hybrid:
        return ()
    corr, m = step.device.correction, step.model
    gqa_measured = not (m.is_mla or m.is_v4_attention) and corr is not None and (
        corr.attention(*step._prefill_call) != 1.0
        or step.decode_ratio(PROBE_DECODES, PROBE_DECODES * PROBE_CONTEXT) != 1.0)
    tables = step.table_sources()
    out = []
    for mixer in step._mixer_counts:
        if mixer == NO_MIXER:
            continue
        if mixer in tables:
            phases = sum(source is not None for source in tables[mixer].values())
            how = "measured" if phases == len(TABLE_PHASES) and mixer != MAMBA else "partly measured"
        else:
            how = "measured" if mixer in (FULL, SLIDING) and gqa_measured else "roofline"
        out.append((MIXERS[mixer], how))
    return tuple(out)


# what a measured mixer table times of a layer, per mixer (autoplan.measured.aiconfigurator_mixers)
TABLE_COVERS = {GDN: "its conv and delta-rule kernels", MAMBA: "its conv (the SSD scan from the roofline)",
                SPARSE: "its whole block, projections included",
                CSA: "its whole attention module: projections, compressors, indexer and top-k, window and "
                     "compressed attention",
                HCA: "its whole attention module: projections, compressor, window and compressed attention"}


def mixer_tables(step: StepModel) -> tuple[tuple[str, str, str | None, str | None], ...]:
    """(token mixer, what its table times, the file that prices its prefill, its decode)
    for each mixer a measured mixer table prices (module doc)."""
    return tuple((MIXERS[mixer], TABLE_COVERS.get(mixer, "its kernels"), phases.get("context"),
                  phases.get("generation")) for mixer, phases in step.table_sources().items())


def provenance(steps: Sequence[StepModel]) -> Provenance:
    """Measured or roofline per part over ``steps`` (a disaggregated deployment's pools: a
    part is measured where every pool that runs it has it measured)."""
    merged: dict[str, bool] = {}
    for step in steps:
        for part, measured in _parts(step).items():
            merged[part] = merged.get(part, True) and measured
    corr = steps[0].device.correction
    meta: Mapping[str, str] = getattr(corr, "meta", None) or {}
    # each pool's profile (a heterogeneous cluster's sides run on different devices)
    sources: list[str] = []
    for step in steps:
        c = step.device.correction
        if c is not None:
            name = str(getattr(c, "profile", None) or "a measured correction")
            if name not in sources:
                sources.append(name)
    order = ("gemm", "moe", "attention", "kv_read", "elementwise", "tp_comm", "ep_comm", "pp_comm", "logits")
    parts = [p for p in order if p in merged]
    return Provenance(
        profile=None if corr is None else " and ".join(sources),
        device=meta.get("descriptor") or meta.get("device_name") or None,
        engine=meta.get("engine") or None, engine_version=meta.get("engine_version") or None,
        measured=tuple(p for p in parts if merged[p]), roofline=tuple(p for p in parts if not merged[p]),
        mixers=mixer_kernels(steps[0]), mixer_tables=mixer_tables(steps[0]))


# -- the held-out error -------------------------------------------------------------------

def accuracy_path() -> Path:
    """The shipped accuracy file (beside this module, in a checkout and in a wheel)."""
    return Path(str(resources.files("autoplan.serving"))) / ACCURACY_FILE


@lru_cache(maxsize=8)
def _regimes(path: str, mtime_ns: int) -> Mapping[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError.single(path, "", f"cannot read the accuracy file: {exc}") from None
    regimes = data.get("regimes") if isinstance(data, Mapping) else None
    if not isinstance(regimes, Mapping):
        raise InputError.single(path, "regimes", "expected a mapping engine -> gpu -> mode -> errors")
    return regimes


def held_out_error(engine: str, gpu: str, mode: str, path: Path | None = None) -> HeldOutError:
    """The held-out error the accuracy file gives the regime, or one saying none was
    measured (a regime, or the file's entry for it, missing; module doc)."""
    where = path if path is not None else accuracy_path()
    try:
        stamp = where.stat().st_mtime_ns
    except OSError:
        return HeldOutError(engine, gpu, mode)
    entry = _regimes(str(where), stamp).get(engine, {})
    entry = entry.get(gpu, {}) if isinstance(entry, Mapping) else {}
    entry = entry.get(mode) if isinstance(entry, Mapping) else None
    if not isinstance(entry, Mapping):
        return HeldOutError(engine, gpu, mode)
    problems = _entry_problems(entry)
    if problems:
        raise InputError.single(str(where), f"regimes.{engine}.{gpu}.{mode}", problems[0])
    return HeldOutError(engine, gpu, mode, entry.get("ttft_mape"), entry.get("tpot_mape"), int(entry["rows"]))


def _entry_problems(entry: Mapping[str, Any]) -> list[str]:
    out = []
    for key in ("ttft_mape", "tpot_mape"):
        v = entry.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not math.isfinite(v) or v < 0):
            out.append(f"{key}: expected a fraction >= 0 (0.18 for 18%) or null, got {v!r}")
    rows = entry.get("rows")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        out.append(f"rows: expected a whole number >= 0, got {rows!r}")
    unknown = sorted(set(entry) - {"ttft_mape", "tpot_mape", "rows"})
    if unknown:
        out.append(f"unknown fields {', '.join(map(str, unknown))}; valid: ttft_mape, tpot_mape, rows")
    return out


ABOUT = ("Held-out error of autoplan's serving predictions per regime (engine -> GPU -> mode): "
         "the mean absolute percentage error (a fraction) of TTFT and TPOT on measured runs kept "
         "out of the fit, and how many runs. Written by autoplan.serving.trust.write_accuracy "
         "(benchmarks/serving_accuracy.py); read into each serving prediction's evidence.")


def write_accuracy(regimes: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]], *, source: str,
                   path: Path | None = None) -> Path:
    """Write the accuracy file (module doc): ``regimes`` engine -> device name -> mode ->
    {ttft_mape, tpot_mape, rows}, ``source`` the command and data that measured them.
    Every entry is checked before anything is written; the file is replaced whole (a
    reader never sees half of it). Returns the path written."""
    where = path if path is not None else accuracy_path()
    clean: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for engine, gpus in regimes.items():
        for gpu, modes in gpus.items():
            for mode, entry in modes.items():
                if mode not in MODES:
                    raise ValueError(f"regimes.{engine}.{gpu}: mode {mode!r}, expected one of {MODES}")
                problems = _entry_problems(entry)
                if problems:
                    raise ValueError(f"regimes.{engine}.{gpu}.{mode}: {problems[0]}")
                clean.setdefault(str(engine), {}).setdefault(str(gpu), {})[mode] = {
                    "ttft_mape": entry.get("ttft_mape"), "tpot_mape": entry.get("tpot_mape"),
                    "rows": int(entry["rows"])}
    text = json.dumps({"about": ABOUT, "source": source, "regimes": clean}, indent=2, sort_keys=True) + "\n"
    fd, tmp = tempfile.mkstemp(dir=where.parent, prefix=".accuracy-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, where)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return where


# -- all of it ---------------------------------------------------------------------------

def evidence_of(plan: ServingPlan, steps: Sequence[StepModel]) -> Evidence:
    """The evidence of ``plan``'s prediction, its iterations costed by ``steps`` (one, or a
    disaggregated deployment's pools)."""
    mode = "disagg" if plan.deployment.disaggregated is not None else "agg"
    return Evidence(engine_evidence(plan), provenance(steps),
                    held_out_error(plan.engine.value, plan.cluster.device.name, mode))
