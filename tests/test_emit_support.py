"""Run the frameworks' own validators on plan3d's emitted launch configs (used by tests/test_emit_validators.py).

Each function raises the framework's own exception when the framework rejects the config. What each
validator covers and how it is called on a CPU machine: shared/data/validators.md (megatron-core 0.16.1,
deepspeed 0.19.8, torchtitan 0.2.2).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import tomllib
from pathlib import Path

DATA = Path(__file__).parent / "data"


def megatron_arg_names() -> tuple[str, set[str]]:
    """(header line with the Megatron-LM commit, every option name its parser accepts)."""
    lines = (DATA / "megatron_arg_names.txt").read_text().splitlines()
    return lines[0], {x.strip() for x in lines[1:] if x.startswith("--")}


def _value(x: str) -> object:
    for conv in (int, float):
        try:
            return conv(x)
        except ValueError:
            pass
    return x


def parse_argv(args: list[str]) -> dict[str, object]:
    """``["--num-layers", "32", "--swiglu", "--recompute-modules", "a", "b"]`` -> ``{"num_layers": 32,
    "swiglu": True, "recompute_modules": ["a", "b"]}`` (argparse's dest rule: dashes to underscores; numbers
    converted; several values = a list)."""
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"value {flag!r} without a flag"
        key = flag[2:].replace("-", "_")
        assert key not in out, f"{flag} given twice"
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        vals = [_value(x) for x in args[i + 1:j]]
        out[key] = True if not vals else vals[0] if len(vals) == 1 else vals
        i = j
    return out


# --------------------------------------------------------------------------------------------------- Megatron
def megatron_validate_args(a: dict, world_size: int, environ=None, device_arch: int = 9) -> int | None:
    """The parallelism rules of Megatron-LM's ``validate_args`` (megatron/training/arguments.py, commit
    000c4ac24f61; not shipped in the megatron-core wheel, validators.md Sec. 3), applied to parsed arguments,
    with its environment checks (``megatron_validate_env``) on ``environ`` (default ``os.environ``).
    Returns the virtual pipeline size Megatron derives (None = no interleaving)."""
    megatron_validate_env(a, os.environ if environ is None else environ, device_arch)
    tp, pp = a.get("tensor_model_parallel_size", 1), a.get("pipeline_model_parallel_size", 1)
    cp = a.get("context_parallel_size", 1)
    assert world_size % (tp * pp * cp) == 0, f"world size ({world_size}) is not divisible by tp*pp*cp"
    dp = world_size // (tp * pp * cp)
    L = a["num_layers"] + int(bool(a.get("account_for_embedding_in_pipeline_split"))) \
        + int(bool(a.get("account_for_loss_in_pipeline_split")))
    n_vpp_flags = sum(k in a for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                                       "pipeline_model_parallel_layout"))
    assert n_vpp_flags <= 1, "No more than one of the virtual-pipeline arguments can be set at the same time"
    uneven = "decoder_first_pipeline_num_layers" in a or "decoder_last_pipeline_num_layers" in a
    vpp = None
    if "pipeline_model_parallel_layout" in a:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
        n_stages = PipelineParallelLayerLayout.get_num_stages_from_str(a["pipeline_model_parallel_layout"])
        assert n_stages % pp == 0, "The length of pipeline_model_parallel_layout must be divisible by pp"
        vpp = n_stages // pp
    elif "num_layers_per_virtual_pipeline_stage" in a:
        assert not uneven, ("please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel "
                            "degree when enable uneven pipeline parallelism")
        assert L % pp == 0, "number of layers of the model must be divisible pipeline model parallel size"
        assert (L // pp) % a["num_layers_per_virtual_pipeline_stage"] == 0, \
            "number of layers per pipeline stage must be divisible number of layers per virtual pipeline stage"
        vpp = (L // pp) // a["num_layers_per_virtual_pipeline_stage"]
    elif "num_virtual_stages_per_pipeline_rank" in a:
        vpp = a["num_virtual_stages_per_pipeline_rank"]
    elif not uneven:
        assert L % pp == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
    if vpp == 1:
        vpp = None
    if vpp is not None:
        overlap_p2p = not a.get("no_overlap_p2p_communication", False)
        assert pp > (1 if overlap_p2p else 2), "interleaved schedule needs a larger pipeline-model-parallel size"
    if a.get("overlap_param_gather"):
        assert a.get("use_distributed_optimizer") or a.get("use_megatron_fsdp"), \
            "--overlap-param-gather only supported with distributed optimizer or megatron fsdp"
        assert a.get("overlap_grad_reduce"), "Must use --overlap-param-gather with --overlap-grad-reduce"
    if a.get("use_megatron_fsdp"):
        assert a.get("ckpt_format") == "fsdp_dtensor", "Megatron FSDP only supports fsdp_dtensor checkpoint format"
    assert not (a.get("fp16") and a.get("bf16")), "fp16 and bf16 are exclusive"
    if "num_experts" in a:
        ep = a.get("expert_model_parallel_size", 1)
        etp = a.get("expert_tensor_parallel_size", tp)
        assert a["num_experts"] % ep == 0, "num_experts must be divisible by expert_model_parallel_size"
        assert world_size % (etp * ep * pp) == 0, "world size not divisible by the expert grid etp*ep*pp"
        if tp > 1 and ep > 1:
            assert a.get("sequence_parallel"), \
                "When using expert parallelism and tensor parallelism, sequence parallelism must be used"
    gbs, mbs = a["global_batch_size"], a["micro_batch_size"]
    assert gbs % (mbs * dp) == 0
    return vpp


def megatron_validate_env(a: dict, environ, device_arch: int = 9) -> None:
    """Every environment check of Megatron-LM's ``validate_args`` (megatron/training/arguments.py, commit
    000c4ac24f61), in its order, on the mapping ``environ``; ``device_arch`` is ``get_device_arch_version()``
    (the compute capability's major number: 9 on Hopper, 10 on Blackwell). Raises AssertionError as Megatron does.

    * L650 (``--use-torch-fsdp2``) and L715 (Megatron-FSDP): "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS
      value large than one".
    * L935-961: tensor or context parallelism before Blackwell: FSDP or ``--overlap-moe-expert-parallel-comm`` only
      warn; otherwise "Using tensor model parallelism or context parallelism require setting the environment
      variable CUDA_DEVICE_MAX_CONNECTIONS to 1".
    * L1078 (``--deterministic-mode``): ``NCCL_ALGO`` one of Tree, Ring, CollnetDirect, CollnetChain, ^NVLS.
    * L1208 (CUDA graphs): no ``expandable_segments:True`` in ``PYTORCH_CUDA_ALLOC_CONF``.
    """
    cdmc = environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    fsdp = a.get("use_torch_fsdp2") or a.get("use_megatron_fsdp")
    if fsdp:
        assert cdmc != "1", "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one"
    tp, cp = a.get("tensor_model_parallel_size", 1), a.get("context_parallel_size", 1)
    if (tp > 1 or cp > 1) and device_arch < 10 and not fsdp and not a.get("overlap_moe_expert_parallel_comm"):
        assert cdmc == "1", ("Using tensor model parallelism or context parallelism require setting the environment "
                             "variable CUDA_DEVICE_MAX_CONNECTIONS to 1")
    if a.get("deterministic_mode"):
        assert environ.get("NCCL_ALGO") in ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS"), \
            "NCCL_ALGO must be one of ['Tree', 'Ring', 'CollnetDirect', 'CollnetChain', '^NVLS']."
    if a.get("cuda_graph_impl", "none") != "none":
        assert "expandable_segments:True" not in environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), \
            "expandable_segments:True may not be safe when using CUDA Graphs with some specific parallel settings."


def megatron_core_config(a: dict, vpp: int | None):
    """megatron-core's ``TransformerConfig`` (or ``MLATransformerConfig``) built from parsed arguments the way
    Megatron-LM's ``core_transformer_config_from_args`` does (arguments.py, commit 000c4ac24f61): copy every
    argument whose dest is a config field, then the manual mappings. Its ``__post_init__`` is the check."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    cls = MLATransformerConfig if a.get("multi_latent_attention") else TransformerConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in a.items() if k in fields}
    kw.pop("fp8", None)
    params_dtype = torch.float16 if a.get("fp16") else torch.bfloat16 if a.get("bf16") else torch.float32
    kw["params_dtype"] = params_dtype
    kw["pipeline_dtype"] = params_dtype
    kw["add_bias_linear"] = not a.get("disable_bias_linear", False)
    kw["num_moe_experts"] = a.get("num_experts")
    kw["num_layers_in_first_pipeline_stage"] = a.get("decoder_first_pipeline_num_layers")
    kw["num_layers_in_last_pipeline_stage"] = a.get("decoder_last_pipeline_num_layers")
    kw["virtual_pipeline_model_parallel_size"] = vpp
    kw["fp8"] = a.get("fp8_format")
    if a.get("swiglu"):
        kw["activation_func"] = F.silu
        kw["gated_linear_unit"] = True
    kw["num_query_groups"] = a.get("num_query_groups") if a.get("group_query_attention") else None
    if isinstance(kw.get("moe_layer_freq"), str):
        kw["moe_layer_freq"] = eval(kw["moe_layer_freq"], {"__builtins__": {}})  # pattern of digits, [], +, *
    if kw.get("normalization"):
        kw["normalization"] = a["normalization"]
    if isinstance(kw.get("recompute_modules"), str):
        kw["recompute_modules"] = [kw["recompute_modules"]]
    with _transformer_engine_permutation_present(bool(kw.get("moe_permute_fusion"))):
        return cls(**kw)


#: Transformer Engine's fused permutation functions whose presence ``TransformerConfig.__post_init__`` checks under
#: ``moe_permute_fusion`` (megatron-core 0.16 ``transformer_config.py``: "fused permutation is not available. Please
#: install TE >= 2.1.0.").
TE_PERMUTATION_FUNCTIONS = ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                            "fused_sort_chunks_by_index_with_probs", "fused_unpermute")


@contextlib.contextmanager
def _transformer_engine_permutation_present(needed: bool):
    """While the config is built: stand-ins for TE's fused permutation functions where TE is not installed (no GPU
    library on the test machine; the launch machine has TE, as ``--moe-permute-fusion`` requires). The check is of
    the environment, not of the configuration; every other rule of ``__post_init__`` still runs."""
    from megatron.core.transformer.moe import moe_utils
    missing = [n for n in TE_PERMUTATION_FUNCTIONS if getattr(moe_utils, n, None) is None] if needed else []
    saved = {n: getattr(moe_utils, n) for n in missing if hasattr(moe_utils, n)}
    for n in missing:
        setattr(moe_utils, n, object())
    try:
        yield
    finally:
        for n in missing:
            if n in saved:
                setattr(moe_utils, n, saved[n])
            else:
                delattr(moe_utils, n)


def megatron_layers_per_rank(cfg) -> list[list[int]]:
    """``get_num_layers_to_build(cfg, vp_stage, pp_rank)`` for every pipeline rank and virtual stage."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    v = cfg.virtual_pipeline_model_parallel_size or 1
    layout = cfg.pipeline_model_parallel_layout
    if layout is not None:
        # the layout object takes the rank explicitly; it reads the virtual-pipeline size from parallel_state
        # (set here as Megatron's initialize_model_parallel would, no process group needed)
        from megatron.core import parallel_state as ps
        saved = ps.get_virtual_pipeline_model_parallel_world_size()
        ps.set_virtual_pipeline_model_parallel_world_size(v if v > 1 else None)
        try:
            return [[layout.get_num_layers_to_build(layer_type=LayerType.decoder, vp_stage=s, pp_rank=r)
                     for s in range(v)] for r in range(cfg.pipeline_model_parallel_size)]
        finally:
            ps.set_virtual_pipeline_model_parallel_world_size(saved)
    return [[get_num_layers_to_build(cfg, vp_stage=(s if v > 1 else None), pp_rank=r) for s in range(v)]
            for r in range(cfg.pipeline_model_parallel_size)]


def megatron_num_microbatches(gbs: int, mbs: int, dp: int) -> int:
    """megatron-core's ``ConstantNumMicroBatchesCalculator`` (raises when gbs % (mbs*dp))."""
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    return ConstantNumMicroBatchesCalculator(gbs, mbs, dp, decrease_batch_size_if_needed=False, rank=0).get()


def megatron_ddp_config(a: dict):
    """megatron-core's ``DistributedDataParallelConfig`` from the arguments (Megatron-LM ``get_model``: every
    argument whose dest is a field)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    return DistributedDataParallelConfig(**{k: v for k, v in a.items() if k in fields})


def megatron_rank_groups(tp: int, pp: int, dp: int, cp: int, ep: int) -> dict[str, list[list[int]]]:
    """Megatron's rank layout (``parallel_state.RankGenerator``, order tp-cp-ep-dp-pp)."""
    from megatron.core.parallel_state import RankGenerator

    g = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    return {k: g.get_ranks(k) for k in ("tp", "pp", "dp", "cp")}


# --------------------------------------------------------------------------------------------------- DeepSpeed
class _DataParallelMpu:
    """The one mpu method DeepSpeedConfig reads: the data-parallel world size (Megatron-DeepSpeed's mpu)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


class _NoProcessGroupDist:
    """``deepspeed.comm`` stand-in for DeepSpeedConfig's ``dist.get_rank()`` (no process group, no JIT op
    build; validators.md Sec. 2)."""

    @staticmethod
    def get_rank() -> int:
        return 0

    @staticmethod
    def get_world_size(group=None) -> int:
        return 1


def deepspeed_validate(cfg: dict, dp: int):
    """DeepSpeed's own ``DeepSpeedConfig(cfg, mpu)`` with the planned data-parallel size."""
    import deepspeed.runtime.config as dsc

    saved = dsc.dist
    dsc.dist = _NoProcessGroupDist()
    try:
        return dsc.DeepSpeedConfig(dict(cfg), mpu=_DataParallelMpu(dp))
    finally:
        dsc.dist = saved


# --------------------------------------------------------------------------------------------------- torchtitan
def torchtitan_parse_toml(toml_text: str, tmp: Path):
    """torchtitan 0.2.x ``ConfigManager().parse_args(["--job.config_file", FILE])``."""
    from torchtitan.config import ConfigManager

    f = tmp / "torchtitan.toml"
    f.write_text(toml_text)
    return ConfigManager().parse_args(["--job.config_file", str(f)])


def toml_sections(text: str) -> dict:
    return tomllib.loads(text)
