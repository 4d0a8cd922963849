"""The precision of the states training keeps beside the 16-bit weights: the gradients
(``main_grads``), the optimizer's master weights (``master_weights``) and Adam's moments
(``optimizer_states``).

A job may set each (``descriptors/job.py``); what it leaves unset is what the plan's
stack keeps (``states:`` in ``profiles/stacks/*.yaml``, each default citing its
framework's code; a stack that says nothing keeps fp32 gradients, an fp32 master copy
and fp32 moments, Megatron-LM's docs/distrib_optimizer.md table). A plan's states are
the job's over its stack's (:meth:`Plan.states`), and a plan file names them wherever
leaving them out would not read back the same (:func:`written_states`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from autoplan.descriptors.strict import Fields
from autoplan.vocab import Dtype, MasterWeights, StateDtype, ZeroStage

# the fields, as job files, plan files and stack files spell them
STATE_FIELDS = ("main_grads", "master_weights", "optimizer_states")


@dataclass(frozen=True, slots=True, kw_only=True)
class StatePrecision:
    """Gradients, master weights and moments, each in the precision it is kept in."""

    main_grads: StateDtype = StateDtype.FP32
    master_weights: MasterWeights = MasterWeights.FP32
    optimizer_states: StateDtype = StateDtype.FP32

    def effective(self, dtype: Dtype, zero: ZeroStage) -> StatePrecision:
        """As a plan of ``dtype`` at ``zero`` keeps them: int16 remainders complete bf16
        weights only (apex ``_bf16_rem_to_fp32``; fp8 GEMMs keep bf16 weights) and live in
        a sharded optimizer's state; elsewhere the master is a full fp32 copy, as NeMo 1.x
        keeps it (megatron_base_model.py ``setup_optimization``, NeMo v1.23.0 d2283e36
        L743-752: fp32 optimizer over fp16 weights stores the params; without
        distributed_fused_adam, L792 ``MainParamsOptimizerWrapper``, whose
        optimizer_with_main_params.py L266 clones each weight to fp32)."""
        if self.master_weights is MasterWeights.REMAINDERS and (
                dtype is Dtype.FP16 or zero is ZeroStage.NONE):
            return StatePrecision(main_grads=self.main_grads, master_weights=MasterWeights.FP32,
                                  optimizer_states=self.optimizer_states)
        return self

    def values(self) -> dict[str, str]:
        return {"main_grads": self.main_grads.value, "master_weights": self.master_weights.value,
                "optimizer_states": self.optimizer_states.value}

    def label(self) -> str:
        """``grads fp32, master remainders, moments fp32``."""
        return (f"grads {self.main_grads.value}, master {self.master_weights.value}, "
                f"moments {self.optimizer_states.value}")


FP32_STATES = StatePrecision()


@functools.lru_cache(maxsize=4096)
def resolved(main_grads: StateDtype | None, master_weights: MasterWeights | None,
             optimizer_states: StateDtype | None, defaults: StatePrecision, dtype: Dtype,
             zero: ZeroStage) -> StatePrecision:
    """The states a job setting these (None: unset) keeps on a stack keeping ``defaults``,
    at ``dtype`` and ``zero`` (:meth:`StatePrecision.effective`)."""
    return StatePrecision(
        main_grads=defaults.main_grads if main_grads is None else main_grads,
        master_weights=defaults.master_weights if master_weights is None else master_weights,
        optimizer_states=defaults.optimizer_states if optimizer_states is None else optimizer_states,
    ).effective(dtype, zero)


def read_states(f: Fields) -> dict[str, Any]:
    """The three fields of a job or a stack's ``states``, each None where not given."""
    return {"main_grads": f.enum("main_grads", StateDtype, None),
            "master_weights": f.enum("master_weights", MasterWeights, None),
            "optimizer_states": f.enum("optimizer_states", StateDtype, None)}


def written_states(states: StatePrecision, defaults: StatePrecision) -> dict[str, str]:
    """The states a plan file names: each that is not fp32, and each whose stack keeps it
    in other than fp32: left out, a plan file's state is its stack's. (A plan file written
    before stacks had states names only its bf16 ones; every stack there was then keeps
    the others in fp32, as the plan meant.)"""
    out = {}
    for key, value in states.values().items():
        if value != "fp32" or defaults.values()[key] != "fp32":
            out[key] = value
    return out
