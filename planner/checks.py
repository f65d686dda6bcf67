"""Independent re-check of every hard constraint of one configuration, each with its slack.

This module deliberately does not share code with the search (``planner.space``, ``planner.solver``): a plan is
emitted only if ``check_config`` finds no violation, so a bug in the search's pruning cannot produce a wrong plan.
``constraint_report`` lists every constraint with its slack (``plan3d explain``); ``check_config`` is the list
of the violated ones.

Rules and their sources (formulas.md Sec. 7.1 "Checks enforced"; field_cases.md F14-F21):

* heads / KV heads by tp — Megatron ``TransformerConfig.__post_init__`` (field case F18).
* layers by pp, the uneven split's middle stages, layers per virtual stage — Megatron ``arguments.py`` /
  ``transformer_block.get_num_layers_to_build`` (F14, F15, F16).
* interleaving needs ``num_microbatches % pp == 0`` — Megatron ``arguments.py`` (interleaved schedule).
* sequence by ``2*cp`` (load-balanced causal attention: 2·cp chunks) and by ``cp*tp`` under sequence
  parallelism — NeMo-RL PR #3563 (F21).
* MoE: experts by ep; the expert grid ``etp*ep*pp`` divides the world (dense and expert grids both tile it,
  F16); tp > 1 requires sequence parallelism in a MoE model (Megatron-LM ``MoELayer.forward`` raises in training
  without it, whatever ep; Megatron ``arguments.py`` for ep > 1; NeMo-Launcher PR #309, F21); the DeepEP flex
  dispatcher needs tp x ep > 1 (``MoEFlexTokenDispatcher`` asserts it, ``token_dispatcher.py`` at d98e8a64dd);
  the expert FFN width by etp (Megatron's column-parallel expert linears ``divide`` it); torchtitan's expert tensor
  parallel degree is 1 or tp (``ParallelDims``, formulas.md Sec. 7.3).
* DeepSpeed's pipeline engine supports ZeRO stage <= 1 only (``deepspeed/runtime/pipe/engine.py``; F19).
* Megatron-DeepSpeed cannot combine its Ulysses sequence parallelism (cp > 1) with Megatron SP (``megatron/initialize.py``);
  Ulysses' all-to-all scatters the attention heads, so the heads per tp rank divide by cp
  (``deepspeed/sequence/layer.py``: ``DistributedAttention`` splits the head dimension over the sequence group).
* torchtitan: no ZeRO-1/2 (FSDP2 shards weights, gradients and optimizer state together: ``zero_stage`` 0 or 3
  only; torchtitan ``parallelize_llama``), sequence parallelism with any TP (``apply_tp``: SequenceParallel
  norms), no interleaved virtual stages with uneven first/last splits (torchtitan splits by module names, not by
  Megatron's first/last counts) — torchtitan docs
  ``docs/composability.md``.
* vocabulary padding: the padded vocabulary (multiple of ``128*tp``, Megatron ``_vocab_size_with_padding``)
  must hold the vocabulary — informational, always satisfied, listed so the padding is visible.
* pipeline schedule: the framework runs it, and each schedule's own shape rules (``planner.schedule_checks``).
* memory of every stage <= capacity x (1 - headroom); within ``at_risk_margin`` of capacity it still fits but is
  flagged at risk (``memory_verdict``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.fp8_recipe import delayed_scaling_refused_modules
from cost_models.layout import LayoutError, chunk_layer_counts, deepspeed_pipeline_layout, stage_layer_counts
from cost_models.memory import MemoryEstimate
from model_zoo.spec import ModelSpec

#: Default fraction of usable memory kept free (allocator spikes, NCCL growth, fragmentation); see
#: ``--memory-headroom``. Field experience: PyTorch's caching allocator fragments a few percent of memory and
#: the MEM cases of field_cases.md OOM within ~3-5% of capacity, so we keep 5% free by default.
DEFAULT_MEMORY_HEADROOM = 0.05
#: Default ``--at-risk-margin``: a plan whose peak is within this fraction of capacity (but inside the headroom)
#: fits and is flagged ``at risk``, ranked after the plans that clear it. 10% is the largest under-prediction of the
#: memory model on published runs whose gap has a known mechanism (tests/test_memory_published.py ``KNOWN``: eager
#: torchtitan Llama-3.1-8B FSDP on 8 and 128 H100, -9.0% / -9.1% of measured max reserved memory, from unfused
#: RMSNorm/SwiGLU temporaries the per-layer terms do not hold), rounded up: a run predicted at 90% of capacity has
#: reached it in the field. It is wider than the 5% headroom, which covers allocator fragmentation alone.
DEFAULT_AT_RISK_MARGIN = 0.10
#: Memory verdicts, best first (``memory_verdict``).
VERDICTS = ("fits", "at risk", "over headroom", "OOM")
FRAMEWORKS = ("megatron", "deepspeed", "torchtitan")


@dataclass(frozen=True)
class Violation:
    """One broken constraint: ``name`` (stable id), a one-line ``message``, and ``excess`` (how much it is
    exceeded by, in the constraint's own unit; bytes for memory, 0 for divisibility)."""

    name: str
    message: str
    excess: float = 0.0


@dataclass(frozen=True)
class Constraint:
    """One constraint of a configuration and its slack.

    ``slack`` is in ``unit``: for divisibility it is ``-remainder`` (0 = exactly divisible, negative =
    violated); for memory it is usable bytes minus the stage's bytes; for bounds it is ``limit - value``.
    ``ok`` is the verdict; ``detail`` a one-line description with the numbers.
    """

    name: str
    ok: bool
    slack: float
    unit: str
    detail: str


def _div(name: str, n: int, d: int, what: str) -> Constraint:
    r = n % d if d else n
    return Constraint(name, r == 0, float(-r), "remainder", f"{what}: {n} % {d} = {r}")


def constraint_report(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                      num_gpus: int, memory: MemoryEstimate | None = None,
                      memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                      framework: str = "megatron") -> list[Constraint]:
    """Every constraint that applies to ``par``, satisfied or not, with its slack (in a fixed order)."""
    out: list[Constraint] = []
    add = out.append
    ws = par.world_size
    add(Constraint("world_size", ws == num_gpus, float(num_gpus - ws), "GPUs",
                   f"tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = {ws}, GPUs {num_gpus}"))
    a, g = model.num_attention_heads, model.num_kv_heads
    add(_div("heads_tp", a, par.tp, "num_attention_heads % tp"))
    if model.mla is None:
        ok = g % par.tp == 0 or par.tp % g == 0
        add(Constraint("kv_heads_tp", ok, 0.0 if ok else -float(min(g % par.tp, par.tp % g)), "remainder",
                       f"num_kv_heads {g} and tp {par.tp}: " + ("one divides the other" if ok else
                                                                "neither divides the other")))
    dom = cluster.node.nvlink_domain_size
    add(Constraint("tp_nvlink", par.tp <= dom, float(dom - par.tp), "GPUs",
                   f"tp {par.tp} within the NVLink domain of {dom} GPUs"))
    # fp32 training runs its GEMMs on the TF32 tensor cores (cost_models.config.TrainingJob): it needs a TF32 peak
    gemm_dtype = "tf32" if job.precision == "fp32" else job.precision
    rate = cluster.gpu.peak_flops.get(gemm_dtype)
    add(Constraint("precision", bool(rate), 0.0, "", f"{cluster.gpu.name} dense {gemm_dtype} rate "
                   + (f"{rate / 1e12:.0f} TFLOP/s" if rate else "missing")))
    try:
        counts = stage_layer_counts(model.num_layers, par)
        split = "even" if counts == [counts[0]] * len(counts) else "uneven"
        add(Constraint("layers_pp", True, 0.0, "remainder",
                       f"{model.num_layers} layers over pp {par.pp} ({split}): {_counts_str(counts)}"))
    except LayoutError as e:
        counts = []
        add(Constraint("layers_pp", False, -1.0, "remainder", str(e)))
    if par.vpp > 1:
        add(Constraint("vpp_pp", par.pp > 1, float(par.pp - 2), "stages", f"vpp {par.vpp} needs pp > 1 (pp {par.pp})"))
        if (par.pipeline_layout is not None or par.account_for_embedding_in_pipeline_split
                or par.account_for_loss_in_pipeline_split):
            # the embedding/loss pseudo-layer takes a slot of the first/last chunk: L' % (pp*vpp) == 0
            try:
                chunk_layer_counts(model.num_layers, par)
                add(Constraint("layers_vpp", True, 0.0, "remainder",
                               f"num_layers + embedding/loss by pp*vpp = {par.pp}*{par.vpp}"))
            except LayoutError as e:
                add(Constraint("layers_vpp", False, -1.0, "remainder", str(e)))
        else:
            bad = sorted({c for c in counts if c % par.vpp})
            add(Constraint("layers_vpp", not bad, -float(max((c % par.vpp for c in bad), default=0)), "remainder",
                           f"stage layer counts {sorted(set(counts))} by vpp {par.vpp}"
                           + (f": {bad} not divisible" if bad else "")))
    mb = par.micro_batch_size * par.dp
    m = job.global_batch_size // mb if mb else 0
    batch = _div("batch", job.global_batch_size, mb, "global_batch_size % (micro_batch_size*dp)")
    if not batch.ok and m >= 1:
        # the step time of such a layout is that of the micro-batches it would run (``num_microbatches``, floored)
        batch = replace(batch, detail=f"{batch.detail} (timed as {m} micro-batches of {par.micro_batch_size} x dp "
                                      f"{par.dp}: {m * mb} of the {job.global_batch_size} sequences)")
    add(batch)
    add(Constraint("microbatches", m >= 1, float(m - 1), "micro-batches",
                   f"num_microbatches = {job.global_batch_size} // ({par.micro_batch_size}*{par.dp}) = {m}"))
    if par.pp > 1 and par.vpp > 1 and par.pipeline_schedule in ("interleaved", "combined-1f1b"):
        add(_div("microbatches_interleaved", m, par.pp, "interleaved schedule: num_microbatches % pp"))
    if par.pp > 1 or par.schedule is not None:
        from .schedule_checks import schedule_constraints  # (it imports Constraint from here)
        out += schedule_constraints(model, par, m, framework)
    if par.cp > 1:
        add(_div("seq_cp", job.seq_length, 2 * par.cp, "seq_length % (2*cp) (load-balanced causal CP)"))
    if par.cp > 1 and framework != "deepspeed":
        # Megatron-core's local DotProductAttention asserts context_parallel_size == 1 ("Context parallelism is only
        # supported by TEDotProductAttention!"), Transformer Engine's get_attention_backend disables
        # UnfusedDotProductAttention under CP; torch's ring attention (torchtitan, Colossal-AI ring_attn) wraps the
        # fused SDPA kernels. DeepSpeed-Ulysses scatters heads instead and runs any attention.
        add(Constraint("cp_fused_attention", job.flash_attention, 0.0 if job.flash_attention else -1.0, "",
                       f"cp {par.cp} runs ring attention over fused (flash) attention kernels"
                       + ("" if job.flash_attention else ": not with --no-flash-attention")))
    if par.sequence_parallel:
        add(_div("seq_sp", job.seq_length, par.cp * par.tp, "seq_length % (cp*tp) (sequence parallel)"))
    if model.moe is None:
        if par.ep > 1:
            add(Constraint("ep_dense", False, -float(par.ep - 1), "ranks", "ep > 1 needs a mixture-of-experts model"))
        if par.etp is not None and par.etp != par.tp:
            add(Constraint("etp_dense", False, -1.0, "ranks",
                           f"etp {par.etp} (expert tensor parallel) needs a mixture-of-experts model"))
    else:
        add(_div("experts_ep", model.moe.num_experts, par.ep, "num_experts % ep"))
        etp_note = f"; etp is tp ({par.tp}) unless given: --etp 1 shrinks the grid" if par.etp is None and \
            par.tp > 1 else ""
        add(_div("expert_grid", par.dp * par.cp * par.tp, par.ep * par.expert_tp,
                 f"dp*cp*tp % (ep*etp) (the ranks of one pipeline stage hold whole expert grids of ep*etp"
                 f"{etp_note})"))
        if par.ep > 1:
            add(_div("expert_ffn_etp", model.moe.expert_ffn_hidden_size, par.expert_tp,
                     "expert_ffn_hidden_size % etp (the expert linears split their width over etp ranks)"))
        if framework == "torchtitan" and par.ep > 1:
            ok = par.expert_tp in (1, par.tp)
            add(Constraint("torchtitan_etp", ok, 0.0 if ok else -1.0, "",
                           f"torchtitan expert_tensor_parallel_degree is 1 or tp ({par.tp}) (etp {par.expert_tp})"))
        if framework == "megatron" and par.tp > 1:
            add(Constraint("ep_tp_needs_sp", par.sequence_parallel, 0.0 if par.sequence_parallel else -1.0, "",
                           "a MoE model with tp > 1 requires sequence parallel (Megatron-LM MoELayer.forward raises "
                           "in training without it)"))
        deepep = job.moe_flex_dispatcher_backend == "deepep" and job.moe_expert_capacity_factor is None
        if framework == "megatron" and deepep:
            ok = par.tp * par.ep > 1
            add(Constraint("deepep_tp_ep", ok, 0.0 if ok else -1.0, "ranks",
                           f"the DeepEP flex dispatcher needs tp x ep > 1 (Megatron-LM MoEFlexTokenDispatcher "
                           f"asserts it; tp {par.tp} x ep {par.ep}): raise ep, or drop the stated backend"))
    if par.recompute_modules:
        # megatron-core reads recompute_modules only under recompute_granularity "selective" (TransformerConfig)
        add(Constraint("recompute_modules", par.recompute == "selective", 0.0, "",
                       f"recompute_modules {','.join(par.recompute_modules)} needs recompute selective "
                       f"({par.recompute})"))
    # megatron-core's rule; its default recipe (job.fp8_recipe None) already avoids it (fp8_recipe.per_tensor_fp8_recipe)
    delayed = framework == "megatron" and job.precision == "fp8" and job.fp8_recipe == "delayed"
    refused = delayed_scaling_refused_modules(par) if delayed else []
    if refused:
        add(Constraint("fp8_delayed_recompute", False, float(-len(refused)), "modules",
                       f"--fp8-recipe delayed with recompute_modules {','.join(refused)}: megatron-core refuses delayed "
                       f"scaling with moe_act / layernorm recompute (TransformerConfig); use --fp8-recipe tensorwise, "
                       f"or drop {','.join(refused)} from the recomputed modules"))
    if par.recompute_num_layers is not None:
        add(Constraint("recompute_num_layers", par.recompute == "full", 0.0, "",
                       f"recompute_num_layers {par.recompute_num_layers} needs recompute full ({par.recompute})"))
        try:
            most = max(n for stage in chunk_layer_counts(model.num_layers, par) for n in stage)
        except LayoutError:
            most = None  # the split itself is reported (layers_pp / layers_vpp)
        if most is not None:
            # megatron-core TransformerConfig: "recompute_num_layers must be between 1 and
            # num_layers_per_pipeline_rank"; plan3d recomputes the first N layers of each model chunk
            add(Constraint("recompute_num_layers_range", par.recompute_num_layers <= most,
                           float(most - par.recompute_num_layers), "layers",
                           f"recompute_num_layers {par.recompute_num_layers} between 1 and the layers of a model "
                           f"chunk ({most})"))
    if framework == "deepspeed" and par.pp > 1:
        add(Constraint("deepspeed_pipeline_zero", par.zero_stage <= 1, float(1 - par.zero_stage), "ZeRO stages",
                       f"DeepSpeed's pipeline engine runs ZeRO stage <= 1 with pp > 1 (zero {par.zero_stage})"))
    if framework == "deepspeed" and model.moe is not None:
        add(Constraint("deepspeed_moe_zero", par.zero_stage <= 2, float(2 - par.zero_stage), "ZeRO stages",
                       f"DeepSpeed MoE runs ZeRO stage <= 2 (runtime/engine.py: \"Native DeepSpeed MoE is not "
                       f"supported with ZeRO Stage 3\"; zero {par.zero_stage})"))
    if framework == "deepspeed" and par.cp > 1:
        add(Constraint("deepspeed_cp_sp", not par.sequence_parallel, 0.0 if not par.sequence_parallel else -1.0, "",
                       "Megatron-DeepSpeed runs cp as Ulysses sequence parallelism, which it refuses together with "
                       "Megatron sequence parallel (megatron/initialize.py)"))
    if framework == "deepspeed" and par.cp > 1:
        heads = model.num_attention_heads // par.tp
        add(Constraint("deepspeed_ulysses_heads", heads % par.cp == 0, float(-(heads % par.cp)), "heads",
                       f"DeepSpeed-Ulysses (cp) scatters the attention heads over the sequence group: heads per tp "
                       f"rank ({model.num_attention_heads}/{par.tp}) divisible by cp {par.cp}"))
    if par.param_cpu_offload:
        ok = framework == "deepspeed" and par.zero_stage == 3
        add(Constraint("param_cpu_offload", ok, 0.0 if ok else -1.0, "",
                       f"param_cpu_offload is DeepSpeed ZeRO-3's offload_param (framework {framework}, zero "
                       f"{par.zero_stage}): Megatron-LM, torchtitan and Colossal-AI keep the parameters on the GPU"))
    low = [f"{k} {getattr(par, k)}" for k in ("exp_avg_dtype", "exp_avg_sq_dtype", "main_params_dtype")
           if getattr(par, k) != "fp32"]
    if low:
        ok = framework in ("megatron", "nemo")
        add(Constraint("precision_aware_optimizer", ok, 0.0 if ok else -1.0, "",
                       f"{', '.join(low)}: Megatron-LM's precision-aware optimizer (--use-precision-aware-optimizer)"
                       + ("" if ok else f"; {framework}'s Adam keeps fp32 states")))
    uneven = par.first_stage_layers is not None or par.last_stage_layers is not None or par.pipeline_layout
    own = deepspeed_pipeline_layout(model.num_layers, par.pp) if framework == "deepspeed" and uneven else None
    if framework == "deepspeed" and par.pp > 1 and uneven and par.pipeline_layout != own:
        # DeepSpeed runtime/utils.py partition_balanced over the type:transformer weights puts the heavier stages
        # first: 70 layers over 12 -> [6] * 10 + [5] * 2, 126 over 16 -> [8] * 14 + [7] * 2 (deepspeed 0.19.8)
        add(Constraint("deepspeed_layer_split", False, -1.0, "",
                       f"{model.num_layers} layers over pp {par.pp}: Megatron-DeepSpeed balances the transformer "
                       f"layers itself (partition_method 'type:transformer'"
                       + (f": {own}" if own else ": an even split") + "), not by first/last stage counts or a "
                       "Megatron layout"))
    account = par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split
    if account and framework == "deepspeed":
        add(Constraint("account_split_framework", False, -1.0, "",
                       "the account-for-embedding/loss split: DeepSpeed's PipelineModule partitions by its own "
                       "method (Megatron-LM --account-for-*-in-pipeline-split, torchtitan first/last_stage_less_"
                       "layers)"))
    if framework == "torchtitan":
        add(Constraint("torchtitan_zero", par.zero_stage in (0, 3), 0.0 if par.zero_stage in (0, 3) else -1.0, "",
                       f"torchtitan FSDP2 shards all states together: zero 0 or 3 (zero {par.zero_stage})"))
        if par.zero_stage == 0 and (par.tp, par.pp, par.cp, par.ep) != (1, 1, 1, 1):
            add(Constraint("torchtitan_ddp_1d", False, -1.0, "",
                           "torchtitan runs zero 0 as DDP, which does not combine with tp/pp/cp/ep "
                           "(\"DDP has not supported > 1D parallelism\", models/llama3/infra/parallelize.py)"))
        if par.tp > 1:
            add(Constraint("torchtitan_tp_sp", par.sequence_parallel, 0.0 if par.sequence_parallel else -1.0, "",
                           "torchtitan's tensor parallelism shards the norms over the sequence: sequence parallel "
                           "with tp > 1 (models/llama3/infra/parallelize.py apply_tp, SequenceParallel)"))
        uneven = par.first_stage_layers is not None or par.last_stage_layers is not None
        if par.vpp > 1 and uneven:
            add(Constraint("torchtitan_uneven_vpp", False, -1.0, "",
                           "torchtitan has no Megatron first/last-stage split with interleaving"))
    padded = model.padded_vocab_size(par.tp)
    add(Constraint("vocab_padding", padded >= model.vocab_size, float(padded - model.vocab_size), "tokens",
                   f"vocab {model.vocab_size} padded to {padded} (multiple of 128*tp = {128 * par.tp})"))
    if memory is not None:
        limit = memory.capacity_bytes * (1 - memory_headroom)
        for st in memory.stages:
            add(Constraint(f"memory_stage_{st.stage}", st.total <= limit, limit - st.total, "bytes",
                           f"stage {st.stage} ({st.num_layers} layers) needs {st.total / 2**30:.2f} GiB of "
                           f"{limit / 2**30:.2f} GiB usable ({memory.capacity_bytes / 2**30:.2f} GiB x "
                           f"(1 - {memory_headroom:g}))"))
    return out


def memory_verdict(memory: MemoryEstimate, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                   at_risk_margin: float = DEFAULT_AT_RISK_MARGIN) -> str:
    """The one memory verdict every command gives (``VERDICTS``): ``OOM`` (peak above capacity), ``over headroom``
    (above capacity x (1 - headroom): infeasible, exit 1), ``at risk`` (above capacity x (1 - at_risk_margin):
    feasible, exit 0, flagged and ranked after the plans that fit) or ``fits``."""
    return verdict_of(memory.peak_bytes, memory.capacity_bytes, memory_headroom, at_risk_margin)


def verdict_of(peak_bytes: float, capacity_bytes: float, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
               at_risk_margin: float = DEFAULT_AT_RISK_MARGIN) -> str:
    """``memory_verdict`` of one peak (bytes) against one capacity (bytes)."""
    peak, cap = peak_bytes, capacity_bytes
    if peak > cap:
        return "OOM"
    if peak > cap * (1 - memory_headroom):
        return "over headroom"
    if peak > cap * (1 - at_risk_margin):
        return "at risk"
    return "fits"


def _at_phase(st) -> str:
    """`` at init`` when a stage peaks before the first step (a full-model init), else nothing."""
    return " at init (full model materialized)" if st.phase == "init" else ""


def _counts_str(counts: list[int]) -> str:
    if len(set(counts)) == 1:
        return f"{len(counts)} x {counts[0]}"
    if len(counts) > 2 and len(set(counts[1:-1])) == 1:
        return f"[{counts[0]}, {len(counts) - 2} x {counts[1]}, {counts[-1]}]"
    return str(counts)


def check_config(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, num_gpus: int,
                 memory: MemoryEstimate | None = None, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
                 framework: str = "megatron") -> list[Violation]:
    """All violated constraints of ``par`` (empty list = valid). ``memory`` is checked when given.

    Memory is reported once, for the most loaded stage, as ``memory`` with ``excess`` in bytes.
    """
    v: list[Violation] = []
    worst = None
    for c in constraint_report(model, cluster, job, par, num_gpus, memory, memory_headroom, framework):
        if c.ok:
            continue
        if c.name.startswith("memory_stage_"):
            if worst is None or c.slack < worst.slack:
                worst = c
            continue
        v.append(Violation(c.name, c.detail))
    if worst is not None:
        st = memory.peak_stage
        limit = memory.capacity_bytes * (1 - memory_headroom)
        v.append(Violation("memory", f"stage {st.stage} needs {st.total / 2**30:.1f} GiB{_at_phase(st)} > "
                                     f"{limit / 2**30:.1f} GiB "
                                     f"usable ({memory.capacity_bytes / 2**30:.1f} GiB capacity less "
                                     f"{memory_headroom:.0%} headroom) by {(st.total - limit) / 2**30:.1f} GiB",
                           st.total - limit))
    return v
