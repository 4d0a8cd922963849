"""A plan on disk: ``file.py`` reads a plan file strictly (every axis's rules, the one door
of measured profiles) and writes the document ``search --out`` writes. The data types a plan
is made of are :mod:`autoplan.plan`'s, on the descriptors' floor; this floor sits above the
measured profiles and below the planners (search, serving, tune, bench), which all read plans."""
