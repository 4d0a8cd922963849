"""Packed, variable-length documents (autoplan/kernels/packing.py, ``job.documents``): the
attention share against the closed form of equal documents, the context-parallel ranks'
work against a hand count, what the step and the MFU make of them, and the job field read
strictly."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cost.evaluate import evaluate
from autoplan.descriptors.job import Documents, read_job
from autoplan.descriptors.strict import Fields
from autoplan.errors import InputError, Problem
from autoplan.kernels import packing
from autoplan.vocab import CpComm
from tests.helpers import make_plan


@pytest.mark.parametrize(("length", "seq"), [(1024, 8192), (512, 4096), (4096, 4096)])
def test_equal_documents_run_their_share_of_the_causal_square(length, seq):
    # seq / L documents of L tokens: (s/L) L (L + 1) / 2 key-query pairs against s (s + 1) / 2
    share = packing.attention_share(Documents("fixed", length=float(length)), seq)
    assert share == pytest.approx((seq // length) * length * (length + 1) / (seq * (seq + 1)))
    assert packing.attention_length(Documents("fixed", length=float(length)), seq) == length


def test_one_document_a_sequence_is_even_on_every_zig_zag_rank():
    whole = Documents("fixed", length=8192.0)
    assert packing.attention_share(whole, 8192) == 1.0
    assert [packing.cp_imbalance(whole, 8192, cp) for cp in (1, 2, 4, 8)] == [1.0] * 4


def test_the_ranks_work_is_counted_by_hand():
    # s = 8192 in 4 chunks of 2048 (cp = 2): a 6144-token document, then a 2048 one.
    # chunk 0: offsets 0..2048 of the first, 2048*2049/2 = 2,098,176 pairs; chunk 1:
    # 2048..4096, (4096*4097 - 2048*2049)/2 = 6,292,480; chunk 2: 4096..6144, 10,486,784;
    # chunk 3: the second document's 0..2048, 2,098,176. Rank 0 holds chunks 0 and 3,
    # rank 1 chunks 1 and 2 (zig-zag).
    assert packing.rank_work([6144, 2048], 8192, 2) == [2_098_176 + 2_098_176, 6_292_480 + 10_486_784]
    # the mean is 10,487,808: the busiest rank 1.6x it, where one document is even:
    # 8192*8193/2 pairs, half on each rank
    assert packing.rank_work([8192], 8192, 2) == [8192 * 8193 / 4] * 2


def test_varied_documents_shorten_attention_and_unbalance_ring_context_parallelism():
    docs = Documents("lognormal", length=1500.0, sigma=1.0)
    share = packing.attention_share(docs, 8192)
    assert 0.2 < share < 0.6
    assert 1.1 < packing.cp_imbalance(docs, 8192, 4) < 2.0
    kw = dict(model="llama3-8b", gpus=32, dp=8, cp=4, global_batch=32, seq_len=8192)
    whole = make_plan(**kw)
    packed = dataclasses.replace(whole, job=dataclasses.replace(whole.job, documents=docs))
    a, b = evaluate(whole), evaluate(packed)
    assert b.breakdown.compute < a.breakdown.compute  # less attention, even on the busiest rank
    # MFU counts the FLOPs the documents run: fewer model FLOPs a step
    assert b.tflops_per_gpu * b.step_time_s < a.tflops_per_gpu * a.step_time_s
    # all-to-all context parallelism splits heads: no imbalance to pay
    ulysses = dataclasses.replace(packed, cp_comm=CpComm.A2A)
    balanced = dataclasses.replace(ulysses, job=dataclasses.replace(ulysses.job, documents=None))
    ring_skew = packing.cp_imbalance(docs, 8192, 4)
    assert ring_skew > 1
    assert evaluate(ulysses).breakdown.compute < evaluate(balanced).breakdown.compute


def read(documents, tmp_path=None):
    problems: list[Problem] = []
    job = read_job(Fields({"global_batch": 8, "seq_len": 8192, "documents": documents}, "j.yaml",
                          "job", problems))
    if problems:
        raise InputError(problems)
    return job


def test_the_documents_field_reads_each_kind_and_round_trips(tmp_path):
    assert read({"fixed": 2048}).documents == Documents("fixed", length=2048.0)
    assert read({"lognormal": {"median": 1500, "sigma": 1}}).documents.sigma == 1.0
    hist = read({"histogram": [[512, 3], [2048, 5], [32768, 2]]})
    assert hist.documents.bins == ((512, 3.0), (2048, 5.0), (32768, 2.0))
    csv = tmp_path / "lengths.csv"
    csv.write_text("length,count\n512,3\n2048,5\n32768,2\n")
    assert read({"histogram": str(csv)}).documents == hist.documents
    for job in (hist, read({"fixed": 2048}), read({"lognormal": {"median": 1500, "sigma": 1}})):
        again = read(job.to_dict()["documents"])
        assert again == job


@pytest.mark.parametrize(("documents", "words"), [
    ({"fixed": 0}, "job.documents.fixed"),
    ({"fixed": 1, "lognormal": {}}, "expected one of"),
    ({"zipf": 1}, "expected one of"),
    ({"lognormal": {"median": 1500}}, "job.documents.lognormal.sigma"),
    ({"lognormal": {"median": 1500, "sigma": 50}}, "job.documents.lognormal.sigma"),
    ({"histogram": [[512, -1]]}, "job.documents.histogram[0]"),
    ({"histogram": [[0.5, 1]]}, "job.documents.histogram[0]"),
    ({"histogram": [[512, 0]]}, "a weight above 0"),
    ({"histogram": []}, "job.documents.histogram"),
    ({"histogram": "/dev/zero"}, "/dev/zero"),
    ({"histogram": "missing.csv"}, "missing.csv"),
])
def test_a_bad_documents_field_is_named(documents, words):
    with pytest.raises(InputError, match=words.replace("[", r"\[").replace(".", r"\.")):
        read(documents)
