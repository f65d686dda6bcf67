"""Megatron-LM ``pretrain_gpt.py`` arguments for a plan.

Argument names are checked against Megatron-LM's argument parser (``tests/data/megatron_arg_names.txt``, read
from ``megatron/training/arguments.py``; formulas.md Sec. 7.1).
"""
from __future__ import annotations

from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec


def megatron_args(model: ModelSpec, job: TrainingJob, par: ParallelConfig) -> list[str]:
    """The argument list (flags and values as separate strings) for ``pretrain_gpt.py``."""
    a: list[str] = []
    add = a.extend
    add(["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
         "--num-attention-heads", str(model.num_attention_heads), "--ffn-hidden-size", str(model.ffn_hidden_size),
         "--seq-length", str(job.seq_length), "--max-position-embeddings", str(max(job.seq_length, model.max_position_embeddings))])
    if model.num_kv_heads != model.num_attention_heads:
        add(["--group-query-attention", "--num-query-groups", str(model.num_kv_heads)])
    if model.head_dim * model.num_attention_heads != model.hidden_size:
        add(["--kv-channels", str(model.head_dim)])
    if model.gated_mlp:
        a.append("--swiglu")
    if model.normalization == "rmsnorm":
        add(["--normalization", "RMSNorm"])
    if model.position_embedding == "rope":
        add(["--position-embedding-type", "rope"])
    if not model.linear_bias:
        a.append("--disable-bias-linear")
    if model.qkv_bias and not model.linear_bias:
        a.append("--add-qkv-bias")
    if not model.tie_word_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if model.moe is not None:
        add(["--num-experts", str(model.moe.num_experts), "--moe-router-topk", str(model.moe.top_k),
             "--moe-ffn-hidden-size", str(model.moe.expert_ffn_hidden_size), "--moe-grouped-gemm",
             "--moe-token-dispatcher-type", "alltoall"])
        if model.moe.shared_expert_ffn_hidden_size:
            add(["--moe-shared-expert-intermediate-size", str(model.moe.shared_expert_ffn_hidden_size)])
    add(["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)])
    if par.cp > 1:
        add(["--context-parallel-size", str(par.cp)])
    if par.ep > 1:
        add(["--expert-model-parallel-size", str(par.ep), "--expert-tensor-parallel-size", str(par.expert_tp)])
    if par.first_stage_layers is not None:
        add(["--decoder-first-pipeline-num-layers", str(par.first_stage_layers)])
    if par.last_stage_layers is not None:
        add(["--decoder-last-pipeline-num-layers", str(par.last_stage_layers)])
    if par.vpp > 1:
        add(["--num-virtual-stages-per-pipeline-rank", str(par.vpp)])
    if par.sequence_parallel:
        a.append("--sequence-parallel")
    add(["--micro-batch-size", str(par.micro_batch_size), "--global-batch-size", str(job.global_batch_size)])
    if par.recompute == "selective":
        add(["--recompute-granularity", "selective"])
    elif par.recompute == "full":
        n = par.recompute_num_layers
        if n is None:
            n = 1  # uniform method, 1 layer per group = every layer recomputed
        add(["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", str(n)])
    if par.zero_stage >= 1:
        a.append("--use-distributed-optimizer")
        a.append("--overlap-param-gather")
    if par.dp * par.cp > 1:
        a.append("--overlap-grad-reduce")
    if job.precision == "fp16":
        a.append("--fp16")
    else:
        a.append("--bf16")
    if job.precision == "fp8":
        add(["--fp8-format", "hybrid"])
    if not job.flash_attention:
        add(["--attention-backend", "unfused"])
    return a
