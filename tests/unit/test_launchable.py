"""The default search ranks only plans some launcher runs (search/launchable.py): the union
of the launchers' spaces, each part on its own stack, equals searching every part in full
and ranking their launchable plans together."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.descriptors.job import Job
from autoplan.descriptors.library import resolve_cluster, resolve_model, with_gpus
from autoplan.descriptors.space import StageShape, load_space
from autoplan.export import launchers, refusals
from autoplan.search import engine
from autoplan.search.launchable import (
    GAP_NOTE,
    launchable_space,
    launcher_free_best,
    launcher_spaces,
    resolve_space,
    search,
)
from autoplan.search.results import rank_key

CASES = [  # (model, gpus, global batch, seq len)
    ("llama3-8b", 16, 64, 4096),
    ("mixtral-8x7b", 16, 64, 4096),
]


def _brute(model, cluster, job, top_k):  # type: ignore[no-untyped-def]
    """Every part searched in full (no ceiling), its launchable plans ranked together, one row
    per plan whatever its stack."""
    found = {}
    for part in launchable_space().parts:
        part = dataclasses.replace(part, stage_shape=StageShape.UNIFORM)
        for r in engine.search(model, cluster, job, part, top_k=top_k).plans:
            if not launchers(r.plan):
                continue
            key = r.plan.replace(stack=launchable_space().parts[0].stack)
            if key not in found or rank_key(r.plan, r.prediction) < rank_key(found[key].plan,
                                                                              found[key].prediction):
                found[key] = r
    return sorted(found.values(), key=lambda r: rank_key(r.plan, r.prediction))[:top_k]


@pytest.mark.parametrize(("name", "gpus", "batch", "seq"), CASES)
def test_the_union_equals_every_part_searched_in_full_and_ranked_together(
        name: str, gpus: int, batch: int, seq: int) -> None:
    model = resolve_model(name)
    cluster = with_gpus(resolve_cluster("dgx-h100"), gpus)
    job = Job(global_batch=batch, seq_len=seq)
    got = search(model, cluster, job, launchable_space(), top_k=6).plans
    want = _brute(model, cluster, job, 6)
    assert [(r.plan, r.prediction.step_time_s) for r in got] == [
        (r.plan, r.prediction.step_time_s) for r in want]
    assert got, "the small jobs fit"
    for r in got:  # each runs on a launcher as it is, on the stack of the part that found it
        on = launchers(r.plan)
        assert on and all(not refusals_of(r.plan, n) for n in on)
        assert r.plan.stack.name in {p.stack.name for p in launchable_space().parts}


def refusals_of(plan, name):  # type: ignore[no-untyped-def]
    from autoplan.export import Target

    return refusals(plan, Target(name))


def test_the_union_holds_one_part_per_launcher_space_megatron_first() -> None:
    spaces = launcher_spaces()
    assert spaces[0] == ("megatron", ("megatron", "nemo"))
    names = [n for _, ns in spaces for n in ns]
    assert {"megatron", "nemo", "deepspeed", "torchtitan"} <= set(names)
    union = launchable_space()
    assert [p.name for p in union.parts] == [s for s, _ in spaces]
    assert union.name == "launchable" and union.each == union.parts
    # every part on the stack its launcher runs
    assert {p.name: p.stack.name for p in union.parts}["torchtitan"] == "torchtitan"


def test_space_names_launchable_any_and_the_former_default() -> None:
    assert resolve_space(None).parts and resolve_space("launchable").parts
    assert resolve_space("any").name == "any" and not resolve_space("any").parts
    assert resolve_space("default") == resolve_space("any")  # the former name, still read
    assert load_space("default").name == "any"


def test_a_change_to_a_union_reaches_every_part() -> None:
    from autoplan.vocab import NO_OFFLOAD

    union = launchable_space().changed(offload=(NO_OFFLOAD,))
    assert all(p.offload == (NO_OFFLOAD,) for p in union.each)


def test_the_gap_is_said_only_past_its_threshold() -> None:
    model, job = resolve_model("llama3-8b"), Job(global_batch=64, seq_len=4096)
    cluster = with_gpus(resolve_cluster("dgx-h100"), 16)
    best = search(model, cluster, job, launchable_space(), top_k=1)
    free = engine.search(model, cluster, job, resolve_space("any"), top_k=1)
    gap = launcher_free_best(best.plans, free)
    ratio = best.plans[0].prediction.step_time_s / free.plans[0].prediction.step_time_s - 1
    assert (gap is not None) == (ratio > GAP_NOTE)
    assert launcher_free_best(best.plans, best) is None  # no faster than itself


def test_the_uneven_split_hint_is_given_only_where_the_layers_do_not_divide() -> None:
    from autoplan.cli.render import uneven_hint
    from tests.helpers import make_plan

    assert uneven_hint(make_plan("llama3-8b", gpus=16, dp=8, pp=2)) is None  # 16/16
    assert uneven_hint(make_plan("llama3-8b", gpus=8, dp=8)) is None  # no pipeline
    hint = uneven_hint(make_plan("llama3-8b", gpus=24, dp=8, pp=3))
    assert hint is not None and "--launcher megatron or torchtitan" in hint and "11/11/10" in hint
