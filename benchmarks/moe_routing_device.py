"""Measure one MoE layer's routing bookkeeping on one GPU: router top-k, the load-balancing loss, the token
permutation, the chunk sort after the all-to-all and the un-permutation, forward and backward, as Megatron-LM runs
them (no all-to-all, no expert GEMM: those are other terms of plan3d's model).

Why: plan3d's routing term (``cost_models.moe_overhead.moe_routing_s``) charges the fused router kernel and the
permutation's HBM bytes at the share of the bandwidth these kernels reach; this run measured both
(``ROUTER_KERNEL_S``, ``PERMUTE_HBM_FRACTION``; before it, 4 HBM passes at the datasheet rate and a fitted constant per
routed copy). ``benchmarks/moe_routing_measured.py`` derives the constants and sets the model against the figures.

What it runs, per MoE model shape (hidden, experts, top-k, score function) and tokens per GPU (micro-batch x
sequence / CP, / TP under sequence parallelism):

- ``router``: Megatron-LM's unfused router (``megatron/core/transformer/moe/moe_utils.py``,
  ``topk_routing_with_score_function`` and ``switch_load_balancing_loss_func`` at d98e8a64dd, 2026): top-k then
  softmax over the k (Qwen3, Mixtral) or sigmoid, biased top-k, gather and normalise (DeepSeek-V3); the dense
  ``[tokens, experts]`` probabilities and routing map by scatter; the switch load-balancing loss over the softmax
  scores; forward and autograd backward. The router GEMM is not included (a GEMM term).
- ``fused``: ``--moe-permute-fusion``: Transformer Engine 2.8's Triton kernels (``te_v2_8_permutation.py``,
  vendored): ``make_row_id_map``, ``permute_with_mask_map`` with the probabilities, ``sort_chunks_by_map`` to the
  local-expert order and back (as ``MoEAlltoAllTokenDispatcher`` does with EP > 1 and several local experts), and
  ``unpermute_with_mask_map``; their backward calls as TE's autograd functions make them. ``fused_nosort``: the same
  without the chunk sorts (the flex dispatcher's permutation, or one local expert); ``row_id_map``: the map alone.
- ``topk``: ``torch.topk`` over the ``[tokens, experts]`` logits alone, forward: the floor of a fused router
  (``--moe-router-fusion``, one Transformer Engine kernel forward and one backward).
- ``unfused``: the same steps in PyTorch as ``moe_utils.permute`` / ``sort_chunks_by_idxs`` / ``unpermute`` run them
  without fusion (argsort of the transposed map, ``index_select``, split + cat, ``scatter_add_``), with autograd.
- ``copy``: one ``copy_`` of the routed copies (``top_k x tokens x hidden`` BF16): the HBM rate at that size.

Each is timed two ways: ``gpu_s``, the GPU time with the host ahead (a spin kernel holds the stream while the host
enqueues the calls, then CUDA events around them), and ``wall_s``, host + GPU from a synchronised start to a
synchronised end (as after dropless routing's device-to-host sync, where the host cannot run ahead).

Run on a GPU: ``python3 benchmarks/moe_routing_device.py --out moe_routing.json``; ``--dry-run`` runs the PyTorch
paths on tiny shapes on the CPU (under ``TRITON_INTERPRET=1``, where Triton is installed, also the row-id map; Triton
3.6's interpreter cannot run the permutation kernels' data-dependent loops, so their records carry the error). On the
H200 run of 2026-12-04 the first ``fused`` call (Qwen3-30B-A3B, 2,048 tokens) failed to compile ("Unsupported function
referenced: get_int_dtype") and every later one ran; that record keeps its error.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_device import environment, log, nvidia_smi  # noqa: E402  (benchmarks/ sibling)

#: MoE shapes of the published runs plan3d validates on (the model zoo's figures): hidden, routed experts, top-k,
#: score function.
MODELS = {"qwen3-30b-a3b": (2048, 128, 8, "softmax"), "qwen3-235b-a22b": (4096, 128, 8, "softmax"),
          "deepseek-v3": (7168, 256, 8, "sigmoid"), "mixtral-8x7b": (4096, 8, 2, "softmax")}
TOKENS = (2048, 4096, 8192, 16384)
#: Expert-parallel ranks the chunk sort is laid out for (experts / EP local experts on each).
EP = 8
AUX_LOSS_COEFF = 1e-3


def route(logits: torch.Tensor, top_k: int, score: str, bias: torch.Tensor):
    """Megatron-LM's unfused router: (dense probabilities, routing map, load-balancing loss)."""
    if score == "softmax":
        top, idx = torch.topk(logits, k=top_k, dim=1)
        probs = torch.softmax(top, dim=-1, dtype=torch.float32)
        aux_scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
        _, idx = torch.topk(scores + bias, k=top_k, dim=1)
        probs = torch.gather(scores, dim=1, index=idx)
        probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
        aux_scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    dense = torch.zeros_like(logits).scatter(1, idx, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, idx, 1).bool()
    tokens_per_expert = routing_map.sum(dim=0)
    n, e = logits.shape
    aux = torch.sum(aux_scores.sum(dim=0) * tokens_per_expert) * (e * AUX_LOSS_COEFF / (top_k * n * n))
    return dense, routing_map, aux


def chunk_order(experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Megatron-LM ``MoEAlltoAllTokenDispatcher``'s chunk orders: received chunks (rank, local expert) to
    (local expert, rank) and back."""
    local = experts // EP if experts >= EP else 1
    ranks = experts // local
    fwd = torch.arange(ranks * local).reshape(ranks, local).T.ravel()
    back = torch.arange(ranks * local).reshape(local, ranks).T.ravel()
    return fwd, back


class Case:
    """One shape's tensors: tokens [T, h] BF16, router logits [T, E] FP32, and the gradients the backward gets."""

    def __init__(self, device: str, tokens: int, hidden: int, experts: int, top_k: int, score: str):
        g = torch.Generator(device="cpu").manual_seed(0)
        self.t, self.h, self.e, self.k, self.score = tokens, hidden, experts, top_k, score
        self.n_out = tokens * top_k
        self.x = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
        self.logits = torch.randn(tokens, experts, generator=g).to(device)
        self.bias = torch.zeros(experts, device=device)
        self.g_out = torch.randn(tokens, hidden, generator=g).to(device=device, dtype=torch.bfloat16)
        self.g_probs = torch.randn(self.n_out, generator=g).to(device)
        with torch.no_grad():
            _, self.routing_map, _ = route(self.logits, top_k, score, self.bias)
            self.probs = torch.zeros(tokens, experts, device=device).masked_fill(self.routing_map, 1.0 / top_k)
        self.split_sizes = self.routing_map.sum(dim=0).to(torch.int32)
        order, back = chunk_order(experts)
        self.order, self.back = order.to(device), back.to(device)
        self.order_host, self.back_host = order.tolist(), back.tolist()
        self.sizes_host = self.split_sizes.tolist()
        self.sort = experts > EP  # several local experts per EP rank: the dispatcher sorts chunks

    def router(self) -> None:
        logits = self.logits.detach().requires_grad_(True)
        dense, _, aux = route(logits, self.k, self.score, self.bias)
        torch.autograd.backward([dense, aux], [self.probs, torch.ones_like(aux)])

    def topk(self) -> None:
        torch.topk(self.logits, k=self.k, dim=1)

    def fused(self, te, sort: bool = True) -> None:
        t, e, h, n = self.t, self.e, self.h, self.n_out
        sort = sort and self.sort
        row_id_map = te.make_row_id_map(self.routing_map, t, e)
        xp, _, pp = te.permute_with_mask_map(self.x, row_id_map, self.probs, None, t, e, n, h, None)
        if sort:
            fwd_map = te.make_chunk_sort_map(self.split_sizes, self.order, n, e)
            back_sizes = self.split_sizes[self.order]
            back_map = te.make_chunk_sort_map(back_sizes, self.back, n, e)
            xp, pp = te.sort_chunks_by_map(xp, fwd_map, pp, n, h, True)
            xp, _ = te.sort_chunks_by_map(xp, back_map, None, n, h, True)  # expert output back to rank order
        out, _ = te.unpermute_with_mask_map(xp, row_id_map, None, None, t, e, h)
        # backward: unpermute's (a permute of the gradient), the two sorts reversed, permute's (with probs)
        g, _, _ = te.permute_with_mask_map(self.g_out, row_id_map, None, None, t, e, n, h, None)
        gp = self.g_probs
        if sort:
            g, _ = te.sort_chunks_by_map(g, back_map, None, n, h, False)
            g, gp = te.sort_chunks_by_map(g, fwd_map, gp, n, h, False)
        te.unpermute_with_mask_map(g, row_id_map, None, gp, t, e, h)
        del out

    def unfused(self) -> None:
        x = self.x.detach().requires_grad_(True)
        probs = self.probs.detach().requires_grad_(True)
        rmap = self.routing_map.bool().T.contiguous()
        flat = rmap.reshape(-1).argsort(descending=True, stable=True)[: self.n_out]
        sorted_idx = flat % self.t
        pp = probs.T.contiguous().reshape(-1)[flat]
        xp = x.index_select(0, sorted_idx)
        if self.sort:
            chunks = torch.split(xp, self.sizes_host, dim=0)
            xp = torch.cat([chunks[i] for i in self.order_host], dim=0)
            sizes = [self.sizes_host[i] for i in self.order_host]
            chunks = torch.split(xp, sizes, dim=0)
            xp = torch.cat([chunks[i] for i in self.back_host], dim=0)
        xp = xp * pp.unsqueeze(-1).to(xp.dtype)
        out = torch.zeros(self.t, self.h, dtype=xp.dtype, device=xp.device)
        out = out.scatter_add(0, sorted_idx.unsqueeze(1).expand(-1, self.h), xp)
        out.backward(self.g_out)


def gpu_seconds(device: str, fn, reps: int) -> tuple[float, float]:
    """(GPU seconds per call with the host ahead, host seconds to enqueue one call). A spin kernel holds the
    stream while the calls are enqueued, so the events bracket GPU work only, unless enqueueing outlasts the spin
    (then the second figure is at least the first)."""
    fn()
    if device != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = (time.perf_counter() - t0) / reps
        return dt, dt
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(0.25 * 1.98e9))  # ~250 ms at the H200's 1,980 MHz boost clock
    t0 = time.perf_counter()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    enqueue = (time.perf_counter() - t0) / reps
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps, enqueue


def wall_seconds(device: str, fn, reps: int) -> float:
    """Median host + GPU seconds of one call from a synchronised start to a synchronised end."""
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_te(device: str):
    """The vendored TE 2.8 Triton permutation module, or None where Triton cannot run (CPU without
    ``TRITON_INTERPRET=1``)."""
    if device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return None
    try:
        import te_v2_8_permutation as te
    except ImportError:
        return None
    te.DEVICE = device
    if device != "cuda":  # the interpreter has no driver to autotune on: each autotuned kernel runs its first config
        from triton.runtime.autotuner import Autotuner
        for name in dir(te):
            if isinstance(getattr(te, name), Autotuner):
                setattr(te, name, _FirstConfig(getattr(te, name)))
    return te


class _FirstConfig:
    """An autotuned Triton kernel that launches its first config (the CPU dry run's stand-in)."""

    def __init__(self, tuner):
        self.fn, self.kwargs = tuner.fn, tuner.configs[0].kwargs

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.fn[grid](*args, **kwargs, **self.kwargs)


def measure(device: str, dry: bool, report: dict, out: Path) -> list[dict]:
    """Every model x tokens x path record; ``report`` is written to ``out`` after each model (a run stopped at its
    time limit keeps what it measured)."""
    te = load_te(device)
    models = {"tiny": (64, 16, 4, "softmax"), "tiny-sigmoid": (64, 16, 2, "sigmoid")} if dry else MODELS
    tokens = (32, 64) if dry else TOKENS
    reps = 3 if dry else 10
    rows = []
    for name, (hidden, experts, top_k, score) in models.items():
        for t in tokens:
            case = Case(device, t, hidden, experts, top_k, score)
            dst = torch.empty(case.n_out, hidden, dtype=torch.bfloat16, device=device)
            src = torch.randn(case.n_out, hidden, device=device).to(torch.bfloat16)
            paths = {"router": case.router, "unfused": case.unfused, "copy": lambda: dst.copy_(src)}
            paths["topk"] = case.topk
            if te is not None:
                paths["fused"] = lambda: case.fused(te)
                paths["row_id_map"] = lambda: te.make_row_id_map(case.routing_map, t, experts)
                if case.sort:
                    paths["fused_nosort"] = lambda: case.fused(te, sort=False)
            for path, fn in paths.items():
                row = {"model": name, "hidden": hidden, "experts": experts, "top_k": top_k, "score": score,
                       "tokens": t, "routed_copies": case.n_out, "ep": EP, "chunk_sort": case.sort, "path": path}
                try:
                    for _ in range(2):  # warm-up (Triton autotuning on the first calls)
                        fn()
                    row["gpu_s"], row["enqueue_s"] = gpu_seconds(device, fn, reps)
                    row["wall_s"] = wall_seconds(device, fn, reps)
                    if path == "copy":
                        row["bytes_moved"] = 2 * 2 * case.n_out * hidden
                except Exception as exc:  # noqa: BLE001 - record it, measure the rest
                    row["error"] = repr(exc)[:300]
                rows.append(row)
            log(f"{name} T={t}: " + ", ".join(f"{r['path']} {r.get('gpu_s', float('nan')) * 1e6:.0f} us"
                                             for r in rows[-len(paths):]))
        report["moe_routing"] = rows
        out.write_text(json.dumps(report, indent=1))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output JSON path")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU")
    args = ap.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --dry-run not given and no CUDA device is visible", file=sys.stderr)
        return 2
    report = {"environment": environment(device), "nvidia_smi_before": nvidia_smi() if device == "cuda" else None,
              "triton_te_version": "2.8 (vendored)" if load_te(device) is not None else None}
    measure(device, args.dry_run, report, Path(args.out))
    if device == "cuda":
        report["nvidia_smi_after"] = nvidia_smi()
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
