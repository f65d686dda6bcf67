"""Measure one GPU's per-operation efficiency tables: GEMM, fused attention, HBM and memory-bound kernels.

What it measures (one GPU, PyTorch only: no plan3d import, so it runs on a bare GPU machine's image):

- ``gemm``: dense GEMM throughput (FLOP/s, ``2 M N K`` per product) against ``(M, N, K)`` in BF16 (``F.linear``:
  ``y = x W^T``, the forward layout of a linear layer) and FP8 E4M3 with per-tensor scales (``torch._scaled_mm``, the
  layout Transformer Engine's FP8 GEMMs use); for a subset of shapes also the two backward layouts (``dgrad``:
  ``dY W``; ``wgrad``: ``dY^T X``). The largest rate over the grid is the maximum achievable matmul FLOP/s (MAMF,
  Bekman, ml-engineering ``compute/accelerator/benchmarks/mamf-finder.py``: the same method, a shape sweep on random
  normal operands, mean over timed repeats after warm-up).
- ``attention``: PyTorch SDPA forward and backward TFLOP/s against sequence length for the cuDNN and the
  FlashAttention-2 backends, BF16, causal and full, head dim 64 / 128 / 256. FLOPs as the FlashAttention papers
  count them (Dao 2023, FlashAttention-2, Sec. 4.1; Shah et al. 2024, FlashAttention-3, Sec. 4.1): ``4 s^2 d h``
  per forward and sequence, halved under the causal mask, backward 2.5 x the forward. Batch x sequence = 16,384
  tokens and hidden 2,048 (heads = 2048 / head dim), as in those papers' benchmarks.
- ``hbm``: device-memory bandwidth (bytes read + written per second) of a copy, a read (sum) and a write (fill) over
  2 GiB buffers (STREAM-style; McCalpin 1995).
- ``memory_bound``: bytes/s of the memory-bound kernels a training step runs: fused AdamW on FP32 parameters and
  gradients (28 bytes per parameter: p, g, m, v read, p, m, v written), LayerNorm and RMSNorm forward, SwiGLU
  (``silu(a) * b``, eager: two kernels) and cross-entropy forward + backward on BF16 logits.
- ``grouped_gemm``: MoE expert GEMMs (the expert shapes of four published MoE models) against tokens per expert,
  as one grouped GEMM (``torch._grouped_mm``) and as a loop of one GEMM per expert, which shows the per-GEMM launch
  cost the loop pays.
- ``sustained_gemm`` (not run by default): one 8192^3 GEMM back to back for 20 s with clock and power read after
  each batch: the burst rate of a cold GPU against the rate at its board power limit.
- ``attention_gqa`` (not run by default): SDPA with grouped-query heads (64 query / 8 KV heads, batch 1), the
  shape of NVIDIA's cudnn-frontend benchmark, to set this machine's figures against those published ones.
- ``attention_shape`` (not run by default): causal SDPA at training shapes (4-64 heads per GPU, GQA, strided views,
  micro-batch 1-4, head dim 64 / 128) against the benchmark shape at the same length: the occupancy curve of
  ``cluster_specs/data/efficiency/attention.yaml``.
- ``fp8_accumulation`` (not run by default): FP8 GEMMs with fast and with split (FP32-promoting) accumulation, the two
  modes Transformer Engine runs forward and backward on Hopper, next to BF16 at the same shapes.
- ``layer_step`` (not run by default): forward + backward of two small decoder stacks, kernel time by class under
  ``torch.profiler`` (``benchmarks/layer_step_measured.py`` sets the model's terms against it).

Run on a GPU: ``python3 benchmarks/measure_device.py --out measurements.json``. ``--dry-run`` runs every code path on
tiny shapes on the CPU (the test of this script). Each section records its own error and the others still run.
The output JSON holds the device, driver, PyTorch / CUDA / cuDNN versions, clocks and power read by ``nvidia-smi``
before and after, and one record per measurement. ``cluster_specs/data/efficiency/`` holds what plan3d ships of it,
with the date and machine it was measured on.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F

GEMM_M = (1024, 2048, 4096, 8192, 16384)
GEMM_N = (512, 1024, 2048, 4096, 8192, 16384, 28672)
GEMM_K = (512, 1024, 2048, 4096, 8192, 16384)
#: (M, N, K) timed in all three linear-layer layouts: Llama-like layer GEMMs at 8k tokens per micro-batch.
GEMM_LAYOUT_SHAPES = ((8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336), (8192, 6144, 4096),
                      (8192, 1024, 4096), (8192, 8192, 8192), (8192, 28672, 8192), (8192, 8192, 28672),
                      (4096, 3584, 8192), (4096, 8192, 3584), (16384, 768, 2048), (16384, 2048, 768))
ATTN_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
ATTN_HEAD_DIMS = (64, 128, 256)
ATTN_TOKENS = 16384
ATTN_HIDDEN = 2048
SUSTAIN_S = 20.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Timer:
    """Times a callable: warm-up calls, then repeats until ``min_s`` of GPU time, mean seconds per call over the
    median of ``trials`` timed batches (CUDA events on a GPU, wall clock on the CPU)."""

    def __init__(self, device: str, min_s: float, trials: int = 3, warmup: int = 3):
        self.device, self.min_s, self.trials, self.warmup = device, min_s, trials, warmup

    def _batch(self, fn, n: int) -> float:
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        one = max(self._batch(fn, 1), 1e-6)
        n = max(1, min(1000, int(self.min_s / one)))
        return statistics.median(self._batch(fn, n) / n for _ in range(self.trials))


def nvidia_smi() -> str | None:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
                               "power.draw,power.limit,temperature.gpu,memory.total", "--format=csv"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - a report, not a failure
        return f"unavailable: {exc}"


def environment(device: str) -> dict:
    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "platform": platform.platform(), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device == "cuda":
        prop = torch.cuda.get_device_properties(0)
        env.update(gpu=prop.name, sm_count=prop.multi_processor_count, memory_bytes=prop.total_memory,
                   capability=f"{prop.major}.{prop.minor}", cudnn=torch.backends.cudnn.version(),
                   nccl=".".join(map(str, torch.cuda.nccl.version())))
    return env


def gemm_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    ms, ns, ks = ((64, 128), (64, 96), (32, 64)) if dry else (GEMM_M, GEMM_N, GEMM_K)
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=device, generator=gen, dtype=torch.float32).to(dtype)

    fp8 = device == "cuda" and hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
    one = torch.ones((), device=device, dtype=torch.float32)
    for m in ms:
        for k in ks:
            x = rand(m, k)
            for n in ns:
                w = rand(n, k)
                flops = 2.0 * m * n * k
                t = timer(lambda: F.linear(x, w))
                rows.append({"dtype": "bf16", "layout": "fprop", "m": m, "n": n, "k": k, "seconds": t,
                             "tflops": flops / t / 1e12})
                if fp8:
                    xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                    try:
                        t8 = timer(lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one,
                                                            out_dtype=torch.bfloat16))
                        rows.append({"dtype": "fp8_e4m3", "layout": "fprop", "m": m, "n": n, "k": k, "seconds": t8,
                                     "tflops": flops / t8 / 1e12})
                    except Exception as exc:  # noqa: BLE001
                        rows.append({"dtype": "fp8_e4m3", "m": m, "n": n, "k": k, "error": repr(exc)[:200]})
                        fp8 = False
                del w
            del x
        log(f"gemm m={m}: {len(rows)} records")
    shapes = ((64, 96, 32),) if dry else GEMM_LAYOUT_SHAPES
    for m, n, k in shapes:
        x, w, dy = rand(m, k), rand(n, k), rand(m, n)
        flops = 2.0 * m * n * k
        for layout, fn in (("fprop", lambda: F.linear(x, w)), ("dgrad", lambda: dy @ w),
                           ("wgrad", lambda: dy.t() @ x)):
            t = timer(fn)
            rows.append({"dtype": "bf16", "layout": layout, "m": m, "n": n, "k": k, "seconds": t,
                         "tflops": flops / t / 1e12, "subset": "layouts"})
    return rows


def sdpa_times(timer: Timer, backend, q, k, v, forward_flops: float, **kwargs) -> dict:
    """Forward and backward seconds and TFLOP/s of one SDPA call on ``backend`` (``forward_flops`` per forward,
    2.5x that per backward): the forward without autograd, the backward as ``autograd.grad`` of one retained forward
    against a random output gradient."""
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        with torch.no_grad():
            forward_s = timer(lambda: F.scaled_dot_product_attention(q, k, v, **kwargs))
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        dout = torch.randn_like(out)
        backward_s = timer(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return {"forward_s": forward_s, "backward_s": backward_s, "forward_tflops": forward_flops / forward_s / 1e12,
            "backward_tflops": 2.5 * forward_flops / backward_s / 1e12}


def attention_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    from torch.nn.attention import SDPBackend

    backends = {"math": SDPBackend.MATH} if dry else {"cudnn": SDPBackend.CUDNN_ATTENTION,
                                                       "flash2": SDPBackend.FLASH_ATTENTION}
    seqs, hds, tokens, hidden = ((64, 128), (64,), 256, 128) if dry else (ATTN_SEQ, ATTN_HEAD_DIMS, ATTN_TOKENS,
                                                                           ATTN_HIDDEN)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows = []
    for name, backend in backends.items():
        for hd in hds:
            heads = hidden // hd
            for s in seqs:
                b = max(1, tokens // s)
                for causal in (True, False):
                    rec = {"backend": name, "head_dim": hd, "heads": heads, "batch": b, "seq": s, "causal": causal}
                    try:
                        q, k, v = (torch.randn(b, heads, s, hd, device=device, dtype=dtype, requires_grad=True)
                                   for _ in range(3))
                        fwd_flops = 4.0 * b * heads * s * s * hd / (2.0 if causal else 1.0)
                        rec.update(sdpa_times(timer, backend, q, k, v, fwd_flops, is_causal=causal))
                    except Exception as exc:  # noqa: BLE001
                        rec["error"] = repr(exc)[:300]
                    rows.append(rec)
        log(f"attention {name}: {len(rows)} records")
    return rows


def hbm_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    n = (1 << 20) if dry else (1 << 30)  # bf16 elements: 2 GiB
    a = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    b = torch.empty_like(a)
    nbytes = a.numel() * a.element_size()
    rows = []
    for name, fn, moved in (("copy", lambda: b.copy_(a), 2 * nbytes), ("read_sum", lambda: a.sum(dtype=torch.float32),
                                                                        nbytes),
                            ("write_fill", lambda: b.fill_(1.0), nbytes)):
        t = timer(fn)
        rows.append({"kernel": name, "buffer_bytes": nbytes, "bytes_moved": moved, "seconds": t,
                     "bytes_per_s": moved / t})
    return rows


def memory_bound_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    rows = []
    # fused AdamW: FP32 params and grads, 8 tensors (a Megatron distributed-optimizer shard is a few flat buffers)
    per = (1 << 16) if dry else (1 << 26)
    params = [torch.zeros(per, device=device, dtype=torch.float32, requires_grad=True) for _ in range(8)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-4, fused=(device == "cuda"))
    t = timer(opt.step)
    count = per * len(params)
    rows.append({"kernel": "adamw_fused_fp32", "params": count, "seconds": t, "seconds_per_param": t / count,
                 "bytes_per_param": 28, "bytes_per_s": 28 * count / t})
    del params, opt
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokens, hidden = (256, 128) if dry else (16384, 8192)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    weight = torch.ones(hidden, device=device, dtype=dtype)
    el = x.element_size() * x.numel()
    t = timer(lambda: F.layer_norm(x, (hidden,), weight, weight))
    rows.append({"kernel": "layer_norm_fwd", "shape": [tokens, hidden], "seconds": t, "bytes_per_s": 2 * el / t})
    if hasattr(F, "rms_norm"):
        t = timer(lambda: F.rms_norm(x, (hidden,), weight))
        rows.append({"kernel": "rms_norm_fwd", "shape": [tokens, hidden], "seconds": t, "bytes_per_s": 2 * el / t})
    y = torch.randn_like(x)
    t = timer(lambda: F.silu(x) * y)
    rows.append({"kernel": "swiglu_eager", "shape": [tokens, hidden], "seconds": t,
                 "bytes_per_s": 3 * el / t, "note": "bytes: a, b read, out written (the eager temporary not counted)"})
    vocab = 1024 if dry else 128256
    ce_tokens = 64 if dry else 8192
    logits = torch.randn(ce_tokens, vocab, device=device, dtype=dtype, requires_grad=True)
    target = torch.randint(0, vocab, (ce_tokens,), device=device)

    def ce():
        loss = F.cross_entropy(logits, target)
        torch.autograd.grad(loss, logits)

    t = timer(ce)
    lb = logits.element_size() * logits.numel()
    rows.append({"kernel": "cross_entropy_fwd_bwd", "shape": [ce_tokens, vocab], "seconds": t, "logit_bytes": lb})
    return rows


#: (name, hidden, moe_ffn): the expert shapes of Qwen3-30B-A3B, Qwen3-235B-A22B, DeepSeek-V3 and gpt-oss (their
#: config.json files); fc1 is hidden -> 2 x ffn (gated), fc2 ffn -> hidden.
EXPERT_SHAPES = (("qwen3-30b-a3b", 2048, 768), ("qwen3-235b-a22b", 4096, 1536), ("deepseek-v3", 7168, 2048),
                 ("gpt-oss", 2880, 2880))
LOCAL_EXPERTS = (4, 16)
TOKENS_PER_EXPERT = (128, 256, 512, 1024, 2048, 4096)


def grouped_gemm_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """MoE expert GEMMs: one grouped GEMM over all local experts (``torch._grouped_mm``, what torchtitan calls;
    Megatron's TEGroupedMLP runs cuBLAS / CUTLASS grouped GEMMs of the same shapes) against a loop of one
    ``F.linear`` per expert (Megatron's SequentialMLP), equal tokens per expert, BF16."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shapes = (("tiny", 64, 32),) if dry else EXPERT_SHAPES
    locals_, tpes = ((2,), (16, 32)) if dry else (LOCAL_EXPERTS, TOKENS_PER_EXPERT)
    grouped = hasattr(torch, "_grouped_mm") and device == "cuda"
    rows = []
    for name, hidden, ffn in shapes:
        for gemm, k, n in (("fc1", hidden, 2 * ffn), ("fc2", ffn, hidden)):
            for e in locals_:
                w = torch.randn(e, n, k, device=device, dtype=dtype)
                for tpe in tpes:
                    x = torch.randn(e * tpe, k, device=device, dtype=dtype)
                    flops = 2.0 * e * tpe * n * k
                    rec = {"model": name, "gemm": gemm, "k": k, "n": n, "local_experts": e, "tokens_per_expert": tpe}
                    chunks = x.split(tpe)
                    t = timer(lambda: [F.linear(c, w[i]) for i, c in enumerate(chunks)])
                    rec.update(loop_s=t, loop_tflops=flops / t / 1e12)
                    if grouped:
                        offs = torch.arange(1, e + 1, device=device, dtype=torch.int32) * tpe
                        try:
                            tg = timer(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs,
                                                                 out_dtype=torch.bfloat16))
                            rec.update(grouped_s=tg, grouped_tflops=flops / tg / 1e12)
                        except Exception as exc:  # noqa: BLE001
                            rec["grouped_error"] = repr(exc)[:200]
                            grouped = False
                    rows.append(rec)
        log(f"grouped gemm {name}: {len(rows)} records")
    return rows


#: (N, K) of the FP8 accumulation comparison: Llama 3 8B / 70B layer GEMMs (QKV, MLP up and down, attention output,
#: one TP-8 shard) and Qwen3-30B-A3B's expert GEMMs; each at ``FP8_ACC_M`` tokens.
FP8_ACC_NK = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (1024, 4096), (8192, 8192), (28672, 8192),
              (8192, 28672), (3584, 8192), (768, 2048), (2048, 768))
FP8_ACC_M = (2048, 4096, 8192, 16384)


def fp8_accumulation_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """FP8 E4M3 GEMMs (``torch._scaled_mm``, per-tensor scales, BF16 output) with the tensor cores' fast accumulation
    and with the split ("2x") accumulator that promotes partial sums to FP32 on the CUDA cores (cuBLASLt
    ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` 1 / 0; ``use_fast_accum``), and BF16 at the same shape. Transformer Engine
    runs its Hopper FP8 forward GEMMs with fast accumulation and its backward ones (dgrad, wgrad) with the split
    accumulator (``transformer_engine/pytorch/module/base.py``: ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = True``,
    ``_2X_ACC_WGRAD = True``). The two modes alternate shape by shape (fast, split, fast, split; the median of each),
    so that both are timed at the same clock under the board's power limit."""
    ms, nks = ((64,), ((96, 32),)) if dry else (FP8_ACC_M, FP8_ACC_NK)
    fp8 = device == "cuda" and hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
    one = torch.ones((), device=device, dtype=torch.float32)
    rows = []
    for m in ms:
        for n, k in nks:
            x = torch.randn(m, k, device=device, dtype=torch.float32).to(torch.bfloat16)
            w = torch.randn(n, k, device=device, dtype=torch.float32).to(torch.bfloat16)
            flops = 2.0 * m * n * k
            rec = {"m": m, "n": n, "k": k, "bf16_s": timer(lambda: F.linear(x, w))}
            if fp8:
                xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                times: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(2):
                    for fast in (True, False):
                        times[fast].append(timer(lambda: torch._scaled_mm(
                            xf, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=fast)))
                rec["fp8_fast_s"] = statistics.median(times[True])
                rec["fp8_split_s"] = statistics.median(times[False])
            for key in [k_ for k_ in rec if k_.endswith("_s")]:
                rec[key[:-len("_s")] + "_tflops"] = flops / rec[key] / 1e12
            rows.append(rec)
        log(f"fp8 accumulation m={m}: {len(rows)} records")
    return rows


def sustained_gemm_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """One 8192^3 GEMM (BF16, then FP8) back to back for ``SUSTAIN_S`` seconds: the TFLOP/s of each ~0.1 s batch,
    and the SM clock and board power ``nvidia-smi`` reads every 0.5 s beside it (records with ``smi``). Shows the burst rate of a cold GPU against the
    rate once it holds its board power limit (a training step runs at the latter)."""
    size, seconds = (128, 0.05) if dry else (8192, SUSTAIN_S)
    x = torch.randn(size, size, device=device, dtype=torch.float32).to(torch.bfloat16)
    w = torch.randn(size, size, device=device, dtype=torch.float32).to(torch.bfloat16)
    one = torch.ones((), device=device, dtype=torch.float32)
    kinds = [("bf16", lambda: F.linear(x, w))]
    if device == "cuda" and hasattr(torch, "_scaled_mm"):
        xf, wf = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        kinds.append(("fp8_e4m3", lambda: torch._scaled_mm(xf, wf.t(), scale_a=one, scale_b=one,
                                                           out_dtype=torch.bfloat16)))
    rows = []
    for dtype, fn in kinds:
        if device == "cuda":
            time.sleep(5.0)  # let the GPU cool back towards idle clocks between the two
        samples: list[tuple[float, str | None]] = []
        stop = threading.Event()

        def sample():  # nvidia-smi in a thread, so that the GPU loop never waits on it
            while not stop.is_set():
                smi = nvidia_smi() if device == "cuda" else None
                samples.append((time.perf_counter(), smi.splitlines()[-1] if smi else None))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        t0 = time.perf_counter()
        sampler.start()
        batches = []
        while time.perf_counter() < t0 + seconds:
            n = 64 if dtype == "bf16" else 128
            batches.append((time.perf_counter() - t0, timer._batch(fn, n) / n))
        stop.set()
        sampler.join()
        for elapsed, t in batches:
            rows.append({"dtype": dtype, "elapsed_s": round(elapsed, 3), "seconds": t,
                         "tflops": 2.0 * size ** 3 / t / 1e12})
        for when, smi in samples:
            rows.append({"dtype": dtype, "elapsed_s": round(when - t0, 3), "smi": smi})
        log(f"sustained {dtype}: {len(rows)} records")
    return rows


def attention_gqa_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """SDPA with the Llama 3.1 70B/405B head layout NVIDIA's cudnn-frontend benchmark uses (64 query heads, 8 KV
    heads, head dim 128, batch 1; ``enable_gqa``), and gpt-oss's (64 / 8, head dim 64), causal, BF16."""
    from torch.nn.attention import SDPBackend

    backends = {"math": SDPBackend.MATH} if dry else {"cudnn": SDPBackend.CUDNN_ATTENTION,
                                                       "flash2": SDPBackend.FLASH_ATTENTION}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    seqs = (64,) if dry else (1024, 2048, 4096, 8192, 16384)
    rows = []
    for name, backend in backends.items():
        for hd, hq, hkv in ((128, 64, 8), (64, 64, 8)):
            for s in seqs:
                rec = {"backend": name, "head_dim": hd, "heads": hq, "kv_heads": hkv, "batch": 1, "seq": s,
                       "causal": True}
                try:
                    q = torch.randn(1, hq, s, hd, device=device, dtype=dtype, requires_grad=True)
                    k, v = (torch.randn(1, hkv, s, hd, device=device, dtype=dtype, requires_grad=True)
                            for _ in range(2))
                    fwd_flops = 4.0 * hq * s * s * hd / 2.0
                    rec.update(sdpa_times(timer, backend, q, k, v, fwd_flops, is_causal=True, enable_gqa=True))
                except Exception as exc:  # noqa: BLE001
                    rec["error"] = repr(exc)[:300]
                rows.append(rec)
        log(f"attention gqa {name}: {len(rows)} records")
    return rows


#: Training-shape attention (``attention_shape``): query heads per GPU after tensor parallelism, and sequence lengths.
SHAPE_HEADS = (4, 8, 16, 32, 64)
SHAPE_SEQ = (2048, 4096, 8192, 16384, 32768)
#: (head dim, micro-batch, sequence lengths) of ``attention_shape``: the main sweep, then micro-batch 2 / 4 and head
#: dim 64 at two lengths each.
SHAPE_VARIANTS = ((128, 1, SHAPE_SEQ), (128, 2, (2048, 8192)), (128, 4, (2048, 8192)), (64, 1, (2048, 8192)))
#: The decoder stacks ``layer_step`` trains, 4 layers each, one sequence: Llama 3 8B's layer (hidden 4096, 32 query /
#: 8 KV heads of 128, SwiGLU FFN 14336; Meta, ``config.json`` of meta-llama/Meta-Llama-3-8B) at 8192 tokens, and one
#: tensor-parallel rank's share of Llama 3 70B's layer at TP 8 (hidden 8192; 64 / 8 heads and FFN 28672 over 8 ranks:
#: 8 query heads, 1 KV head, FFN 3584; no communication) at 4096 tokens: 256 attention thread blocks, low occupancy.
LAYER_SHAPES = ({"model": "llama3-8b-layer", "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "layers": 4,
                 "seq": 8192},
                {"model": "llama3-70b-layer-tp8-rank", "hidden": 8192, "heads": 8, "kv_heads": 1, "ffn": 3584,
                 "layers": 4, "seq": 4096})


def attention_shape_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """Fused causal attention at the shapes a training step calls it with, against the published benchmarks' shape
    at the same sequence length and head dim: the share of the benchmark rate that the call's shape and layout alone
    leave.

    Benchmark shape (FA3 paper Sec. 4.1; the ``attention`` section): 16,384 tokens per batch (batch 1 beyond
    16k), 2048 wide (2048 / head dim heads), contiguous ``[b, h, s, d]``. Training shape: ``B`` sequences
    (micro-batch), ``H`` query heads per GPU with ``max(1, H / 4)`` KV heads (GQA, ``enable_gqa``), q / k / v as the
    ``[b, s, h, d]`` projections a framework transposes to ``[b, h, s, d]`` views (torchtitan
    ``Attention.forward``: ``xq.transpose(1, 2)``), so the kernel sees strided operands. ``SHAPE_VARIANTS`` lists the
    (head dim, micro-batch, sequence lengths) measured: head dim 128 at micro-batch 1 over ``SHAPE_SEQ``, and fewer
    lengths at micro-batch 2 and 4 and at head dim 64, to check that the ratio follows the work units (batch x heads x
    query tiles) alone. FLOPs as the ``attention`` section counts them."""
    from torch.nn.attention import SDPBackend

    backends = {"math": SDPBackend.MATH} if dry else {"cudnn": SDPBackend.CUDNN_ATTENTION,
                                                       "flash2": SDPBackend.FLASH_ATTENTION}
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    heads_list = (2, 4) if dry else SHAPE_HEADS
    variants = ((32, 1, (64,)), (16, 2, (64,))) if dry else SHAPE_VARIANTS
    bench_tokens, bench_width = (128, 64) if dry else (ATTN_TOKENS, ATTN_HIDDEN)
    rows = []
    for name, backend in backends.items():
        for hd, mb, seqs in variants:
            for s in seqs:
                b, bh = max(1, bench_tokens // s), bench_width // hd
                rec = {"backend": name, "shape": "benchmark", "head_dim": hd, "heads": bh, "kv_heads": bh,
                       "batch": b, "seq": s}
                if not any(r.get("shape") == "benchmark" and r["head_dim"] == hd and r["seq"] == s
                           and r["backend"] == name for r in rows):
                    try:
                        q, k, v = (torch.randn(b, bh, s, hd, device=device, dtype=dtype, requires_grad=True)
                                   for _ in range(3))
                        rec.update(sdpa_times(timer, backend, q, k, v, 4.0 * b * bh * s * s * hd / 2.0,
                                              is_causal=True))
                        del q, k, v
                    except Exception as exc:  # noqa: BLE001
                        rec["error"] = repr(exc)[:300]
                    rows.append(rec)
                for h in heads_list:
                    hkv = max(1, h // 4)
                    rec = {"backend": name, "shape": "training", "head_dim": hd, "heads": h, "kv_heads": hkv,
                           "batch": mb, "seq": s}
                    try:
                        q = torch.randn(mb, s, h, hd, device=device, dtype=dtype).transpose(1, 2).requires_grad_()
                        k, v = (torch.randn(mb, s, hkv, hd, device=device, dtype=dtype).transpose(1, 2)
                                .requires_grad_() for _ in range(2))
                        rec.update(sdpa_times(timer, backend, q, k, v, 4.0 * mb * h * s * s * hd / 2.0,
                                              is_causal=True, enable_gqa=hkv != h))
                        del q, k, v
                    except Exception as exc:  # noqa: BLE001
                        rec["error"] = repr(exc)[:300]
                    rows.append(rec)
        log(f"attention shape {name}: {len(rows)} records")
    return rows


def _kernel_class(name: str) -> str:
    """Kernel name -> 'attention', 'gemm' or 'other' (cuDNN / flash attention kernels; cuBLAS / CUTLASS GEMMs)."""
    low = name.lower()
    if any(t in low for t in ("flash", "fmha", "attention", "sdpa", "cudnn_generated")):
        return "attention"
    if any(t in low for t in ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90_", "cublas")):
        return "gemm"
    return "other"


def layer_step_section(device: str, dry: bool, timer: Timer) -> list[dict]:
    """Forward + backward of small decoder stacks (``LAYER_SHAPES``; eager PyTorch, BF16, RMSNorm, SDPA causal GQA
    on the flash backend as torchtitan calls it, SwiGLU), timed whole, and their GPU kernel time by class under
    ``torch.profiler``: the attention kernels' time inside a training step, set against the same call timed alone
    (``attention_shape``). RoPE is left out (a few elementwise kernels)."""
    rows = []
    for shape in LAYER_SHAPES:
        cfg = dict(shape)
        if dry:
            cfg.update(hidden=64, heads=4, kv_heads=2, ffn=128, layers=2, seq=32)
        rows.append(_layer_step(device, dry, timer, cfg))
        log(f"layer step {cfg['model']}: {rows[-1]['step_s']}")
    return rows


def _layer_step(device: str, dry: bool, timer: Timer, cfg: dict) -> dict:
    """One ``layer_step`` record: the stack of ``cfg`` timed, and profiled on a GPU."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    h, nh, nkv, ffn, seq = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["seq"]
    hd = 128 if not dry else 16
    width = nh * hd

    def w(*shape):
        return (torch.randn(*shape, device=device, dtype=dtype) * shape[-1] ** -0.5).requires_grad_()

    layers = [dict(wqkv=w((nh + 2 * nkv) * hd, h), wo=w(h, width), w13=w(2 * ffn, h), w2=w(h, ffn),
                   n1=torch.ones(h, device=device, dtype=dtype, requires_grad=True),
                   n2=torch.ones(h, device=device, dtype=dtype, requires_grad=True)) for _ in range(cfg["layers"])]
    x0 = torch.randn(1, seq, h, device=device, dtype=dtype, requires_grad=True)
    backend = SDPBackend.MATH if dry else SDPBackend.FLASH_ATTENTION

    def step():
        x = x0
        with sdpa_kernel(backend):
            for p in layers:
                y = F.rms_norm(x, (h,), p["n1"])
                q, k, v = F.linear(y, p["wqkv"]).split((nh * hd, nkv * hd, nkv * hd), dim=-1)
                q = q.view(1, seq, nh, hd).transpose(1, 2)
                k = k.view(1, seq, nkv, hd).transpose(1, 2)
                v = v.view(1, seq, nkv, hd).transpose(1, 2)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nkv != nh)
                x = x + F.linear(a.transpose(1, 2).reshape(1, seq, width), p["wo"])
                y = F.rms_norm(x, (h,), p["n2"])
                g, u = F.linear(y, p["w13"]).chunk(2, dim=-1)
                x = x + F.linear(F.silu(g) * u, p["w2"])
        x.float().square().mean().backward()

    rec = {**cfg, "head_dim": hd, "step_s": timer(step)}
    if device == "cuda":
        from torch.profiler import ProfilerActivity, profile

        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        by_class: dict[str, float] = {}
        kernels: dict[str, float] = {}
        for ev in prof.key_averages():
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
            if t <= 0 or ev.key.startswith("aten::"):
                continue
            cls = _kernel_class(ev.key)
            by_class[cls] = by_class.get(cls, 0.0) + t / 3 / 1e6
            if cls == "attention":
                kernels[ev.key[:120]] = round(t / 3 / 1e6, 6)
        rec.update(kernel_s_by_class=by_class, attention_kernels_s=kernels)
    return rec

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output JSON path")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: exercise every code path")
    ap.add_argument("--sections", default="gemm,attention,grouped_gemm,hbm,memory_bound")
    args = ap.parse_args(argv)
    sections = {"hbm": hbm_section, "memory_bound": memory_bound_section, "gemm": gemm_section,
                "attention": attention_section, "grouped_gemm": grouped_gemm_section,
                "sustained_gemm": sustained_gemm_section, "attention_gqa": attention_gqa_section,
                "attention_shape": attention_shape_section, "layer_step": layer_step_section,
                "fp8_accumulation": fp8_accumulation_section}
    unknown = [name for name in args.sections.split(",") if name not in sections]
    if unknown:
        print(f"error: --sections {','.join(unknown)}: allowed {', '.join(sections)}", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --dry-run not given and no CUDA device is visible", file=sys.stderr)
        return 2
    timer = Timer(device, min_s=0.002 if args.dry_run else 0.03)
    report = {"environment": environment(device), "nvidia_smi_before": nvidia_smi() if device == "cuda" else None}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        log(f"section {name}")
        try:
            report[name] = sections[name](device, args.dry_run, timer)
        except Exception as exc:  # noqa: BLE001 - keep the other sections
            report[name] = {"error": repr(exc)[:500]}
        report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - t0, 1)
        if device == "cuda":
            torch.cuda.empty_cache()
            report.setdefault("nvidia_smi_after", {})[name] = nvidia_smi()
        with open(args.out, "w") as fh:  # written after every section: a timed-out run keeps what it measured
            json.dump(report, fh, indent=1)
        log(f"section {name} done in {report['section_seconds'][name]} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
