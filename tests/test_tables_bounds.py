"""The solver's tables are lower bounds of the scalar model, cell by cell (issue 11: the exactness of the branch and
bound and of the re-scoring rests on it).

For sampled candidates of several models (dense, MoE with MLA and a multi-token-prediction layer, FP8 on Hopper
and Blackwell), frameworks and GPU counts: the tight step bound ``A + max(P + D, Z) + O`` of the cell is at most
the scalar step time of the candidate the solver would re-score (full recompute at its fewest recomputed layers),
the memory bound is at most the scalar peak (the rows of every pipeline schedule the search ranks), and the group
bounds (``busiest_rank_bounds``, ``group_bound``) are
at most every cell's tight bound. A bound above a scalar value could make the solver skip the optimum.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from cluster_specs import get_cluster
from cost_models.config import TrainingJob
from model_zoo import get_model
from planner.evaluation import evaluate
from planner.recompute import with_fewest_recomputed_layers
from planner.space import SearchSpace, micro_batch_options, structures, to_parallel, vpp_options
from planner.bound_facts import context, structure_facts
from planner.bound_terms import busiest_rank_bounds, group_bound
from planner.tables import Tables, add_group_tables

CASES = [
    # model, cluster, GPUs, GBS, seq, precision, framework, pinned pipeline schedules (None: all)
    ("llama3.1-8b", "dgx-h100", 16, 64, 4096, "bf16", "megatron", None),
    ("llama3.1-70b", "dgx-a100-80g", 32, 32, 4096, "bf16", "megatron", None),
    ("mixtral-8x7b", "dgx-h100", 32, 64, 4096, "fp8", "megatron", None),
    ("deepseek-v3", "dgx-h100", 256, 256, 4096, "fp8", "megatron", None),
    ("deepseek-v3", "gb200-nvl72", 144, 144, 4096, "fp8", "megatron", None),
    ("mixtral-8x7b", "dgx-a100-80g", 16, 32, 4096, "bf16", "deepspeed", None),
    ("llama3.1-8b", "dgx-h100", 16, 32, 8192, "bf16", "torchtitan", None),
    # the other schedules' rows (planner.tables.schedule_rows): combined 1F1B, ZB-V, DualPipeV
    ("mixtral-8x7b", "dgx-h100", 32, 64, 4096, "bf16", "megatron", ("combined-1f1b",)),
    ("mixtral-8x7b", "dgx-h100", 64, 256, 4096, "fp8", "megatron", ("combined-1f1b",)),
    ("llama3.1-8b", "dgx-h100", 32, 128, 4096, "bf16", "torchtitan", ("zb-v", "dualpipev")),
]
SAMPLES = 80  # cells re-scored per case (deterministic sample)


@pytest.mark.parametrize("name,cluster,gpus,gbs,seq,precision,framework,schedules", CASES)
def test_tables_are_lower_bounds_of_the_scalar_model(name, cluster, gpus, gbs, seq, precision, framework,
                                                     schedules):
    m, c = get_model(name), get_cluster(cluster)
    job = TrainingJob(global_batch_size=gbs, seq_length=seq, precision=precision, framework=framework)
    headroom = 0.05
    limit = c.gpu.memory_bytes * (1 - headroom)
    space = SearchSpace(micro_batch_size=(1, 2, 3, 4), pipeline_schedule=schedules)
    ctx = context(m, c, job, space, framework, headroom)
    rng = random.Random(0)
    sts = list(structures(m, c, job, gpus, space, framework))
    if schedules is not None:  # the structures where the pinned schedules may run
        sts = [st for st in sts if (sf := structure_facts(ctx, st)) is not None and sf.other_schedules]
    rng.shuffle(sts)
    checked = 0
    for st in sts[:40]:
        mbss = micro_batch_options(st, job, space)
        sf = structure_facts(ctx, st) if mbss else None
        if sf is None:
            continue
        one = [vpp_options(m, st, gbs // (b * st.dp), framework, space) == [1] for b in mbss]
        lb0s = busiest_rank_bounds(ctx, sf, list(mbss), one)
        for mbs, lb0 in zip(mbss, lb0s):
            T = Tables()
            add_group_tables(ctx, T, sf, mbs)
            A, P, E, W, X = T.arrays()
            tight = T.tight(A, P)
            peak = (W[:, :, None, None, :] + X[:, :, :, :, None]).max(axis=1)
            valid = np.isfinite(A[:, None, :, None] + P[:, :, :, None] + E[:, None, None, :])
            assert (lb0 <= tight[valid] * (1 + 1e-9)).all()
            lb1, _ = group_bound(ctx, sf, mbs, limit)
            fits = valid & (peak <= limit)
            assert (lb1 <= tight[fits] * (1 + 1e-9)).all()
            cells = [tuple(int(x) for x in ix) for ix in np.argwhere(valid)]
            if schedules is not None:  # the pinned schedules' rows only
                cells = [c for c in cells if T.keys[c[0]][3] is not None]
            for ki, spi, vi, zi in rng.sample(cells, min(2, len(cells))):
                st_, b, rc, sched = T.keys[ki]
                par = to_parallel(st_, b, vi + 1, zi, bool(spi), rc, sched)
                par = with_fewest_recomputed_layers(m, c, job, par, framework, headroom)
                ev = evaluate(m, c, job, par, gpus, headroom, framework)
                assert ev.step is not None
                assert tight[ki, spi, vi, zi] <= ev.step.step_s * (1 + 1e-9), par
                assert peak[ki, spi, vi, zi] <= ev.memory.peak_bytes * (1 + 1e-9), par
                checked += 1
            if checked >= SAMPLES:
                return
    assert checked > 0
