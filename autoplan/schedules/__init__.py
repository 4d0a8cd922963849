"""Pipeline schedules as per-stage operation orders, and their simulator.

One file per schedule registers it (``registry.py``); importing this package registers
the built-in ones, in the order below (the order ties in the ranking are broken by):

- ``gpipe.py``, ``one_f_one_b.py``, ``interleaved.py``: fused backward;
- ``zb_h1.py``, ``zb_h2.py``: zero bubble, B and W apart (Qi et al. 2024);
- ``zb_v.py``, ``v_half.py``, ``v_min.py``: two chunks per stage in a V (``vblock.py``:
  the V-Half / V-Min building blocks);
- ``bfpp.py``: breadth-first over looped chunks (Lamy-Poirier 2023).

``orders.py`` places chunks and checks (p, m, v) for any schedule; ``memory.py`` counts
in-flight activations; ``simulator.py`` runs the orders on stage durations.
"""

# isort: off
# registration order, which the ranking's ties follow: keep it
from autoplan.schedules import gpipe
from autoplan.schedules import one_f_one_b
from autoplan.schedules import interleaved
from autoplan.schedules import zb_h1
from autoplan.schedules import zb_h2
from autoplan.schedules import zb_v
from autoplan.schedules import v_half
from autoplan.schedules import v_min
from autoplan.schedules import bfpp
# isort: on
from autoplan.schedules.registry import Schedule, ScheduleSpec, register

BUILTIN = (gpipe.GPIPE, one_f_one_b.ONE_F_ONE_B, interleaved.INTERLEAVED, zb_h1.ZB_H1,
           zb_h2.ZB_H2, zb_v.ZB_V, v_half.V_HALF, v_min.V_MIN, bfpp.BFPP)

__all__ = ["BUILTIN", "Schedule", "ScheduleSpec", "register"]
