"""Packed, variable-length documents: what attention computes when a job's sequences are
documents of varied length packed end to end (``Job.documents``).

Pre-training and fine-tuning data are documents packed into sequences of ``seq_len``
tokens, a document that crosses a sequence's end continuing in the next (Megatron-LM's
GPT dataset; torchtitan's). Attention runs block-diagonal: a token attends, causally, only
to its own document's tokens (FlashAttention's varlen kernels, ``cu_seqlens``; Megatron-Core
``--reset-attention-mask``-style THD packing). So per sequence of s tokens holding pieces of
lengths l_i, the causal attention work is sum l_i (l_i + 1) / 2 where one document would be
s (s + 1) / 2: its *share*. Its GEMMs and everything else are the tokens', unchanged.

Context parallelism splits a sequence's tokens over cp ranks, in 2 cp chunks placed
zig-zag (rank r holds chunks r and 2 cp - 1 - r: Megatron-Core's load balancing for
causal attention, which evens out one document exactly). With packed documents the
ranks' work is uneven again: a rank's tokens late in long documents attend to more keys
than another's early ones. The busiest rank's share over the mean is the *imbalance*;
all-to-all (Ulysses) context parallelism splits heads, not tokens, and is even.

Both are read off a deterministic packing of the distribution (``Documents.lengths``:
4,096 document lengths at its quantiles, a histogram's counts in proportion, shuffled
with a fixed seed) into 64 sequences (the list repeated as needed), each document cut
where a sequence ends. The figures are exact for that packing (sums over tokens in
closed form)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from autoplan.descriptors.job import Documents

SEQUENCES = 64  # sequences packed


@functools.lru_cache(maxsize=256)
def _pieces(documents: Documents, seq_len: int) -> tuple[tuple[int, ...], ...]:
    """Each packed sequence's piece lengths, in order (``SEQUENCES`` of them): the one
    packing the share, the length and the imbalance are all read off."""
    lengths = documents.lengths()
    out: list[list[int]] = []
    current: list[int] = []
    room = seq_len
    i = 0
    while len(out) < SEQUENCES:
        left = lengths[i % len(lengths)]
        i += 1
        while left:
            take = min(left, room)
            current.append(take)
            left -= take
            room -= take
            if room == 0:
                out.append(current)
                current, room = [], seq_len
                if len(out) == SEQUENCES:
                    break
    return tuple(tuple(seq) for seq in out)


def _causal(n: int) -> float:
    """Key-query pairs of n tokens attending causally: n (n + 1) / 2."""
    return n * (n + 1) / 2


@functools.lru_cache(maxsize=256)
def attention_share(documents: Documents, seq_len: int) -> float:
    """The packed sequences' causal attention work over one whole-sequence document's
    (module doc): at most 1, 1 where no document is shorter than a sequence."""
    whole = _causal(seq_len)
    per_sequence = [sum(_causal(n) for n in pieces) / whole for pieces in _pieces(documents, seq_len)]
    return sum(per_sequence) / len(per_sequence)


@functools.lru_cache(maxsize=256)
def attention_length(documents: Documents, seq_len: int) -> float:
    """The token-weighted mean length of the pieces a sequence's tokens sit in: the length
    the attention kernel runs at (its efficiency rises with it)."""
    pieces = [n for seq in _pieces(documents, seq_len) for n in seq]
    return sum(n * n for n in pieces) / sum(pieces)


@functools.lru_cache(maxsize=1024)
def cp_imbalance(documents: Documents, seq_len: int, cp: int) -> float:
    """The busiest context-parallel rank's attention work over the mean, with each packed
    sequence split into 2 cp chunks placed zig-zag (module doc), averaged over the packed
    sequences: 1 for cp = 1."""
    if cp <= 1:
        return 1.0
    ratios = []
    for pieces in _pieces(documents, seq_len):
        ranks = rank_work(pieces, seq_len, cp)
        mean = sum(ranks) / cp
        ratios.append(max(ranks) / mean if mean else 1.0)
    return sum(ratios) / len(ratios)


def rank_work(pieces: Sequence[int], seq_len: int, cp: int) -> list[float]:
    """Each context-parallel rank's causal attention work (key-query pairs) on one
    sequence of ``pieces``, split into 2 cp chunks placed zig-zag: rank r holds chunks r
    and 2 cp - 1 - r. A token at offset o of its piece attends to o + 1 keys, so a run of
    offsets [a, b) in one chunk counts (b (b + 1) - a (a + 1)) / 2."""
    chunks = 2 * cp
    bounds = [c * seq_len // chunks for c in range(chunks + 1)]
    work = [0.0] * chunks
    start = 0
    for n in pieces:
        for c in range(chunks):
            lo, hi = max(start, bounds[c]), min(start + n, bounds[c + 1])
            if hi > lo:
                a, b = lo - start, hi - start
                work[c] += (b * (b + 1) - a * (a + 1)) / 2
        start += n
    return [work[r] + work[chunks - 1 - r] for r in range(cp)]
