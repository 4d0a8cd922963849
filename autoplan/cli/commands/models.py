"""``autoplan models``: the built-in models.
Registered on the one ``app`` (:mod:`autoplan.cli.app`) when :mod:`autoplan.cli.main`
imports this module."""

from __future__ import annotations

from autoplan.cli import output
from autoplan.cli.app import app
from autoplan.cli.options import (
    Format,
    FormatOpt,
)


@app.command()
def models(fmt: FormatOpt = Format.table) -> None:
    """List the built-in models with their parameter counts."""
    from rich.table import Table

    from autoplan.descriptors.library import builtin_names, resolve_model

    rows = [resolve_model(name) for name in builtin_names("model")]
    if fmt is Format.json:
        output.emit_json({"models": [
            {**m.to_dict(), "params_total": m.params_total, "params_active": m.params_active}
            for m in rows]})
        return
    table = Table(title="built-in models", title_justify="left")
    for col in ("name", "layers", "hidden", "heads", "kv", "ffn", "vocab", "activation",
                "experts", "params total", "params active"):
        table.add_column(col, justify="left" if col in ("name", "activation", "experts") else "right")
    for m in rows:
        experts = ""
        if m.is_moe:
            shared = f"+{m.shared_experts}" if m.shared_experts else ""
            experts = f"{m.experts}{shared} top{m.top_k} x {m.expert_width}"
        table.add_row(m.name, str(m.layers), str(m.hidden), str(m.heads),
                      "mla" if m.is_mla else str(m.kv_heads),
                      str(m.ffn_hidden), str(m.vocab), m.activation.value, experts,
                      f"{m.params_total / 1e9:.2f}B", f"{m.params_active / 1e9:.2f}B")
    output.out.print(table)

