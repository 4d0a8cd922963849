"""Measured profiles and what is fitted on them; torch-free.

- :mod:`~autoplan.measured.profile`: the profile contract (the CSV ``autoplan bench``
  writes: provenance header, one row per kernel or collective);
- :mod:`~autoplan.measured.machine`: a cluster descriptor of the profiled machine, the
  analytic model's constants fitted on the profile;
- :mod:`~autoplan.measured.surrogate`: the learned correction (random forests of
  measured over analytic time) and its uncertainty band;
- :mod:`~autoplan.measured.shipped`: the profiles shipped under ``profiles/measured/``,
  looked up by the device descriptor they were taken on (and a serving engine's version);
- :mod:`~autoplan.measured.aiconfigurator`: profiles made from NVIDIA AIConfigurator's
  measured kernel tables (``autoplan profiles import aiconfigurator``).

Place in the data flow: above the cost model. This package reads profiles, fits
corrections on them and applies them to descriptors (a device carrying a
:class:`~autoplan.descriptors.hardware.Correction`); the cost model only sees
``Device.correction`` and never imports this package. Measuring (torch) lives in
:mod:`autoplan.bench`, which calls down into this package, never the other way.
"""
