"""Per-chunk pipeline layouts: which layers each model chunk (virtual pipeline stage)
holds, written either as one list of chunk layer counts per pipeline stage or as
Megatron-Core's ``--pipeline-model-parallel-layout`` string.

The string (Megatron-Core, ``transformer/pipeline_parallel_layer_layout.py``): virtual
stages separated by ``|`` in virtual-stage order, ``E`` the embedding, ``t`` a
transformer layer, ``m`` a multi-token-prediction layer, ``L`` the loss; ``x*n``
repeats one symbol, ``(...)*n`` a group; commas are cosmetic. Virtual stage i runs on
pipeline rank i % pp as its chunk i // pp, so ``Et*3|(tt|)*29,m|L`` on pp 16 gives
rank 0 the embedding and 3 layers, then 2 more as its second chunk.

Parsing never expands more than ``MAX_UNITS`` symbols and nests at most
``MAX_DEPTH`` groups: a hostile string fails in microseconds, not after allocating.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoplan.caches import memo

MAX_CHARS = 10_000  # of the layout string as written
MAX_UNITS = 100_000  # symbols once repeats are unrolled (a model has ~100s of layers)
MAX_DEPTH = 8  # nested groups
SYMBOLS = frozenset("ELtm|")


class LayoutError(ValueError):
    """A layout string or chunk list that cannot be read (message for the user)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One virtual pipeline stage: its transformer layers and which of the embedding,
    the loss (output layer and logits) and the MTP layers it holds."""

    layers: int
    embedding: bool = False
    loss: bool = False
    mtp: int = 0

    @property
    def symbols(self) -> str:
        return "E" * self.embedding + "t" * self.layers + "m" * self.mtp + "L" * self.loss


# ----------------------------------------------------------------------------- parsing

def parse_layout(text: str) -> tuple[Chunk, ...]:
    """The chunks a Megatron layout string describes, in virtual-stage order."""
    if len(text) > MAX_CHARS:
        raise LayoutError(f"longer than {MAX_CHARS} characters ({len(text)})")
    src = text.replace(",", "").replace(" ", "")
    if not src:
        raise LayoutError("empty")
    expanded, end = _sequence(src, 0, 0)
    if end != len(src):
        raise LayoutError(f"unexpected {src[end]!r} at position {end} (a ')' without '(')")
    chunks = []
    for part in expanded.split("|"):
        chunks.append(Chunk(layers=part.count("t"), embedding="E" in part, loss="L" in part,
                            mtp=part.count("m")))
    _check_order(expanded)
    return tuple(chunks)


def _sequence(src: str, i: int, depth: int) -> tuple[str, int]:
    """Unroll items from ``src[i]`` up to a ')' or the end: (text, index after)."""
    out: list[str] = []
    size = 0
    while i < len(src) and src[i] != ")":
        ch = src[i]
        if ch == "(":
            if depth >= MAX_DEPTH:
                raise LayoutError(f"groups nest deeper than {MAX_DEPTH}")
            inner, i = _sequence(src, i + 1, depth + 1)
            if i >= len(src):
                raise LayoutError("a '(' is never closed")
            i += 1  # the ')'
            item = inner
        elif ch in SYMBOLS:
            item, i = ch, i + 1
        else:
            raise LayoutError(f"unknown symbol {ch!r} at position {i}: known are E, t, m, L, "
                              "| and (...)*n")
        times = 1
        if i < len(src) and src[i] == "*":
            j = i + 1
            while j < len(src) and src[j].isdigit() and j - i <= 7:
                j += 1
            if j == i + 1:
                raise LayoutError(f"'*' at position {i} needs a count")
            times, i = int(src[i + 1:j]), j
        size += len(item) * times
        if size > MAX_UNITS:
            raise LayoutError(f"unrolls to more than {MAX_UNITS} symbols")
        out.append(item * times)
    return "".join(out), i


def _check_order(expanded: str) -> None:
    units = expanded.replace("|", "")
    if units.count("E") != 1 or not units.startswith("E"):
        raise LayoutError("the embedding E must come first, exactly once")
    if units.count("L") != 1 or not units.endswith("L"):
        raise LayoutError("the loss L must come last, exactly once")
    if "m" in units and "t" in units[units.index("m"):]:
        raise LayoutError("transformer layers t must all come before the MTP layers m")


# ----------------------------------------------------------------------------- building

def from_stage_lists(per_stage: Sequence[Sequence[int]]) -> tuple[Chunk, ...]:
    """Chunks from one list of chunk layer counts per pipeline stage (chunk k of stage
    s is virtual stage k*pp + s, Megatron's order); the embedding on the first chunk,
    the loss on the last."""
    pp, vpp = len(per_stage), len(per_stage[0])
    counts = [per_stage[vs % pp][vs // pp] for vs in range(pp * vpp)]
    last = len(counts) - 1
    return tuple(Chunk(layers=n, embedding=vs == 0, loss=vs == last)
                 for vs, n in enumerate(counts))


def with_mtp(chunks: tuple[Chunk, ...], mtp: int) -> tuple[Chunk, ...]:
    """The model's MTP layers placed with the loss (where a chunk list puts them)."""
    if not mtp:
        return chunks
    last = chunks[-1]
    return chunks[:-1] + (Chunk(last.layers, last.embedding, last.loss, mtp),)


def stage_lists(chunks: Sequence[Chunk], pp: int) -> list[list[int]]:
    """Per pipeline stage, the layer counts of its chunks (the inverse of
    :func:`from_stage_lists`)."""
    vpp = len(chunks) // pp
    return [[chunks[k * pp + s].layers for k in range(vpp)] for s in range(pp)]


def is_plain(chunks: Sequence[Chunk], mtp: int) -> bool:
    """The embedding on the first chunk, the loss and every MTP layer on the last: what
    a per-stage list of chunk counts says."""
    last = len(chunks) - 1
    return all(c.embedding == (i == 0) and c.loss == (i == last)
               and c.mtp == (mtp if i == last else 0) for i, c in enumerate(chunks))


def render_layout(chunks: Sequence[Chunk]) -> str:
    """The Megatron layout string of ``chunks``: a run of one symbol as ``t*n``, runs of
    equal virtual stages as ``(...|)*n``. ``parse_layout`` reads it back."""
    parts = [_compact(c.symbols) for c in chunks]
    out: list[str] = []
    i = 0
    while i < len(parts):
        j = i
        while j + 1 < len(parts) and parts[j + 1] == parts[i]:
            j += 1
        n = j - i + 1
        # a repeated middle stage: (x|)*n, then the next stage follows its last '|'
        if n > 2 and j < len(parts) - 1:
            out.append(f"({parts[i]}|)*{n},")
        else:
            out.append("|".join(parts[i:j + 1]) + ("|" if j < len(parts) - 1 else ""))
        i = j + 1
    return "".join(out)


def _compact(symbols: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(symbols):
        j = i
        while j < len(symbols) and symbols[j] == symbols[i]:
            j += 1
        n = j - i
        out.append(symbols[i] + (f"*{n}" if n > 2 else symbols[i] * (n - 1)))
        i = j
    return "".join(out)


@memo(4096)
def uniform_stages(layers: int, pp: int) -> tuple[int, ...]:
    """Split layers as evenly as possible. The remainder goes one layer each to the
    stages nearest the middle: the first stage also holds the embedding and the most
    in-flight activations, the last the output layer and the logits, so they get an
    extra layer only when every middle stage has one."""
    base, extra = divmod(layers, pp)
    order = sorted(range(pp), key=lambda s: (s in (0, pp - 1), abs(s - (pp - 1) / 2), s))
    counts = [base] * pp
    for s in order[:extra]:
        counts[s] += 1
    return tuple(counts)


def chunk_stage_layers(chunks: tuple[Chunk, ...], pp: int) -> tuple[int, ...]:
    """Layers per pipeline stage: the sum over its chunks (virtual stage i on rank
    i % pp)."""
    out = [0] * pp
    for vs, c in enumerate(chunks):
        out[vs % pp] += c.layers
    return tuple(out)
