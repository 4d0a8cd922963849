"""``autoplan hardware``: the built-in GPUs and clusters.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from autoplan.cli import output
from autoplan.cli.app import app
from autoplan.cli.options import (
    Format,
    FormatOpt,
)
from autoplan.units import GiB


@app.command()
def hardware(fmt: FormatOpt = Format.table) -> None:
    """List the built-in devices and clusters."""
    from rich.table import Table

    from autoplan.descriptors.library import builtin_names, resolve_cluster, resolve_device

    devices = [resolve_device(n, "profiles", "device") for n in builtin_names("device")]
    clusters = [resolve_cluster(n) for n in builtin_names("cluster")]
    if fmt is Format.json:
        output.emit_json({"devices": [d.to_dict() for d in devices],
                          "clusters": [c.to_dict() for c in clusters]})
        return
    dt = Table(title="built-in devices", title_justify="left")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "fp4 TFLOP/s", "memory GiB", "HBM GB/s"):
        dt.add_column(col, justify="left" if col == "name" else "right")
    for d in devices:
        fp8, fp4 = (f"{peak / 1e12:.0f}" if peak else "-" for peak in (d.peak_fp8_flops, d.peak_fp4_flops))
        dt.add_row(d.name, f"{d.peak_bf16_flops / 1e12:.0f}", fp8, fp4, f"{d.mem_GiB:.0f}",
                   f"{d.hbm_Bps / 1e9:.0f}")
    ct = Table(title="built-in clusters", title_justify="left")
    for col in ("name", "device", "GPUs/node", "NVLink domain", "intra GB/s", "inter GB/s",
                "host GB/s", "host GiB"):
        ct.add_column(col, justify="left" if col in ("name", "device") else "right")
    for c in clusters:  # host: each GPU's link to host memory, and the node's (offload)
        host = ((f"{round(c.host_link_Bps / 1e9, 1):g}", f"{c.host_mem_bytes / GiB:.0f}")
                if c.host_link_Bps is not None and c.host_mem_bytes is not None else ("-", "-"))
        ct.add_row(c.name, c.device.name, str(c.gpus_per_node), str(c.nvlink_domain),
                   f"{c.intra_node.bandwidth_Bps / 1e9:.0f}", f"{c.inter_node.bandwidth_Bps / 1e9:.0f}",
                   *host)
    output.out.print(dt)
    output.out.print(ct)

