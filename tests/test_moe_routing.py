"""cost_models.moe_overhead.moe_routing_s: the fused router kernel, the token permutation's counted HBM bytes at
the share of the bandwidth its kernels were measured to reach, and the fitted remainder per routed copy."""
from __future__ import annotations

import pytest

from cluster_specs import get_cluster
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.moe_overhead import (MOE_TOKEN_COPY_S, PERMUTE_HBM_FRACTION, moe_routing_s, permute_passes,
                                      router_kernel_s)
from model_zoo import get_model

H200 = get_cluster("dgx-h200")
Q30 = get_model("qwen3-30b-a3b")  # hidden 2048, 128 experts, top-8
JOB = TrainingJob(global_batch_size=256, seq_length=4096)


def test_permutation_passes_are_counted_from_the_dispatchers():
    # permute (read the token, write its k copies) + unpermute (the reverse) = 2 + 2/k; the alltoall dispatcher's two
    # chunk sorts (read + write each) add 4 (Megatron-LM token_dispatcher.py, sort_chunks_by_idxs)
    assert permute_passes(8, False) == 2.25
    assert permute_passes(8, True) == 6.25
    assert permute_passes(2, False) == 3.0


def test_routing_time_is_the_router_kernel_the_permutation_bytes_and_the_remainder():
    par = ParallelConfig(dp=8, ep=8, micro_batch_size=1)
    tok, copies = 4096, 4096 * 8
    permute = permute_passes(8, True) * copies * 2048 * 2 / (4.8e12 * PERMUTE_HBM_FRACTION)  # BF16 copies
    f, b = moe_routing_s(Q30, H200, JOB, par, 0, "alltoall")
    kernels = router_kernel_s(tok, 128) + permute
    assert f == pytest.approx(kernels + MOE_TOKEN_COPY_S * copies / 3)
    assert b == pytest.approx(kernels + 2 * MOE_TOKEN_COPY_S * copies / 3)
    # the flex dispatchers (DeepEP, HybridEP) sort no chunks: 2.25 passes each way instead of 6.25
    ff, _ = moe_routing_s(Q30, H200, JOB, par, 0, "flex")
    assert f - ff == pytest.approx(4.0 * copies * 2048 * 2 / (4.8e12 * PERMUTE_HBM_FRACTION))
    # one local expert: nothing to sort under alltoall either
    one = ParallelConfig(dp=128, ep=128, micro_batch_size=1)
    assert moe_routing_s(Q30, H200, JOB, one, 0, "alltoall") == moe_routing_s(Q30, H200, JOB, one, 0, "flex")


def test_tokens_per_gpu_and_dense_layers():
    par = ParallelConfig(dp=8, ep=8, micro_batch_size=1)
    f1, _ = moe_routing_s(Q30, H200, JOB, par, 0, "flex")
    f2, _ = moe_routing_s(Q30, H200, JOB, ParallelConfig(dp=8, ep=8, micro_batch_size=2), 0, "flex")
    assert f1 < f2 < 2 * f1  # the router kernel's fixed launch cost does not double
    assert moe_routing_s(get_model("llama3.1-8b"), H200, JOB, ParallelConfig(dp=8), 0, "alltoall") == (0.0, 0.0)
