"""The catalogue commands: ``models`` and ``clusters`` (the built-in specs) and ``schema`` (the JSON Schema of
the documents plan3d writes)."""
from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from .app import app
from .options import DocumentKind, Fmt, FmtOpt


ShowOpt = Annotated[Optional[str], typer.Option("--show", help="print this entry as YAML, or JSON with --format json (a "
                                                                "template for your own)")]


def _show_yaml(data: dict, fmt: Fmt = Fmt.table) -> None:
    """One built-in entry: YAML, or JSON with ``--format json`` (both read back by --model / --cluster)."""
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
        return
    import yaml
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=110))


@app.command()
def models(fmt: FmtOpt = Fmt.table, show: ShowOpt = None) -> None:
    """List the built-in models; --show NAME prints one as YAML (the format --model accepts)."""
    from model_zoo import get_model, list_models
    if show is not None:
        _show_yaml(get_model(show).model_dump(mode="json", exclude_defaults=True), fmt)
        return
    rows = []
    for name in list_models():
        s = get_model(name)
        rows.append({"name": name, "num_parameters": s.num_parameters(),
                     "num_active_parameters": s.num_active_parameters(), "num_layers": s.num_layers,
                     "hidden_size": s.hidden_size, "num_attention_heads": s.num_attention_heads,
                     "num_kv_heads": s.num_kv_heads, "experts": s.moe.num_experts if s.moe else None,
                     "source": s.source})
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2, allow_nan=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title="plan3d built-in models")
    for col in ("name", "params", "active", "layers", "hidden", "heads", "kv", "experts", "source"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], f"{r['num_parameters'] / 1e9:.2f}B", f"{r['num_active_parameters'] / 1e9:.2f}B",
                  str(r["num_layers"]), str(r["hidden_size"]), str(r["num_attention_heads"]),
                  str(r["num_kv_heads"]), str(r["experts"] or "-"), r["source"][:60])
    Console(width=200).print(t)


@app.command()
def clusters(fmt: FmtOpt = Fmt.table, show: ShowOpt = None) -> None:
    """List the built-in clusters; --show NAME prints one as YAML (the format --cluster accepts)."""
    from cluster_specs import get_cluster, list_clusters
    if show is not None:
        _show_yaml(get_cluster(show).model_dump(mode="json"), fmt)
        return
    rows = []
    for name in list_clusters():
        c = get_cluster(name)
        rows.append({"name": name, "gpu": c.gpu.name, "memory_bytes": c.gpu.memory_bytes,
                     "gpus_per_node": c.node.gpus_per_node, "nvlink_domain_size": c.node.nvlink_domain_size,
                     "peak_bf16_flops": c.gpu.peak_flops.get("bf16"), "peak_fp8_flops": c.gpu.peak_flops.get("fp8"),
                     "nvlink_bytes_per_s": c.node.nvlink_bandwidth_bytes_per_s,
                     "nic_bytes_per_s": c.network.nic_bandwidth_bytes_per_s, "description": c.description})
    if fmt == Fmt.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2, allow_nan=False) + "\n")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title="plan3d built-in clusters")
    for col in ("name", "GPU", "GiB", "GPUs/node", "NVLink domain", "bf16 TFLOP/s", "fp8 TFLOP/s",
                "NVLink GB/s/dir", "NIC GB/s/dir"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpu"], f"{r['memory_bytes'] / 2**30:.1f}", str(r["gpus_per_node"]),
                  str(r["nvlink_domain_size"]), f"{(r['peak_bf16_flops'] or 0) / 1e12:.0f}",
                  f"{(r['peak_fp8_flops'] or 0) / 1e12:.0f}" if r["peak_fp8_flops"] else "-",
                  f"{r['nvlink_bytes_per_s'] / 1e9:.0f}", f"{r['nic_bytes_per_s'] / 1e9:.3g}")
    Console(width=200).print(t)



@app.command()
def schema(document: Annotated[DocumentKind, typer.Option(
        "--document", help="plan (plan / evaluate --format json), pools (--cluster NAME:NODES,...), comparison "
                           "(--cluster A,B), fallback")] = DocumentKind.plan) -> None:
    """Print the JSON Schema of a document plan3d writes (default: the plan document, ``plan --format json``)."""
    import json

    from ..document import json_schema
    sys.stdout.write(json.dumps(json_schema(document.value), indent=2, allow_nan=False) + "\n")

