"""Binary byte units, defined once. Integers, so ``n * GiB`` stays exact and whole
(bytes of a count); ``x / GiB`` is the same float as ``x / 2.0**30`` (a division by a
power of two)."""

KiB = 2**10
MiB = 2**20
GiB = 2**30
