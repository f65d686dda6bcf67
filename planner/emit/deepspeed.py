"""DeepSpeed ``ds_config.json`` for a plan (keys from DeepSpeed ``runtime/constants.py`` and
``runtime/zero/config.py``; formulas.md Sec. 7.2)."""
from __future__ import annotations

from cost_models.config import ParallelConfig, TrainingJob

#: DeepSpeed's documented defaults for ZeRO bucket sizes (elements), runtime/zero/config.py.
REDUCE_BUCKET_SIZE = 500_000_000
ALLGATHER_BUCKET_SIZE = 500_000_000


def deepspeed_config(job: TrainingJob, par: ParallelConfig) -> dict:
    """``ds_config.json`` content. ``train_batch_size = micro x grad_accum x dp`` (DeepSpeed's own check)."""
    gas = job.global_batch_size // (par.micro_batch_size * par.dp)
    cfg: dict = {
        "train_batch_size": par.micro_batch_size * gas * par.dp,
        "train_micro_batch_size_per_gpu": par.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": par.zero_stage,
            "contiguous_gradients": True,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": REDUCE_BUCKET_SIZE,
            "allgather_bucket_size": ALLGATHER_BUCKET_SIZE,
        },
    }
    if job.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    else:
        cfg["bf16"] = {"enabled": True}
    if par.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": par.tp > 1,
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    if par.pp > 1:
        cfg["pipeline"] = {"stages": par.pp, "partition": "parameters"}
    return cfg
