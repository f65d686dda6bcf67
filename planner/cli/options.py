"""The ``plan3d`` options: choices (enums), typed options shared by the commands, their defaults, and the
conversion of a one-layout command's options into the Python API's keyword arguments (``planner.api``)."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class Fmt(str, Enum):
    table = "table"
    json = "json"


class DocumentKind(str, Enum):
    """Documents ``plan3d schema`` describes (``planner.document.DOCUMENT_KINDS``)."""
    plan = "plan"
    pools = "pools"
    comparison = "comparison"
    fallback = "fallback"


class Precision(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    fp32 = "fp32"


class RecomputeOpt(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


class SolverOpt(str, Enum):
    cpsat = "cpsat"
    enumerate = "enumerate"


class ObjectiveOpt(str, Enum):
    throughput = "throughput"
    headroom = "headroom"
    min_gpus = "min-gpus"
    cost = "cost"


class Framework(str, Enum):
    megatron = "megatron"
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"


class Emit(str, Enum):
    """``--emit`` targets: the frameworks whose rules plan3d models, and Colossal-AI (planned under Megatron-LM's
    rules unless --framework says otherwise)."""
    megatron = "megatron"
    deepspeed = "deepspeed"
    torchtitan = "torchtitan"
    colossalai = "colossalai"


class Launcher(str, Enum):
    scripts = "scripts"
    k8s = "k8s"


LauncherOpt = Annotated[Launcher, typer.Option(
    "--launcher", help="with --emit: scripts (torchrun + Slurm, default) or k8s (a Kubeflow PyTorchJob manifest)")]


def check_format_emit(fmt: Fmt, emit) -> None:
    """--format json and --emit both choose what is printed: refuse the pair (the plan document's ``launch`` section
    carries the arguments --emit writes) rather than ignore one."""
    if emit is not None and fmt == Fmt.json:
        from ..errors import PlanInputError
        raise PlanInputError(f"--format json with --emit {emit.value}: --emit prints the launch, --format json the "
                             f"plan document (whose launch section holds the same arguments); give one of them")


def rules_framework(framework, emit):
    """The framework whose rules plan and evaluate apply: --framework, else the --emit target when plan3d models
    it, else Megatron-LM (Colossal-AI's TP/SP follow Megatron's)."""
    if framework is not None:
        return framework
    return Framework(emit.value) if emit is not None and emit.value in Framework.__members__ else Framework.megatron


class ScheduleOpt(str, Enum):
    """Pipeline schedules (``cost_models.config.Schedule``; which framework runs which: ``schedule_checks.FRAMEWORK_SCHEDULES``)."""
    f1b = "1f1b"
    interleaved = "interleaved"
    gpipe = "gpipe"
    zb_h1 = "zb-h1"
    zb_v = "zb-v"
    dualpipe = "dualpipe"
    dualpipev = "dualpipev"
    combined_1f1b = "combined-1f1b"


ScheduleOptT = Annotated[Optional[ScheduleOpt], typer.Option(
    "--pipeline-schedule", help="pipeline schedule (default 1f1b, interleaved when --vpp > 1); zb-v and dualpipev "
                                "run two chunks per rank (--vpp 2)")]


class FlopsConv(str, Enum):
    megatron = "megatron"
    palm = "palm"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="built-in name, our YAML, a HF config.json path, "
                                                              "or a Hugging Face Hub id org/name[@revision]")]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="built-in name or YAML path (plan: A,B,C compares "
                                                                   "clusters by time and cost)")]
GpusOpt = Annotated[Optional[int], typer.Option(
    "--gpus", min=1, help="number of GPUs (a multiple of the node size, or a divisor of it: part of one node)")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", min=1, help="number of nodes")]
GbsOpt = Annotated[int, typer.Option("--global-batch-size", min=1, help="sequences per optimizer step")]
SeqOpt = Annotated[Optional[int], typer.Option(
    "--seq-length", min=1, help="tokens per sequence [default: 4096, or a learned-position model's maximum if shorter]")]
PrecOpt = Annotated[Precision, typer.Option(
    "--precision", help="GEMM precision: bf16, fp16, fp8, or fp32 (single precision, GEMMs on the TF32 tensor cores, "
                        "MFU against the TF32 peak)")]
FmtOpt = Annotated[Fmt, typer.Option("--format", help="table or json")]
OutOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="write the output to this file")]
#: Same default as planner.checks.DEFAULT_MEMORY_HEADROOM (a test keeps them equal; not imported here to keep
#: CLI start-up light), so evaluate/memory agree with what plan accepts.
HEADROOM_DEFAULT = 0.05
HeadroomOpt = Annotated[float, typer.Option("--memory-headroom", min=0.0, max=0.5,
                                            help="fraction of GPU memory kept free (default 0.05)")]
#: Same default as planner.checks.DEFAULT_AT_RISK_MARGIN (a test keeps them equal).
AT_RISK_DEFAULT = 0.10
AtRiskOpt = Annotated[float, typer.Option(
    "--at-risk-margin", min=0.0, max=0.5,
    help="a peak within this fraction of capacity (but inside the headroom) fits and is flagged at risk; plan "
         "ranks such plans last (default 0.10)")]
FullInitOpt = Annotated[bool, typer.Option(
    "--full-model-init/--sharded-init",
    help="each rank first materializes its whole 16-bit model (DeepSpeed without zero.Init): checked as the init "
         "phase")]
ImbalanceOpt = Annotated[Optional[float], typer.Option(
    "--expert-load-imbalance", min=1.0,
    help="dropless MoE: the busiest expert's routed tokens over the mean in one micro-batch (1 = balanced, e.g. "
         "--moe-router-force-load-balancing); sets how much more the busiest EP rank holds (default: 2.21 for 256 "
         "experts, 1.61 for 8; cost_models/moe_imbalance.py)")]
FlopsOpt = Annotated[Optional[FlopsConv], typer.Option(
    "--flops-convention", help="model FLOPs behind TFLOP/s and MFU: megatron (causal attention halved, "
                               "Megatron-LM's logger) or palm (6N + 12LHQT, torchtitan)")]
FrameworkOpt = Annotated[Framework, typer.Option("--framework", help="framework whose rules apply")]
FlashOpt = Annotated[bool, typer.Option("--flash-attention/--no-flash-attention",
                                        help="fused attention (no s x s scores stored or streamed; default on)")]
DropoutOpt = Annotated[bool, typer.Option("--dropout/--no-dropout",
                                          help="dropout layers present (masks stored; default off)")]
# --- whole-run cost (planner/cost.py) ---
TrainTokensOpt = Annotated[Optional[float], typer.Option(
    "--train-tokens", help="tokens to train (e.g. 15.6e12): each plan gets its days, GPU-hours, goodput, energy "
                           "and dollars")]
PriceOpt = Annotated[Optional[str], typer.Option(
    "--gpu-hour-price", help="USD per GPU-hour (2.5), or NAME=USD pairs per cluster (dgx-h100=2.5,dgx-h200=3.1); "
                             "default: the cluster's own dated price")]
AsyncCkptOpt = Annotated[bool, typer.Option(
    "--async-checkpoint/--no-async-checkpoint", help="asynchronous checkpoints (Megatron --async-save, torch DCP "
                                                     "async_save): the write runs behind compute (default off)")]
RateOpt = Annotated[Optional[float], typer.Option(
    "--interruption-rate", help="unexpected job interruptions per GPU-hour (default: the cluster's, Meta's Llama 3 "
                                "figure 1.97e-5)")]
RestartOpt = Annotated[Optional[float], typer.Option(
    "--restart-s", help="seconds from an interruption to training again (default: the cluster's, 388 s)")]
PueOpt = Annotated[Optional[float], typer.Option("--pue", help="power usage effectiveness (default: the cluster's)")]


def enum_value(opt):
    """The string value of an optional enum option (None stays None)."""
    return None if opt is None else opt.value


TpOpt = Annotated[int, typer.Option("--tp", min=1, help="tensor parallel size")]
PpOpt = Annotated[int, typer.Option("--pp", min=1, help="pipeline parallel size")]
CpOpt = Annotated[int, typer.Option("--cp", min=1, help="context parallel size")]
EpOpt = Annotated[int, typer.Option("--ep", min=1, help="expert parallel size")]
EtpOpt = Annotated[Optional[int], typer.Option("--etp", min=1, help="expert tensor parallel (default: tp)")]
VppOpt = Annotated[int, typer.Option("--vpp", min=1, help="model chunks per pipeline rank")]
MbsOpt = Annotated[int, typer.Option("--micro-batch-size", min=1)]
ZeroOpt = Annotated[int, typer.Option("--zero-stage", min=0, max=3, help="1 = Megatron distributed optimizer")]
RecomputeLayoutOpt = Annotated[RecomputeOpt, typer.Option("--recompute")]
RecomputeLayersOpt = Annotated[Optional[int], typer.Option("--recompute-num-layers", min=1)]
SpOpt = Annotated[bool, typer.Option("--sequence-parallel/--no-sequence-parallel")]
FirstOpt = Annotated[Optional[int], typer.Option("--first-stage-layers", min=1)]
LastOpt = Annotated[Optional[int], typer.Option("--last-stage-layers", min=1)]
LayoutStrOpt = Annotated[Optional[str], typer.Option(
    "--pipeline-model-parallel-layout", help="Megatron per-stage layout, e.g. 'Et*7|t*9|t*9|t*7L' (E embedding, t "
                                             "decoder layer, m MTP layer, L loss; chunk i on pipeline rank i % pp)")]
RecomputeModulesOpt = Annotated[Optional[str], typer.Option(
    "--recompute-modules", help="selective recompute modules, comma-separated (Megatron --recompute-modules): "
                                "core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts")]
OffloadModulesOpt = Annotated[Optional[str], typer.Option(
    "--offload-modules", help="activation offloading to host memory, comma-separated (Megatron "
                              "--fine-grained-activation-offloading --offload-modules): attn_norm, qkv_linear, core_attn, "
                              "attn_proj, mlp_norm, expert_fc1, moe_act, fused_group_mlp")]
OffloadOpt = Annotated[float, typer.Option(
    "--optimizer-cpu-offload", min=0.0, max=1.0,
    help="share of the optimizer states in host memory (Megatron --optimizer-offload-fraction; DeepSpeed "
         "offload_optimizer, 1.0)")]
ParamOffloadOpt = Annotated[bool, typer.Option(
    "--param-cpu-offload/--no-param-cpu-offload", help="DeepSpeed ZeRO-3 offload_param: parameters in host memory")]
RecomputeMethodOpt = Annotated[str, typer.Option(
    "--recompute-method", help="with --recompute-num-layers N: block (the first N layers of each chunk recomputed) or "
                               "uniform (groups of N layers checkpointed, every layer recomputed)")]
MomentDtypeOpt = Annotated[str, typer.Option(help="Adam moment dtype (precision-aware optimizer): fp32, fp16, bf16, fp8")]
CapacityOpt = Annotated[Optional[float], typer.Option(
    "--capacity-factor", min=1.0,
    help="MoE drop-and-pad routing (Megatron --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): "
         "each expert's input padded to this multiple of the balanced share; no host sync on the token counts "
         "(default: dropless)")]
SoftwareDateOpt = Annotated[Optional[str], typer.Option(
    "--software-date", metavar="YYYY-MM",
    help="month of the container or framework release the run uses (e.g. 2024-07 for NeMo 24.07): attention is "
         "timed with that generation of the kernel library (cuDNN on H100: 22-25% slower forward in 2024 than in "
         "2026); default: today's kernels")]
DispatcherOpt = Annotated[Optional[str], typer.Option(
    "--moe-flex-dispatcher-backend", metavar="deepep|hybridep",
    help="MoE flex token dispatcher (Megatron --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend): inside "
         "one NVLink domain timed from its measured throughput (DeepEP's Hybrid-EP tables, B200/GB200); default: "
         "DeepEP across NVLink domains, NCCL all-to-all inside one")]
DispatcherSmsOpt = Annotated[Optional[int], typer.Option(
    "--moe-flex-dispatcher-num-sms", min=1,
    help="SMs of the flex dispatcher's kernels (Megatron --moe-flex-dispatcher-num-sms; default: the backend's, "
         "HybridEP 32 inside one NVLink domain, DeepEP 20)")]
Fp8RecipeOpt = Annotated[Optional[str], typer.Option(
    "--fp8-recipe", metavar="delayed|tensorwise|mxfp8|blockwise",
    help="FP8 scaling recipe with --precision fp8 (Megatron --fp8-recipe): delayed (amax history), tensorwise "
         "(current scaling: one more read of each cast tensor), mxfp8 (Blackwell), blockwise (DeepSeek-V3 style); "
         "default: the framework's (Megatron: MXFP8 on Blackwell, blockwise for MoE on Hopper, tensorwise with "
         "moe_act/layernorm recompute, else delayed; Megatron-DeepSpeed delayed; torchtitan tensorwise)")]
MasterDtypeOpt = Annotated[str, typer.Option(
    "--main-params-dtype", help="master-weight dtype: fp32, fp16 (Megatron --main-params-dtype), bf16 "
                                "(Megatron-FSDP --megatron-fsdp-main-params-dtype)")]


#: API options (``planner.api.LayoutOptions``) a one-layout command passes on as given
_LAYOUT_PASSED = ("model", "cluster", "gpus", "nodes", "global_batch_size", "seq_length", "flash_attention", "dropout",
                  "memory_headroom", "tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage",
                  "recompute_num_layers", "sequence_parallel", "first_stage_layers", "last_stage_layers",
                  "at_risk_margin", "full_model_init", "expert_load_imbalance", "capacity_factor", "pipeline_layout",
                  "recompute_method", "optimizer_cpu_offload", "param_cpu_offload", "exp_avg_dtype",
                  "exp_avg_sq_dtype", "main_params_dtype", "software_date", "moe_flex_dispatcher_backend",
                  "moe_flex_dispatcher_num_sms", "fp8_recipe")
#: ... passed on as the choice's value (None when the command has no such option)
_LAYOUT_CHOICES = ("precision", "framework", "recompute", "flops_convention", "pipeline_schedule")
#: ... given as comma-separated module names
_LAYOUT_LISTS = ("recompute_modules", "offload_modules")


def layout_kwargs(params: dict) -> dict:
    """The parameters of a one-layout command (``evaluate``, ``memory``, ``explain``: its ``locals()`` on entry) as
    the API's keyword options (``planner.api.LayoutOptions``): choices as their values, comma-separated module lists
    as tuples; what the API does not take (``fmt``, ``output``, ``plot``, ...) is left out."""
    out = {k: params[k] for k in _LAYOUT_PASSED if k in params}
    out.update({k: enum_value(params.get(k)) for k in _LAYOUT_CHOICES})
    for k in _LAYOUT_LISTS:
        text = params.get(k)
        out[k] = tuple(m.strip() for m in text.split(",") if m.strip()) if text else None
    return out

