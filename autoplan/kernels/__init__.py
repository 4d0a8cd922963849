"""The primitives floor: what one kernel, one collective or one layer costs, knowing no
parallel axis, no stage and no plan.

- ``flops.py``: model FLOPs (Megatron-LM's MFU formula) and recompute FLOPs;
- ``compute.py``: GEMM, grouped-GEMM and flash-attention kernels on a device (roofline,
  wave quantization, the measured correction a device carries), a layer's times;
- ``comm.py``: alpha-beta collectives on the links a group spans;
- ``memory.py``: bytes per parameter and per layer's activations;
- ``offload.py``: copies over the host link and the CPU optimizer step;
- ``layer.py``: the one layer model both halves read: a layer's GEMM shapes per rank,
  weights per rank (split or replicated), KV bytes, MoE expert coverage.

The axes (``autoplan.parallel``) combine these per axis; ``autoplan.cost`` sums them per
pipeline stage; serving (``autoplan.serving``) sums them per engine iteration.
"""
