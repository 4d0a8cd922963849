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
closed form), and cost the same however many documents a sequence holds: the packing is
the documents' stream (the list, repeated) cut every seq_len tokens, so any run of it is
a piece of the document it starts in, whole documents, and a piece of the one it ends in,
the whole ones summed by prefix sums over the list (:class:`_Stream`), found by bisection.
One-token documents at 128K tokens a sequence are 8.4 million pieces to enumerate; here,
a few hundred look-ups."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.descriptors.job import Documents

SEQUENCES = 64  # sequences packed


def _causal(n: int) -> int:
    """Key-query pairs of n tokens attending causally: n (n + 1) / 2 (a whole number)."""
    return n * (n + 1) // 2


@dataclass(frozen=True, slots=True)
class _Stream:
    """The documents end to end, the list of lengths repeated without end: prefix sums over
    one pass of it of the lengths, of their causal pairs and of their squares (``[k]``: of
    the first k documents), each pass adding the totals."""

    starts: tuple[int, ...]  # a document's first token within its pass; [n]: the pass's tokens
    causal: tuple[int, ...]
    squares: tuple[int, ...]

    @classmethod
    def of(cls, lengths: Sequence[int]) -> _Stream:
        starts, causal, squares = [0], [0], [0]
        for n in lengths:
            starts.append(starts[-1] + n)
            causal.append(causal[-1] + _causal(n))
            squares.append(squares[-1] + n * n)
        return cls(tuple(starts), tuple(causal), tuple(squares))

    def doc_at(self, token: int) -> int:
        """The document (counted from the stream's start) that holds stream token ``token``."""
        n, total = len(self.starts) - 1, self.starts[-1]
        passes, within = divmod(token, total)
        return passes * n + bisect.bisect_right(self.starts, within) - 1

    def _sum(self, table: tuple[int, ...], k: int) -> int:
        """``table``'s sum over the stream's first k documents."""
        n = len(self.starts) - 1
        passes, rest = divmod(k, n)
        return passes * table[n] + table[rest]

    def start(self, k: int) -> int:
        """Document k's first token in the stream."""
        return self._sum(self.starts, k)

    def pieces(self, lo: int, hi: int) -> tuple[int, int]:
        """(causal pairs, squares) summed over the pieces of ``[lo, hi)`` (``hi > lo``), each
        document cut to it."""
        first, last = self.doc_at(lo), self.doc_at(hi - 1)
        if first == last:
            return _causal(hi - lo), (hi - lo) ** 2
        head, tail = self.start(first + 1) - lo, hi - self.start(last)
        between = first + 1, last  # the whole documents

        def whole(table: tuple[int, ...]) -> int:
            return self._sum(table, between[1]) - self._sum(table, between[0])

        return (_causal(head) + _causal(tail) + whole(self.causal),
                head * head + tail * tail + whole(self.squares))

    def pairs(self, lo: int, hi: int, sequence: int) -> int:
        """Causal pairs of the tokens of ``[lo, hi)`` within the sequence starting at stream
        token ``sequence`` (``sequence <= lo``): a token at offset o of its piece (its
        document, cut where the sequence starts) attends to o + 1 keys, so a run of offsets
        [a, b) counts (b (b + 1) - a (a + 1)) / 2."""
        if hi <= lo:
            return 0
        first, last = self.doc_at(lo), self.doc_at(hi - 1)
        begins = max(self.start(first), sequence)
        if first == last:
            return _causal(hi - begins) - _causal(lo - begins)
        head = _causal(self.start(first + 1) - begins) - _causal(lo - begins)
        return (head + _causal(hi - self.start(last))
                + self._sum(self.causal, last) - self._sum(self.causal, first + 1))


@functools.lru_cache(maxsize=64)
def _stream(documents: Documents) -> _Stream:
    return _Stream.of(documents.lengths())


@functools.lru_cache(maxsize=256)
def _sums(documents: Documents, seq_len: int) -> tuple[tuple[int, int], ...]:
    """Each packed sequence's (causal pairs, squares) summed over its pieces, in order
    (``SEQUENCES`` of them): the one packing the share and the length are read off."""
    stream = _stream(documents)
    return tuple(stream.pieces(i * seq_len, (i + 1) * seq_len) for i in range(SEQUENCES))


@functools.lru_cache(maxsize=256)
def attention_share(documents: Documents, seq_len: int) -> float:
    """The packed sequences' causal attention work over one whole-sequence document's
    (module doc): at most 1, 1 where no document is shorter than a sequence."""
    whole = float(_causal(seq_len))
    per_sequence = [float(pairs) / whole for pairs, _ in _sums(documents, seq_len)]
    return sum(per_sequence) / len(per_sequence)


@functools.lru_cache(maxsize=256)
def attention_length(documents: Documents, seq_len: int) -> float:
    """The token-weighted mean length of the pieces a sequence's tokens sit in: the length
    the attention kernel runs at (its efficiency rises with it)."""
    return sum(squares for _, squares in _sums(documents, seq_len)) / (SEQUENCES * seq_len)


@functools.lru_cache(maxsize=1024)
def cp_imbalance(documents: Documents, seq_len: int, cp: int) -> float:
    """The busiest context-parallel rank's attention work over the mean, with each packed
    sequence split into 2 cp chunks placed zig-zag (module doc), averaged over the packed
    sequences: 1 for cp = 1."""
    if cp <= 1:
        return 1.0
    stream = _stream(documents)
    chunks = 2 * cp
    bounds = [c * seq_len // chunks for c in range(chunks + 1)]
    ratios = []
    for i in range(SEQUENCES):
        s = i * seq_len
        work = [float(stream.pairs(s + bounds[c], s + bounds[c + 1], s)) for c in range(chunks)]
        ranks = [work[r] + work[chunks - 1 - r] for r in range(cp)]
        mean = sum(ranks) / cp
        ratios.append(max(ranks) / mean if mean else 1.0)
    return sum(ratios) / len(ratios)


def rank_work(pieces: Sequence[int], seq_len: int, cp: int) -> list[float]:
    """Each context-parallel rank's causal attention work (key-query pairs) on one
    sequence of ``pieces``, split into 2 cp chunks placed zig-zag: rank r holds chunks r
    and 2 cp - 1 - r. A token at offset o of its piece attends to o + 1 keys, so a run of
    offsets [a, b) in one chunk counts (b (b + 1) - a (a + 1)) / 2. Piece by piece: what
    :func:`cp_imbalance` sums in closed form over the packing (:meth:`_Stream.pairs`), for a
    sequence given as its pieces."""
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
