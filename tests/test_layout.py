"""Pipeline layer split and rank placement (cost_models.layout)."""
from __future__ import annotations

import pytest

from cost_models.config import ParallelConfig
from cost_models.layout import LayoutError, group_placement, stage_layer_counts, uneven_split


def test_llama3_405b_uneven_split():
    # Llama 3 paper Sec. 3.3.2: 126 layers on 16 stages, one layer fewer on the first and last stage.
    assert uneven_split(126, 16) == (7, 7)
    par = ParallelConfig(pp=16, first_stage_layers=7, last_stage_layers=7)
    counts = stage_layer_counts(126, par)
    assert counts == [7] + [8] * 14 + [7] and sum(counts) == 126


def test_even_split_and_errors():
    assert stage_layer_counts(80, ParallelConfig(pp=4)) == [20] * 4
    with pytest.raises(LayoutError, match="not divisible by pp 3"):
        stage_layer_counts(80, ParallelConfig(pp=3))
    with pytest.raises(LayoutError, match="middle pipeline stages"):
        stage_layer_counts(80, ParallelConfig(pp=4, first_stage_layers=3, last_stage_layers=4))


def test_megatron_rank_order_placement():
    # tp-cp-ep-dp-pp order (Megatron parallel_state): on 8-GPU nodes, tp=8 fills a node; dp then has stride 8,
    # one rank per node; with tp=2 the dp group has 4 ranks per node.
    par = ParallelConfig(tp=8, dp=16, pp=4)
    assert group_placement("tp", par, 8).intra_domain
    dp = group_placement("dp", par, 8)
    assert (dp.size, dp.ranks_per_domain, dp.num_domains) == (16, 1, 16)
    par = ParallelConfig(tp=2, dp=16)
    dp = group_placement("dp", par, 8)
    assert (dp.ranks_per_domain, dp.num_domains) == (4, 4)
    # GB200 NVL72: the 72-GPU NVLink domain keeps a tp=8 x dp=8 block together
    assert group_placement("dp", ParallelConfig(tp=8, dp=8), 72).intra_domain


def test_sequence_parallel_off_without_tp():
    # Megatron turns SP off when tp == 1 (arguments.py)
    assert ParallelConfig(tp=1, sequence_parallel=True).sequence_parallel is False
