"""Mixed pools and fallback plans (issue 12): print the search times and the closing note's tables. Not a test.

1. Plans over pools, two pools at 1,024 GPUs (64 DGX H100 + 64 DGX A100 nodes; Llama-3.1-70B and 405B, GBS 1024 x
   8192): the pools search alone (``homogeneous=False``: every subset and order of the pools, flexible layouts) and
   with each single pool's homogeneous search (``plan``'s whole space) added; candidates, splits, full evaluations.
2. The closing note's case: Llama-3.1-70B on 32 H100 + 32 A100 nodes: the plan, H100-only, A100-only and mixed.
3. Fallbacks for Llama-3.1-405B on 16,384 H100s (GBS 2048 x 8192): all K = 16 answers from a plan document, and the
   table for 1..8 lost nodes.

Seconds are wall time and this process's CPU time (the machine is shared; CPU time is what the search costs).
Usage: ``.venv/bin/python benchmarks/bench_pools.py [--quick]`` (``--quick``: skip the 405B pools row).
"""
from __future__ import annotations

import sys
import time


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def pools_row(model: str, spec: str, gbs: int, seq: int) -> None:
    from cluster_specs.pools import load_mixed_cluster
    from cost_models.config import TrainingJob
    from model_zoo import get_model
    from planner.pool_search import search_pools
    m, mc = get_model(model), load_mixed_cluster(spec)
    job = TrainingJob(global_batch_size=gbs, seq_length=seq)
    search_pools(m, mc, job, top_k=1, homogeneous=False)  # warm the imports and caches
    r, wall, cpu = timed(lambda: search_pools(m, mc, job, top_k=5, homogeneous=False))
    r2, wall2, cpu2 = timed(lambda: search_pools(m, mc, job, top_k=5, homogeneous=True))
    b = r.plans[0]
    q = b.parallel
    print(f"{model} over {spec} ({mc.num_gpus} GPUs), GBS {gbs} x {seq}: pools search {wall:.2f} s wall / {cpu:.2f} s "
          f"CPU ({r.num_candidates} candidates, {r.num_split} splits, {r.num_evaluated} full evaluations); with each "
          f"pool's homogeneous search {wall2:.2f} s wall / {cpu2:.2f} s CPU")
    print(f"  best: {' > '.join(mc.pools[i].name for i in b.pools_used)}, tp {q.tp} pp {q.pp} dp {q.dp} cp {q.cp} "
          f"mbs {q.micro_batch_size} zero {q.zero_stage} {q.recompute}, layout {q.pipeline_layout}: "
          f"{b.tokens_per_s:,.0f} tokens/s, MFU {b.estimate.step.mfu:.1%}")
    for s in r2.subsets:
        names = "+".join(mc.pools[i].name for i in s.pools)
        print(f"  subset {names}: " + (f"{s.plan.tokens_per_s:,.0f} tokens/s ({s.plan.source})" if s.plan else
                                       f"none ({s.reason})"))


def closing_note_pools() -> None:
    import planner
    from planner.pool_report import plans_table, subsets_table
    from rich.console import Console
    doc, wall, cpu = timed(lambda: planner.plan_pools("llama3.1-70b", "dgx-h100:32,dgx-a100-80g:32",
                                                      global_batch_size=1024, seq_length=8192, top_k=3))
    con = Console(width=200)
    con.print(plans_table(doc))
    con.print(subsets_table(doc))
    p = doc.plans[0]
    print(f"plan_pools {wall:.2f} s wall / {cpu:.2f} s CPU; best layout {p.parallel.pipeline_layout}; stage seconds "
          f"(F+B per micro-batch) " + ", ".join(f"{s.pool.split('-')[1]}:{s.forward_s + s.backward_s:.3f}"
                                                for s in p.stages))
    for s in doc.subsets:
        print(f"  {' + '.join(s.pools)}: {s.tokens_per_s:,.0f} tokens/s, MFU {s.mfu:.1%} ({s.source})")


def fallback_rows() -> None:
    import planner
    from planner.fallback_report import fallback_table
    from rich.console import Console
    doc, wall, cpu = timed(lambda: planner.plan("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048,
                                                seq_length=8192, top_k=1))
    print(f"original plan (405B, 16,384 H100s): {wall:.2f} s wall / {cpu:.2f} s CPU")
    fb, wall, cpu = timed(lambda: planner.fallback(plan=doc, max_lost_nodes=16))
    st = fb.search_stats
    tm = " ".join(f"{k} {v:.3f}" for k, v in st["timings_s"].items())
    print(f"fallback K=16: {wall:.2f} s wall / {cpu:.2f} s CPU [{tm}]; {st['num_worlds']} world sizes bounded, solved "
          f"{st['solved_worlds']}")
    fb8 = planner.fallback(plan=doc, max_lost_nodes=8)
    Console(width=220).print(fallback_table(fb8))


def main() -> None:
    quick = "--quick" in sys.argv
    pools_row("llama3.1-70b", "dgx-h100:64,dgx-a100-80g:64", 1024, 8192)
    if not quick:
        pools_row("llama3.1-405b", "dgx-h100:64,dgx-a100-80g:64", 1024, 8192)
    closing_note_pools()
    fallback_rows()


if __name__ == "__main__":
    main()
