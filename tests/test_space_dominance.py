"""The context-parallel twin rule (planner.space.dominated_by_cp_twin) never removes a better plan (issue 11).

A point with cp > 1 whose micro-batch shares a factor c > 1 with cp is not listed by either search: its twin
(cp / c, dp x c, mbs / c) runs the same tokens per rank and micro-batches, so the cost models give the twin no
more memory and no more time. Checked here on sampled pairs of several models, clusters and frameworks, and the
twin is checked to be a candidate of the space (it passes the same rules).
"""
from __future__ import annotations

import math
import random

import pytest

from cluster_specs import get_cluster
from cost_models.config import TrainingJob
from cost_models.memory import estimate_memory
from cost_models.step_time import estimate_step
from model_zoo import get_model
from planner.space import SearchSpace, candidates, divisors, dominated_by_cp_twin


@pytest.mark.parametrize("name,cluster,gpus,gbs,seq,fw", [
    ("llama3.1-8b", "dgx-h100", 64, 256, 8192, "megatron"),
    ("mixtral-8x7b", "dgx-h100", 64, 128, 4096, "megatron"),
    ("deepseek-v3", "dgx-h100", 256, 256, 4096, "megatron"),
    ("llama3.1-70b", "gb200-nvl72", 144, 288, 16384, "megatron"),
    ("llama3.1-8b", "dgx-a100-40g", 32, 64, 8192, "torchtitan"),
    ("mixtral-8x7b", "dgx-h100", 32, 64, 8192, "deepspeed"),
])
def test_the_cp_twin_is_never_worse(name, cluster, gpus, gbs, seq, fw):
    m, c = get_model(name), get_cluster(cluster)
    job = TrainingJob(global_batch_size=gbs, seq_length=seq, framework=fw)
    space = SearchSpace(recompute=("full",), zero_stage=(1, 3))
    cands = list(candidates(m, c, job, gpus, space, fw))
    allowed = set(cands)
    pairs = [p for p in cands if dominated_by_cp_twin(p.cp, p.micro_batch_size, space)]
    assert pairs
    random.Random(0).shuffle(pairs)
    for p in pairs[:40]:
        for f in divisors(math.gcd(p.cp, p.micro_batch_size))[1:]:
            q = p.model_copy(update={"cp": p.cp // f, "dp": p.dp * f, "micro_batch_size": p.micro_batch_size // f})
            assert q in allowed, (p, q)
            assert estimate_step(m, c, job, q).step_s <= estimate_step(m, c, job, p).step_s * (1 + 1e-12)
            assert estimate_memory(m, c, job, q).peak_bytes <= estimate_memory(m, c, job, p).peak_bytes * (1 + 1e-12)


def test_pins_keep_the_dominated_point_when_the_twin_is_pinned_out():
    assert dominated_by_cp_twin(4, 2)
    assert not dominated_by_cp_twin(4, 1) and not dominated_by_cp_twin(1, 8) and not dominated_by_cp_twin(4, 3)
    assert not dominated_by_cp_twin(4, 2, SearchSpace(cp=(4,)))                 # twin cp 2 is not allowed
    assert not dominated_by_cp_twin(4, 2, SearchSpace(micro_batch_size=(2,)))  # twin mbs 1 is not allowed
    assert dominated_by_cp_twin(4, 4, SearchSpace(cp=(1, 4), micro_batch_size=(1, 4)))  # c = 4
