"""Measure on real devices: microbenchmarks (``autoplan bench``), their profiles, and
running a plan for real (``autoplan validate``). torch is the optional ``bench`` extra;
only the modules that run kernels import it."""
