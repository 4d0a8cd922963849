"""The one door through which a measured profile reaches a prediction.

Every command that costs a plan resolves its cluster through :func:`corrected`: the plan
reader (``plans.file.read_plan``: evaluate, explain, check, diff), the search request
(``commands.request.build_request``: search and the what-if sweep), and serving's plan reader and
request (``serve``). The profile is the one given (``--profile``, a job file's
``profile:``), else the one shipped under ``profiles/measured/`` for the cluster's device;
none leaves the cluster analytic. So one plan on one cluster gets one number whatever the
command.

Training (no engine asked) on a device without a profile gets the device's measured kernel
grids that apply where ``profiles/measured/kernels/`` ships them (:mod:`autoplan.measured.kernels`:
NVIDIA AIConfigurator's NCCL tables; its GEMM tables ship but do not apply, that module's doc
says why), on ``Device.kernels``: the cost model reads them where they cover a kernel and its
curves elsewhere. A profile (``autoplan bench``'s,
or one given) takes precedence and the two never mix; serving (an engine asked) never
gets the grids (its constants were fitted against the curves).

Serving (an engine asked) gets, beside its profile, the device's measured token-mixer
tables of that engine at the plan's version where ``profiles/measured/mixers/`` ships them
(:mod:`autoplan.measured.mixer_tables`: AIConfigurator's Gated DeltaNet, Mamba-2 conv and
DeepSeek Sparse Attention timings), on ``Device.mixer_kernels``: the serving cost reads them
for the layers they cover, with or without a profile.

scikit-learn and pandas load only where a profile applies (a device without one costs a
look at each shipped profile's header).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.descriptors.hardware import Cluster
from autoplan.measured.kernels import shipped_kernels
from autoplan.measured.mixer_tables import shipped_mixers
from autoplan.measured.profile import Profile
from autoplan.measured.shipped import shipped_profile


@dataclass(frozen=True, slots=True)
class Corrected:
    """A cluster as the cost model sees it, and the profile that corrected it (None:
    analytic)."""

    cluster: Cluster
    profile: Profile | None

    @property
    def note(self) -> str | None:
        """A note when the profile was taken on another device than the one it corrects."""
        p = self.profile
        if p is not None and p.descriptor and p.descriptor != self.cluster.device.name:
            return (f"autoplan: note: {p.source} was taken on {p.descriptor}; "
                    f"it corrects {self.cluster.device.name} here")
        return None


def profile_for(cluster: Cluster, given: Profile | None = None, engine: str | None = None,
                version: str | None = None) -> Profile | None:
    """The profile that corrects ``cluster``: ``given``, else the shipped one for its device
    and, for serving, the plan's ``engine`` at ``version`` (module doc)."""
    if given is not None:
        return given
    name = None if engine is None else str(getattr(engine, "value", engine))
    return shipped_profile(cluster.device.name, name, version)


def corrected(cluster: Cluster, given: Profile | None = None, engine: str | None = None,
              version: str | None = None) -> Corrected:
    """``cluster`` with its device carrying the correction fitted on :func:`profile_for`'s
    profile (``measured.surrogate.calibrate``), or as it is where there is none."""
    measured = profile_for(cluster, given, engine, version)
    if measured is None:
        return Corrected(with_kernels(cluster) if engine is None else with_mixers(cluster, engine, version),
                         None)
    # imported here: scikit-learn takes most of a second to import, which a command
    # without a profile should not pay
    from autoplan.measured.surrogate import calibrate

    calibrated = calibrate(cluster, measured)
    return Corrected(calibrated if engine is None else with_mixers(calibrated, engine, version), measured)


def with_mixers(cluster: Cluster, engine: str, version: str | None = None) -> Cluster:
    """``cluster`` with its device carrying the mixer tables shipped for it and ``engine`` at
    ``version`` that apply (module doc), or as it is where none are shipped."""
    name = str(getattr(engine, "value", engine))
    tables = shipped_mixers(cluster.device.name, name, version)
    if tables is None or cluster.device.mixer_kernels == tables:
        return cluster
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, mixer_kernels=tables))


def with_kernels(cluster: Cluster, every: bool = False) -> Cluster:
    """``cluster`` with its device carrying the measured kernel grids shipped for it that
    apply (``every``: all of them; ``measured.kernels``), or as it is where none are shipped
    or its device already carries a correction or grids."""
    device = cluster.device
    if device.correction is not None or device.kernels is not None:
        return cluster
    tables = shipped_kernels(device.name, every)
    if tables is None:
        return cluster
    return dataclasses.replace(cluster, device=dataclasses.replace(device, kernels=tables))
