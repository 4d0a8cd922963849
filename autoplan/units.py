"""Units defined once: binary bytes, and the most money an option may name.

Binary byte units are integers, so ``n * GiB`` stays exact and whole
(bytes of a count); ``x / GiB`` is the same float as ``x / 2.0**30`` (a division by a
power of two)."""

KiB = 2**10
MiB = 2**20
GiB = 2**30

MAX_MONEY = 1e15  # USD, per GPU-hour or in all: what a price or budget option takes at most
