"""Cost of the memory model: one ``estimate_memory`` call (all stages, all phases) and a full per-stage breakdown
(estimate + the plan document's ``MemoryInfo`` + the rich table rendered to text), in microseconds.

Run: .venv/bin/python benchmarks/bench_memory.py   (prints figures; no assertions)
"""
from __future__ import annotations

import io
import statistics
import time

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.memory import estimate_memory
from model_zoo import get_model

CASES = [
    ("llama2-7b dp8 (F06)", "llama2-7b", TrainingJob(global_batch_size=2048, seq_length=2048),
     ParallelConfig(dp=8, micro_batch_size=2, zero_stage=1)),
    ("llama3.1-70b tp8 pp4 dp4", "llama3.1-70b", TrainingJob(global_batch_size=512, seq_length=8192),
     ParallelConfig(tp=8, pp=4, dp=4, zero_stage=1, sequence_parallel=True, recompute="selective")),
    ("llama3.1-405b tp8 pp16 uneven 7+8x14+7", "llama3.1-405b", TrainingJob(global_batch_size=512, seq_length=8192),
     ParallelConfig(tp=8, pp=16, dp=4, vpp=1, zero_stage=1, sequence_parallel=True, recompute="full",
                    first_stage_layers=7, last_stage_layers=7)),
    ("mixtral-8x7b tp2 pp4 ep4 vpp2", "mixtral-8x7b", TrainingJob(global_batch_size=256, seq_length=4096),
     ParallelConfig(tp=2, pp=4, dp=8, ep=4, vpp=2, zero_stage=1, sequence_parallel=True, recompute="selective")),
    ("deepseek-v3 tp1 pp8 ep64 (7+8x6+6)", "deepseek-v3", TrainingJob(global_batch_size=4096, seq_length=4096),
     ParallelConfig(tp=1, pp=8, dp=256, ep=64, etp=1, zero_stage=1, recompute="full",
                    first_stage_layers=7, last_stage_layers=6)),
    ("llama3.1-8b torchtitan fsdp", "llama3.1-8b",
     TrainingJob(global_batch_size=16, seq_length=8192, framework="torchtitan"),
     ParallelConfig(dp=8, micro_batch_size=2, zero_stage=3, recompute="selective")),
]


def _time_us(fn, repeat: int) -> float:
    """Median of ``repeat`` timed calls, microseconds (time.perf_counter)."""
    fn()  # warm caches
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main() -> None:
    from rich.console import Console

    from planner.document import memory_info
    from planner.memory_report import memory_table
    c = get_cluster("dgx-h100")
    print(f"{'case':38s} {'stages':>6s} {'estimate us':>12s} {'breakdown us':>13s} {'peak GiB':>9s}")
    for label, name, job, par in CASES:
        m = get_model(name)
        try:
            est = estimate_memory(m, c, job, par)
        except ValueError as e:  # a layout this model does not allow
            print(f"{label:38s} skipped: {e}")
            continue
        t_est = _time_us(lambda: estimate_memory(m, c, job, par), 200)

        def full():
            e = estimate_memory(m, c, job, par)
            memory_info(e).model_dump_json()
            Console(file=io.StringIO(), width=200).print(memory_table(e, label))

        t_full = _time_us(full, 50)
        print(f"{label:38s} {len(est.stages):6d} {t_est:12.0f} {t_full:13.0f} {est.peak_bytes / 2**30:9.1f}")


if __name__ == "__main__":
    main()
