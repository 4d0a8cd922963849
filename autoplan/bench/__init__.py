"""Measure on real devices: microbenchmarks (``autoplan bench``) and running a plan for
real (``autoplan validate``). torch is the optional ``bench`` extra; only the modules that
run kernels import it. The profiles they write, and what is fitted on them, live in
:mod:`autoplan.measured` (no torch)."""
