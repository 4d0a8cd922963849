"""One module per parallel axis, each owning everything about its axis.

Each file holds, for its axis: the rules of a valid plan (``Rule`` objects with
stable ids), the degrees the search tries, and the exposed-communication and memory
terms of the cost model.

- ``dp.py`` data parallel and ZeRO: batch divisibility; ZeRO stages per layout;
  gradient sync and ZeRO-3 gathers left exposed, sharded states, the optimizer step.
- ``tp.py`` tensor parallel, sequence parallel as its flag: heads, kv heads and MLP
  width; tp and SP choices; per-layer all-reduces (or AG/RS) and backward overlap.
- ``pp.py`` pipeline: stages, vpp and schedule shapes; pp and (schedule, vpp, split)
  choices; p2p sends, dense layers per stage, the output stage, the uniform split.
- ``cp.py`` context parallel: sequence split and all-to-all heads; cp and ring or
  all-to-all; the exchange left exposed per layer.
- ``ep.py`` expert parallel and expert TP: Megatron-Core's folding rules; ep x etp per
  layout; dispatch/combine all-to-all, routed-expert weights per rank.

``mesh.py`` places every axis's communicator on the cluster in rank order (TP
innermost). ``rules.py`` is the one registry of rules: the plan reader, the search's
pruning (its statistics keyed by rule id) and the exporters all ask it.

Layering: the primitives below (``kernels.comm`` collectives, ``kernels.compute`` kernels,
``kernels.memory`` per-layer bytes, ``kernels.layer`` a layer per rank) know no axis; these
modules combine them per axis; ``cost.stage`` adds the axes up per pipeline stage.
Adding HSDP is a change to ``dp.py``, a new CP variant to ``cp.py``; a new pipeline
schedule is a file of its own under ``schedules/`` (``schedules/registry.py``).
"""
