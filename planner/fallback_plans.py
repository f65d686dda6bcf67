"""``planner.fallback``: the plans to restart with after losing 1..K nodes, computed before the failure (this module
is ``fallback_plans`` so that ``planner.fallback`` stays the function).

    >>> import planner
    >>> fb = planner.fallback(plan="plans.json", max_lost_nodes=8)   # a plan document (plan3d plan --format json)
    >>> fb = planner.fallback("llama3.1-405b", "dgx-h100", gpus=16384, global_batch_size=2048, seq_length=8192,
    ...                       max_lost_nodes=8)                              # or the job: plans it first
    >>> [(f.lost_nodes, f.choice, f.throughput_retained) for f in fb.fallbacks]

For each count ``k`` of lost nodes (``planner.fallback_search``):

* ``keep_layout``: the best plan that keeps TP, PP, CP, EP, VPP and the stage layout, so the checkpoint loads
  without resharding: only DP, the micro-batch count at the same global batch and the ZeRO shards change (Megatron's
  default ``dp_reshardable`` distributed-optimizer checkpoint loads under another DP size, Megatron-LM
  ``docs/api-guide/core/dist_checkpointing.md``); GPUs that cannot be used stay idle. None, with the reason, when the
  layout no longer fits (fewer GPUs than ``pp x max(tp x cp, ep x etp)``, or out of memory with fewer ZeRO shards):
  where Oobleck (SOSP'23) stops training when no pipeline template fits the remaining nodes.
* ``best``: the best plan of any layout on the healthy GPUs, listed only when it beats ``keep_layout``; it needs the
  checkpoint resharded and names the framework's path (``RESHARDING``), like Varuna's (EuroSys'22) reshaping onto the
  available GPUs. ReCycle (arXiv 2405.14009) reroutes micro-batches to data-parallel peers instead and needs no
  restart; that is not modelled here.

Each carries ``throughput_retained`` (its tokens/s over the original plan's, both by plan3d's cost model) and
``idle_gpus``; the entry's ``choice`` is the plan a restart script should take (``best`` when listed).
"""
from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr, ValidationError

from .document import SCHEMA_VERSION, InputInfo, PlanInfo, _r, _Strict, input_info, plan_info, to_json
from .errors import PlanInputError

if TYPE_CHECKING:
    from typing import Unpack

    from .api_options import PlanOptions

#: How each framework loads a checkpoint under another layout (the ``best`` plans' resharding path).
RESHARDING = {
    "megatron": ("Megatron distributed checkpointing: save with --ckpt-format torch_dist (the default) and resume "
                 "under the new TP/PP with --dist-ckpt-optim-fully-reshardable for the distributed optimizer "
                 "(Megatron-LM docs/api-guide/core/dist_checkpointing.md, 'Workflow for Changing Model "
                 "Parallelism'); the RNG state comes up fresh (Megatron-Bridge PR #5100)"),
    "torchtitan": ("torch distributed checkpoint (DCP): DTensor state dicts are resharded to the new mesh on load "
                   "(torch.distributed.checkpoint; torchtitan checkpoint.enable)"),
    "deepspeed": ("DeepSpeed universal checkpoint: convert with deepspeed/checkpoint/ds_to_universal.py and load "
                  "with checkpoint.load_universal (Megatron-DeepSpeed --universal-checkpoint)"),
}
#: What a keep_layout plan changes in the checkpoint, by framework.
KEEP_LAYOUT_LOAD = {
    "megatron": ("none: same TP/PP/CP/EP and layout; the distributed optimizer's default dp_reshardable checkpoint "
                 "loads under the new DP size (Megatron-LM docs/api-guide/core/dist_checkpointing.md)"),
    "torchtitan": "none: same model-parallel mesh; DCP re-partitions the FSDP shards over the new DP size on load",
    "deepspeed": ("ZeRO shards re-partitioned over the new DP size: DeepSpeed loads a different DP size through its "
                  "universal checkpoint (ds_to_universal.py)"),
}


#: Megatron-FSDP (plan3d's Megatron ZeRO-2/3, ``--use-megatron-fsdp``) checkpoints in its own format, which the
#: emitted launch sets (``--ckpt-format fsdp_dtensor``): PyTorch DCP DTensor shards (Megatron-LM
#: docs/user-guide/features/megatron_fsdp.md, 'Checkpoint Conversion'), re-partitioned over the new mesh on load.
FSDP_DTENSOR_LOAD = {
    "keep": ("none: same TP/PP/CP/EP and layout; the Megatron-FSDP checkpoint (--ckpt-format fsdp_dtensor, torch "
             "DCP DTensor shards) re-partitions its shards over the new DP size on load"),
    "reshard": ("Megatron-FSDP checkpoint (--ckpt-format fsdp_dtensor): torch DCP DTensor shards, resharded to the "
                "new mesh on load (Megatron-LM docs/user-guide/features/megatron_fsdp.md)"),
    "to_fsdp": ("the checkpoint was saved with --ckpt-format torch_dist and this plan (Megatron-FSDP) loads "
                "fsdp_dtensor: convert it first (Megatron-LM docs/user-guide/features/megatron_fsdp.md, 'Converting "
                "N-D Parallel (torch_dist) to Megatron-FSDP (fsdp_dtensor) Checkpoints')"),
    "from_fsdp": ("the checkpoint was saved by Megatron-FSDP (--ckpt-format fsdp_dtensor) and this plan loads "
                  "torch_dist, a conversion Megatron-LM does not document: prefer a fallback that keeps "
                  "Megatron-FSDP (--zero-stage 2 or 3), or restart from a torch_dist save"),
}


def checkpoint_load(framework: str, original: Any, new: Any, keeps_layout: bool) -> str:
    """What loading the original plan's checkpoint under plan ``new`` takes (``ParallelConfig`` of each): the
    framework's text (``KEEP_LAYOUT_LOAD`` / ``RESHARDING``), or for Megatron plans on either side of Megatron-FSDP
    (ZeRO-2/3: ``--ckpt-format fsdp_dtensor``) the path between the two checkpoint formats (``FSDP_DTENSOR_LOAD``)."""
    if framework == "megatron":
        old_fsdp, new_fsdp = original.zero_stage >= 2, new.zero_stage >= 2
        if old_fsdp and new_fsdp:
            return FSDP_DTENSOR_LOAD["keep" if keeps_layout else "reshard"]
        if old_fsdp != new_fsdp:
            return FSDP_DTENSOR_LOAD["from_fsdp" if old_fsdp else "to_fsdp"]
    return (KEEP_LAYOUT_LOAD if keeps_layout else RESHARDING)[framework]


class FallbackPlanInfo(PlanInfo):
    """A fallback plan in the plan document's format, with its throughput against the original and idle GPUs."""

    throughput_retained: float = Field(description="tokens/s over the original plan's tokens/s")
    idle_gpus: int = Field(description="healthy GPUs the plan does not use")
    resharding: str = Field(description="what loading the checkpoint under this plan takes")


class FallbackEntry(_Strict):
    lost_nodes: int
    healthy_nodes: int
    healthy_gpus: int
    keep_layout: FallbackPlanInfo | None
    keep_layout_reason: str | None = Field(description="why no plan keeps the layout (None when one does)")
    best: FallbackPlanInfo | None = Field(description="the best plan of any layout, when it beats keep_layout")
    choice: str | None = Field(description="the plan to restart with: 'best' when listed, else 'keep_layout'")
    throughput_retained: float | None = Field(description="of the chosen plan")
    idle_gpus: int | None = Field(description="of the chosen plan")


class FallbackDocument(_Strict):
    """``plan3d fallback --format json``: the original plan and one entry per count of lost nodes."""

    schema_version: str = SCHEMA_VERSION
    input: InputInfo
    framework: str
    original: PlanInfo
    max_lost_nodes: int
    min_gpus_keep_layout: int = Field(description="pp x max(tp x cp, ep x etp) of the original layout")
    fallbacks: list[FallbackEntry]
    _stats: Any = PrivateAttr(default=None)

    @property
    def search_stats(self) -> dict[str, Any]:
        """Seconds per phase, world sizes bounded and solved by the ``best`` search."""
        return self._stats or {}

    def model_dump_json(self, **kwargs: Any) -> str:
        """Deterministic JSON (as ``PlanDocument.model_dump_json``)."""
        return super().model_dump_json(**kwargs) if kwargs else to_json(self)


def _parallel_of(info, where: str = "plan", moe: bool = True) -> Any:
    """The ``ParallelConfig`` of a plan document's ``parallel`` section; ``moe`` False (a dense model): its ``etp``,
    which a document writes equal to tp and has no meaning without experts, is not read (an edited tp leaves it
    behind).

    Raises:
        PlanInputError: a value ``ParallelConfig`` refuses (an edited document: tp 0, zero_stage 5, ...), named as
            ``where.parallel.<field>``.
    """
    from cost_models.config import ParallelConfig
    p = info.parallel
    try:
        return ParallelConfig(
            tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, etp=p.etp if moe and p.etp != p.tp else None, vpp=p.vpp,
            micro_batch_size=p.micro_batch_size, zero_stage=p.zero_stage, sequence_parallel=p.sequence_parallel,
            recompute=p.recompute, recompute_num_layers=p.recompute_num_layers,
            schedule=p.pipeline_schedule if p.pipeline_schedule not in ("1f1b", "interleaved") else None,
            first_stage_layers=p.first_stage_layers, last_stage_layers=p.last_stage_layers,
            account_for_embedding_in_pipeline_split=p.account_for_embedding_in_pipeline_split,
            account_for_loss_in_pipeline_split=p.account_for_loss_in_pipeline_split,
            pipeline_layout=getattr(p, "pipeline_layout", None))
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]).replace("schedule", "pipeline_schedule")  # the document's name
        raise PlanInputError(f"--plan: {where}.parallel.{field}: {err['msg']} (got {err.get('input')!r})") from None


def _check_batch(p, global_batch_size: int, par: Any, rank: int) -> None:
    """Refuse a document whose plan ``rank`` (its ``parallel`` section ``p``) disagrees with ``input.job`` about the
    batch: its global batch, or its micro-batches against ``global_batch_size / (micro_batch_size x dp)``.

    Raises:
        PlanInputError: naming the fields that disagree.
    """
    m = par.num_microbatches(global_batch_size)
    if p.global_batch_size != global_batch_size or p.num_microbatches != m or m * par.micro_batch_size * par.dp != \
            global_batch_size:
        raise PlanInputError(
            f"--plan: plan #{rank}'s parallel.global_batch_size {p.global_batch_size} and num_microbatches "
            f"{p.num_microbatches} disagree with input.job.global_batch_size {global_batch_size} = micro_batch_size "
            f"{par.micro_batch_size} x dp {par.dp} x num_microbatches; edit them together or plan again")


def _load_plan(plan: Any):
    from .document import PlanDocument
    if isinstance(plan, PlanDocument):
        return plan
    if isinstance(plan, dict):  # a parsed document (json.load of plan3d plan --format json)
        text, path = json.dumps(plan), "(dict)"
    elif isinstance(plan, (str, os.PathLike)):
        path = os.fspath(plan)
        if path.lstrip().startswith("{"):
            raise PlanInputError("--plan: give the plan document's path, a PlanDocument or its parsed dict, not its "
                                 "JSON text (PlanDocument.model_validate_json reads text)")
        try:
            text = open(path, encoding="utf-8").read()
        except OSError as e:
            raise PlanInputError(f"--plan {path}: {e.strerror}") from None
    else:
        raise PlanInputError(f"--plan {type(plan).__name__}: give a plan document's path, a PlanDocument or its "
                             f"parsed dict")
    try:
        # strict: a document plan3d wrote has exact types ("tp": true or "1" is an edit, not a plan)
        doc = PlanDocument.model_validate_json(text, strict=True)
        if "schema_version" not in json.loads(text):  # its default is for documents plan3d builds, not for reading
            raise PlanInputError(f"--plan {path}: not a plan document (plan3d plan --format json): schema_version: "
                                 f"Field required")
        return doc
    except ValidationError as e:
        if '"pools"' in text and '"subsets"' in text:  # a plan over pools (planner/pools.py PoolsDocument)
            raise PlanInputError(f"--plan {path}: a plan over pools (--cluster NAME:NODES,...), which fallback does "
                                 f"not plan; give a one-cluster plan document (plan3d plan --cluster NAME --format "
                                 f"json)") from None
        try:
            keys = set(json.loads(text)) if text.lstrip().startswith("{") else set()
        except ValueError:
            keys = set()
        other = ("a fallback document (plan3d fallback), not a plan document; give the plan document it was made "
                 "from (plan3d plan --format json)" if "fallbacks" in keys else
                 "a comparison of clusters (--cluster A,B), not a plan document; save one of its rows[].document"
                 if "rows" in keys else None)
        if other:  # another document plan3d writes: name it rather than its first missing field
            raise PlanInputError(f"--plan {path}: {other}") from None
        err = e.errors()[0]  # the first problem, where it is: e.g. plans.0.tp, or the schema_version's own message
        where = ".".join(str(x) for x in err["loc"])
        first = f"{where}: {err['msg'].removeprefix('Value error, ')}" if where else err["msg"]
        raise PlanInputError(f"--plan {path}: not a plan document (plan3d plan --format json): {first}") from None


def fallback(model: Any = None, cluster: Any = None, *, plan: Any = None, max_lost_nodes: int = 1, rank: int = 1,
             **options: Unpack[PlanOptions]) -> FallbackDocument:
    """The fallback table for losing 1..``max_lost_nodes`` nodes (module docstring).

    The original plan is plan ``rank`` of ``plan`` (a plan document: path or ``PlanDocument``; its model and cluster
    are the built-ins of that name unless ``model`` / ``cluster`` are given), or else the best plan of ``plan``'s search
    for the job in ``options`` (``planner.plan``'s options). The cluster has the document's (or ``gpus`` / ``nodes``')
    node count; ``framework`` (default megatron) sets the rules and the resharding path.

    Raises ``PlanInputError`` (bad input: no such rank, more lost nodes than nodes, an unreadable document) and the
    errors of ``planner.plan``.
    """
    from cluster_specs import load_cluster, nodes_holding
    from model_zoo import load_model

    from .api_options import (FLOPS_CONVENTIONS, at_risk_option, check_choice, headroom_option, job_kwargs,
                              load_inputs, option_flag)
    from .evaluation import evaluate
    from .fallback_search import best_fallbacks, keep_layout, min_gpus
    from .space import SearchSpace
    t0 = time.perf_counter()
    if isinstance(max_lost_nodes, bool) or not isinstance(max_lost_nodes, int) or max_lost_nodes < 1:
        raise PlanInputError(f"--max-lost-nodes {max_lost_nodes!r}: must be a positive integer")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise PlanInputError(f"--rank {rank!r}: must be a positive integer")
    o = dict(options)
    conv = check_choice("flops_convention", o.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    headroom = headroom_option(o.get("memory_headroom"))
    margin = at_risk_option(o.get("at_risk_margin"))
    if plan is not None:
        clash = sorted(k for k in ("gpus", "nodes", "global_batch_size", "seq_length", "precision")
                       if o.get(k) is not None)
        if clash:
            raise PlanInputError(f"{', '.join('--' + k.replace('_', '-') for k in clash)}: taken from --plan's "
                                 f"document; leave them out or plan again")
        doc = _load_plan(plan)
        if not doc.plans:
            raise PlanInputError("--plan: the document has no plans (plan3d plan found none to fall back from)")
        if not 1 <= rank <= len(doc.plans):
            raise PlanInputError(f"--rank {rank}: the document has plans 1..{len(doc.plans)}")
        i = doc.input
        m = load_model(os.fspath(model)) if model is not None else load_model(i.model.name)
        c = load_cluster(os.fspath(cluster)) if cluster is not None else load_cluster(i.cluster.name)
        job_kw = dict(gpus=i.cluster.num_gpus, global_batch_size=i.job.global_batch_size,
                      seq_length=i.job.seq_length, precision=i.job.precision)
        from_doc: dict[str, str] = {}  # option flag -> the document's field it was read from
        for k, doc_k in (("flash_attention", "flash_attention"), ("dropout", "dropout"), ("framework", "framework"),
                         ("expert_load_imbalance", "expert_load_imbalance"),
                         ("capacity_factor", "moe_expert_capacity_factor"),
                         ("software_date", "software_date"),
                         ("moe_flex_dispatcher_backend", "moe_flex_dispatcher_backend"),
                         ("moe_flex_dispatcher_num_sms", "moe_flex_dispatcher_num_sms"),
                         ("fp8_recipe", "fp8_recipe")):  # the option, else the doc's
            v = o[k] if o.get(k) is not None else getattr(i.job, doc_k)
            if v is not None:
                job_kw[k] = v
            if o.get(k) is None and v is not None:
                from_doc[option_flag(k)] = f"input.job.{doc_k}"
        if o.get("flops_convention") is None:
            conv = doc.plans[rank - 1].throughput.flops_convention if doc.plans[rank - 1].throughput else conv
        par = _parallel_of(doc.plans[rank - 1], f"plans.{rank - 1}", moe=m.moe is not None)
        _check_batch(doc.plans[rank - 1].parallel, i.job.global_batch_size, par, rank)
        agree = par.world_size == i.cluster.num_gpus and i.cluster.gpus_per_node > 0 and \
            i.cluster.num_nodes == nodes_holding(i.cluster.num_gpus, i.cluster.gpus_per_node)
        try:
            inputs = load_inputs(m, c, **job_kw) if agree else None
        except PlanInputError as e:  # a value read from the document: say so, and how to replace it
            flag = next((f for f in from_doc if str(e).startswith(f + " ")), None)
            if flag is None:
                raise
            reason = str(e)[len(flag) + 1:].split("; ")[0]  # "VALUE: why", without the advice for the option
            raise PlanInputError(f"--plan's {from_doc[flag]} {reason}; give {flag} to replace it") from None
        gpn_edited = inputs is not None and cluster is None and \
            i.cluster.gpus_per_node != inputs.cluster.node.gpus_per_node
        if inputs is None or par.world_size != inputs.num_gpus or gpn_edited:
            raise PlanInputError(f"--plan: input.cluster (num_gpus {i.cluster.num_gpus}, num_nodes "
                                 f"{i.cluster.num_nodes} x gpus_per_node {i.cluster.gpus_per_node}; "
                                 f"{c.name} has {c.node.gpus_per_node} per node) disagrees "
                                 f"with plan #{rank}'s tp*pp*dp*cp = {par.tp}*{par.pp}*{par.dp}*{par.cp} = "
                                 f"{par.world_size}")
    else:
        from .api import plan as api_plan
        if rank != 1:
            raise PlanInputError("--rank selects a plan of --plan's document; without --plan the best plan is used")
        first = api_plan(model, cluster, **{**o, "top_k": 1})
        inputs = load_inputs(model, cluster, **{k: v for k, v in job_kwargs(o).items() if v is not None})
        par = _parallel_of(first.plans[0])
    m, c, job = inputs.model, inputs.cluster, inputs.job
    fw = job.framework
    gpn = c.node.gpus_per_node
    nodes = nodes_holding(inputs.num_gpus, gpn)
    if max_lost_nodes >= nodes:
        raise PlanInputError(f"--max-lost-nodes {max_lost_nodes}: the cluster has {nodes} node"
                             f"{'s' if nodes > 1 else ''}; " + (f"lose at most {nodes - 1}" if nodes > 1 else
                                                                 "a one-node job has no fallback after losing it"))
    orig = evaluate(m, c, job, par, par.world_size, headroom, fw, conv)
    if not orig.feasible:
        raise PlanInputError(f"the original plan is infeasible under plan3d's model ({fw} rules, flash attention "
                             f"{'on' if job.flash_attention else 'off'}, dropout {'on' if job.dropout else 'off'}; "
                             f"--framework / --flash-attention / --dropout set them): "
                             + "; ".join(v.message for v in orig.violations))
    t_orig = time.perf_counter() - t0
    counts = {k: (nodes - k) * gpn for k in range(1, max_lost_nodes + 1)}
    cache: dict = {}
    keeps = {g: keep_layout(m, c, job, par, g, headroom, fw, conv, cache) for g in counts.values()}
    t_keep = time.perf_counter() - t0 - t_orig
    space = SearchSpace()
    res = best_fallbacks(m, c, job, list(counts.values()), space, headroom, fw, conv,
                         known={g: ev for g, (ev, _) in keeps.items() if ev is not None}, at_risk_margin=margin)
    t_best = time.perf_counter() - t0 - t_orig - t_keep
    base = orig.step.tokens_per_s

    def info(ev, g: int, load: str) -> FallbackPlanInfo:
        p = plan_info(1, ev, m, c, job, margin)
        return FallbackPlanInfo(**p.model_dump(), throughput_retained=_r(ev.step.tokens_per_s / base),
                                idle_gpus=g - ev.parallel.world_size, resharding=load)

    entries = []
    for k, g in counts.items():
        kev, why = keeps[g]
        bev = res.best.get(g)
        keep = info(kev, g, checkpoint_load(fw, par, kev.parallel, True)) if kev is not None else None
        best = None
        if bev is not None and (kev is None or bev.step.tokens_per_s > kev.step.tokens_per_s * (1 + 1e-9)):
            best = info(bev, g, checkpoint_load(fw, par, bev.parallel, False))
        pick = best or keep
        entries.append(FallbackEntry(lost_nodes=k, healthy_nodes=nodes - k, healthy_gpus=g, keep_layout=keep,
                                     keep_layout_reason=why, best=best,
                                     choice=None if pick is None else ("best" if best is not None else "keep_layout"),
                                     throughput_retained=None if pick is None else pick.throughput_retained,
                                     idle_gpus=None if pick is None else pick.idle_gpus))
    out = FallbackDocument(input=input_info(m, c, job, inputs.num_gpus), framework=fw,
                           original=plan_info(1, orig, m, c, job, margin), max_lost_nodes=max_lost_nodes,
                           min_gpus_keep_layout=min_gpus(par), fallbacks=entries)
    tm = {"original": t_orig, "keep_layout": t_keep, "best": t_best, "total": time.perf_counter() - t0}
    tm.update({f"best_{k}": v for k, v in res.timings_s.items()})
    out._stats = {"timings_s": tm,
                  "num_worlds": res.num_worlds, "solved_worlds": res.solved}
    return out
