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


def test_account_for_embedding_and_loss_split():
    # Megatron get_transformer_layer_offset: L' = 126 + 1 + 1 = 128 over pp 8 x vpp 8 -> 2 per chunk; the first
    # chunk of stage 0 and the last chunk of stage 7 hold one decoder layer (Llama 3.1 405B recipes).
    from cost_models.layout import chunk_layer_counts
    par = ParallelConfig(pp=8, vpp=8, account_for_embedding_in_pipeline_split=True,
                         account_for_loss_in_pipeline_split=True)
    chunks = chunk_layer_counts(126, par)
    assert chunks[0] == [1] + [2] * 7 and chunks[-1] == [2] * 7 + [1] and chunks[3] == [2] * 8
    assert stage_layer_counts(126, par) == [15] + [16] * 6 + [15]
    with pytest.raises(LayoutError, match="not divisible by pp\\*vpp"):
        chunk_layer_counts(126, ParallelConfig(pp=8, vpp=3, account_for_embedding_in_pipeline_split=True))
    with pytest.raises(LayoutError, match="cannot be combined"):
        stage_layer_counts(126, ParallelConfig(pp=8, first_stage_layers=15, account_for_loss_in_pipeline_split=True))


def test_interleaved_chunks_need_divisible_stages():
    from cost_models.layout import chunk_layer_counts
    assert chunk_layer_counts(32, ParallelConfig(pp=4, vpp=2)) == [[4, 4]] * 4
    with pytest.raises(LayoutError, match="not divisible by vpp 3"):
        chunk_layer_counts(32, ParallelConfig(pp=4, vpp=3))


def test_megatron_pipeline_layout_strings():
    from cost_models.layout import balanced_pipeline_layout, chunk_layer_counts, parse_pipeline_layout
    # Megatron-LM's DeepSeek-V3 example for pp 8 x vpp 4: 61 layers + E + MTP + loss in 32 chunks of 2 slots
    chunks = parse_pipeline_layout("Et|(tt|)*30mL")
    assert len(chunks) == 32 and chunks[0] == "Et" and chunks[-1] == "mL"
    par = ParallelConfig(pp=8, vpp=4, pipeline_layout="Et|(tt|)*30mL")
    counts = stage_layer_counts(61, par)
    # chunk i runs on rank i % 8: rank 0 holds chunks 0, 8, 16, 24 = 1 + 2 + 2 + 2; rank 7 ends with "mL"
    assert counts == [7] + [8] * 6 + [6] and chunk_layer_counts(61, par)[0] == [1, 2, 2, 2]
    # a published Megatron MoE recipe layout (shared/data/published_runs.yaml, DeepSeek-V3 on B200, pp 8)
    par = ParallelConfig(pp=8, vpp=2, pipeline_layout="Et*4|(tttt|)*14tmL")
    assert stage_layer_counts(61, par) == [8] * 7 + [5]
    assert balanced_pipeline_layout(61, 8, 4, mtp_layers=1) == "Et|" + "tt|" * 30 + "mL"
    # Megatron-Bridge _get_deepseek_v3_pipeline_layout (4, 4): E + 4, 14 x 4, 1 + mtp + loss
    assert balanced_pipeline_layout(61, 4, 4, mtp_layers=1) == "Etttt|" + "tttt|" * 14 + "tmL"
    with pytest.raises(LayoutError, match="places 60 decoder layers"):
        stage_layer_counts(61, ParallelConfig(pp=8, vpp=4, pipeline_layout="Et|(tt|)*29|tmL"))
    with pytest.raises(LayoutError, match="unknown symbol"):
        parse_pipeline_layout("Ex|tL")


def test_uneven_split_of_an_odd_layer_count_over_an_even_pp():
    # no symmetric split exists (61 - 2x is odd, 14 middle stages): the last stage, which also holds the output
    # layer and the logits, gets one layer fewer than the first (DeepSeek-V3: 3 + 14 x 4 + 2); pp 2: 31 + 30
    assert uneven_split(126, 16) == (7, 7)  # the symmetric split is kept when it exists (Llama 3 405B)
    assert uneven_split(61, 16) == (3, 2) and uneven_split(61, 2) == (31, 30) and uneven_split(47, 16) == (3, 2)
    assert uneven_split(61, 16, asymmetric=False) is None
    par = ParallelConfig(pp=16, first_stage_layers=3, last_stage_layers=2)
    assert stage_layer_counts(61, par) == [3] + [4] * 14 + [2]
