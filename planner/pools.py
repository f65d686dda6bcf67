"""``planner.plan_pools``: plan one job over pools of different GPUs, and the document it returns.

    >>> import planner
    >>> doc = planner.plan_pools("llama3.1-70b", "dgx-h100:32,dgx-a100-80g:32", global_batch_size=1024,
    ...                          seq_length=8192)
    >>> best = doc.plans[0]
    >>> best.parallel.pipeline_layout, [u.pool for u in best.pools], best.throughput.tokens_per_s
    >>> [(s.pools, s.tokens_per_s) for s in doc.subsets]      # every choice of pools, e.g. "leave the A100s out"

The search is ``planner.pool_search`` (what it searches and why it is exact); the cost model
``cost_models.pools``; the cluster ``cluster_specs.pools`` (``--cluster NAME:NODES,...`` or a YAML with ``pools:``).
The document is the plan document's format (``planner.document``: each plan a ``PlanInfo`` with its ``launch``
section, so ``--emit megatron`` writes its ``--pipeline-model-parallel-layout``; the launch runs on every pool's GPUs,
so its environment holds only what every pool's launch sets and an FP8 run takes one recipe all of them run,
``cost_models.fp8_recipe.shared_fp8_recipe``) plus, per plan, the pools it uses
and every stage's pool, layers, seconds and memory, and the best plan of every subset of pools.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr

from cluster_specs import nodes_holding

from .document import (SCHEMA_VERSION, JobInfo, ModelInfo, PlanInfo, _r, _Strict, input_info, memory_info,
                       plan_info, to_json)
from .errors import NoFeasiblePlan, PlanInputError

if TYPE_CHECKING:
    from typing import TypedDict, Unpack

    from cluster_specs.pools import MixedCluster
    from cost_models.config import TrainingJob
    from model_zoo.spec import ModelSpec

    from .pool_search import PoolPlan, PoolsSearchResult

    class PoolsOptions(TypedDict, total=False):
        global_batch_size: int
        seq_length: int
        precision: Literal["bf16", "fp16", "fp8"]
        flash_attention: bool
        dropout: bool
        framework: Literal["megatron"] | None
        memory_headroom: float
        at_risk_margin: float
        flops_convention: Literal["megatron", "palm"]
        top_k: int
        homogeneous: bool
        tp: int | None
        cp: int | None
        ep: int | None
        micro_batch_size: int | None
        zero_stage: int | None
        recompute: Literal["none", "selective", "full"] | None

_KEYS = frozenset({"global_batch_size", "seq_length", "precision", "flash_attention", "dropout", "framework",
                   "memory_headroom", "at_risk_margin", "flops_convention", "top_k", "homogeneous", "tp", "cp", "ep",
                   "micro_batch_size", "zero_stage", "recompute"})


# ----------------------------------------------------------------------------------------------------- document
class PoolInfo(_Strict):
    name: str
    gpu: str
    num_nodes: int
    gpus_per_node: int
    num_gpus: int
    memory_bytes_per_gpu: int
    peak_flops_per_gpu: float = Field(description="dense 16-bit peak, FLOP/s")


class NetworkInfo(_Strict):
    nic_bandwidth_bytes_per_s: float
    latency_s: float
    bus_efficiency: float
    source: str


class MixedClusterInfo(_Strict):
    name: str
    num_gpus: int
    pools: list[PoolInfo]
    network: NetworkInfo = Field(description="between pools")


class PoolsInputInfo(_Strict):
    model: ModelInfo
    cluster: MixedClusterInfo
    job: JobInfo


class PoolUseInfo(_Strict):
    """One pool of a plan, in pipeline (node-rank) order."""

    pool: str
    gpu: str
    first_stage: int
    num_stages: int
    num_layers: int
    nodes_used: int
    gpus_used: int
    idle_gpus: int


class PoolStageInfo(_Strict):
    stage: int
    pool: str
    num_layers: int
    forward_s: float = Field(description="one micro-batch, seconds")
    backward_s: float = Field(description="one micro-batch incl. recompute, seconds")
    memory_bytes: int
    capacity_bytes: int


class PoolPlanInfo(PlanInfo):
    """A plan of the plan document (``PlanInfo``; ``memory`` reports the stage with the least headroom, at its
    pool's capacity) with the pools it uses, every stage's pool, and where it came from."""

    source: str = Field(description="pools search (any layout over the pools) or homogeneous search (one pool)")
    pools: list[PoolUseInfo]
    stages: list[PoolStageInfo]
    idle_gpus: int = Field(description="GPUs of the mixed cluster this plan leaves idle")


class SubsetInfo(_Strict):
    """The best plan using exactly these pools (any order), or why there is none."""

    pools: list[str]
    order: list[str] | None
    tokens_per_s: float | None
    step_s: float | None
    mfu: float | None
    num_gpus: int | None
    pipeline_layout: str | None
    source: str | None
    reason: str | None


class PoolsDocument(_Strict):
    """``plan3d plan --cluster NAME:NODES,... --format json``: the plans (best first) and every subset's best."""

    schema_version: str = SCHEMA_VERSION
    input: PoolsInputInfo
    plans: list[PoolPlanInfo]
    subsets: list[SubsetInfo]
    #: the search's plans (``planner.pool_search.PoolPlan``, with their estimates; not part of the JSON)
    _plans: Any = PrivateAttr(default=None)
    _stats: Any = PrivateAttr(default=None)

    @property
    def search_plans(self) -> list:
        """The plans as the search returned them (configuration, stage pools, full estimate)."""
        return self._plans or []

    @property
    def search_stats(self) -> dict[str, Any]:
        """Candidates examined, splits computed, plans evaluated by the full model, seconds per phase."""
        return self._stats or {}

    def model_dump_json(self, **kwargs: Any) -> str:
        """Deterministic JSON (as ``PlanDocument.model_dump_json``)."""
        return super().model_dump_json(**kwargs) if kwargs else to_json(self)


def _plan_info(rank: int, p: PoolPlan, model: ModelSpec, mixed: MixedCluster, job: TrainingJob,
               headroom: float, margin: float) -> PoolPlanInfo:
    from cost_models.memory import MemoryEstimate

    from .checks import Violation
    from cost_models.fp8_recipe import shared_fp8_recipe

    from .emit import megatron_args
    from .emit.env import launch_env
    from .evaluation import Evaluation
    est, par = p.estimate, p.parallel
    first = mixed.pools[p.stage_pool[0]].cluster
    b = est.binding_stage(headroom)
    s, cap = est.stages[b], est.capacity_bytes[b]
    ev = Evaluation(par, MemoryEstimate(est.stages, cap), est.step, [Violation("pools", v) for v in p.violations])
    base = plan_info(rank, ev, model, first, job, margin)
    # one launch runs on every pool's nodes: keep only the variables every pool's launch sets (NCCL_NVLS_ENABLE=1
    # makes NCCL fail on GPUs without NVLink SHARP; unset, NCCL's default uses NVLS where the device has it)
    used_pools = [mixed.pools[i].cluster for i in dict.fromkeys(p.stage_pool)]
    base.launch.env = {fw: {k: v for k, v in env.items()
                            if all(launch_env(fw, par, c, job).get(k) == v for c in used_pools)}
                       for fw, env in base.launch.env.items()}
    if job.precision == "fp8" and base.launch.megatron is not None:
        # one --fp8-recipe for every pool's GPUs: the job's, else MXFP8 only where all have block-scaled tensor cores
        base.launch.megatron = megatron_args(model, job, par, first,
                                             job.fp8_recipe or shared_fp8_recipe(used_pools, model, par))
    # the stage with the least headroom at its own pool's capacity (the pools' capacities differ)
    base.memory = memory_info(MemoryEstimate(est.stages, cap), margin).model_copy(update=dict(
        peak_bytes=round(s.total), capacity_bytes=cap, headroom_bytes=round(cap - s.total), peak_stage=b,
        at_risk=cap * (1 - margin) < s.total <= cap,
        breakdown={k: round(v) for k, v in s.terms().items()}))
    d = par.tp * par.cp * par.dp
    uses, stages = [], []
    for i in dict.fromkeys(p.stage_pool):
        rs = [r for r, q in enumerate(p.stage_pool) if q == i]
        pool = mixed.pools[i]
        used = len(rs) * d
        uses.append(PoolUseInfo(pool=pool.name, gpu=pool.cluster.gpu.name, first_stage=rs[0], num_stages=len(rs),
                                num_layers=sum(est.stages[r].num_layers for r in rs),
                                nodes_used=nodes_holding(used, pool.cluster.node.gpus_per_node), gpus_used=used,
                                idle_gpus=pool.num_gpus - used))
    st = est.step
    for r, i in enumerate(p.stage_pool):
        stages.append(PoolStageInfo(stage=r, pool=mixed.pools[i].name, num_layers=est.stages[r].num_layers,
                                    forward_s=_r(st.stage_forward_s[r]), backward_s=_r(st.stage_backward_s[r]),
                                    memory_bytes=round(est.stages[r].total), capacity_bytes=est.capacity_bytes[r]))
    return PoolPlanInfo(**base.model_dump(), source=p.source, pools=uses, stages=stages,
                        idle_gpus=mixed.num_gpus - par.world_size)


def build_pools_document(model: ModelSpec, mixed: MixedCluster, job: TrainingJob, res: PoolsSearchResult,
                         headroom: float, margin: float) -> PoolsDocument:
    """The document of a pools search (plans in rank order, subsets best first)."""
    base = input_info(model, mixed.pools[0].cluster, job, mixed.pools[0].num_gpus)
    pools = [PoolInfo(name=p.name, gpu=p.cluster.gpu.name, num_nodes=p.num_nodes,
                      gpus_per_node=p.cluster.node.gpus_per_node, num_gpus=p.num_gpus,
                      memory_bytes_per_gpu=p.cluster.gpu.memory_bytes,
                      peak_flops_per_gpu=p.cluster.gpu.peak_flops.get("bf16", p.cluster.gpu.peak_flops.get("fp16", 0)))
             for p in mixed.pools]
    n = mixed.network
    cl = MixedClusterInfo(name=mixed.name, num_gpus=mixed.num_gpus, pools=pools,
                          network=NetworkInfo(nic_bandwidth_bytes_per_s=n.nic_bandwidth_bytes_per_s,
                                              latency_s=n.latency_s, bus_efficiency=n.bus_efficiency, source=n.source))
    subsets = []
    for s in res.subsets:
        names = [mixed.pools[i].name for i in s.pools]
        p = s.plan
        if p is None:
            subsets.append(SubsetInfo(pools=names, order=None, tokens_per_s=None, step_s=None, mfu=None, num_gpus=None,
                                      pipeline_layout=None, source=None, reason=s.reason))
            continue
        st = p.estimate.step
        subsets.append(SubsetInfo(pools=names, order=[mixed.pools[i].name for i in p.pools_used],
                                  tokens_per_s=_r(st.tokens_per_s), step_s=_r(st.step_s), mfu=_r(st.mfu),
                                  num_gpus=p.parallel.world_size, pipeline_layout=p.parallel.pipeline_layout,
                                  source=p.source, reason=None))
    doc = PoolsDocument(input=PoolsInputInfo(model=base.model, cluster=cl, job=base.job),
                        plans=[_plan_info(k + 1, p, model, mixed, job, headroom, margin)
                               for k, p in enumerate(res.plans)],
                        subsets=subsets)
    doc._plans = res.plans
    doc._stats = {"num_candidates": res.num_candidates, "num_split": res.num_split,
                  "num_evaluated": res.num_evaluated, "timings_s": dict(res.timings_s)}
    return doc


# ---------------------------------------------------------------------------------------------------------- API
def resolve_pools(cluster: str | os.PathLike[str] | MixedCluster | list) -> MixedCluster:
    """The mixed cluster of ``cluster``: ``"dgx-h100:32,dgx-a100-80g:32"``, a YAML path with ``pools:``, a list of
    (cluster, nodes) pairs, or a ``MixedCluster`` (``cluster_specs.pools.load_mixed_cluster``)."""
    from cluster_specs.pools import load_mixed_cluster
    return load_mixed_cluster(os.fspath(cluster) if isinstance(cluster, os.PathLike) else cluster)


def plan_pools(model: Any = None, cluster: Any = None, **options: Unpack[PoolsOptions]) -> PoolsDocument:
    """Plan the job over the pools of ``cluster`` (``resolve_pools``): the best ``top_k`` plans (default 5) and the
    best plan of every subset of pools (``planner.pool_search``). ``options``: the job (``global_batch_size`` 1024,
    ``seq_length`` 4096, ``precision`` bf16, ``flash_attention``, ``dropout``, ``memory_headroom`` 0.05,
    ``at_risk_margin``, ``flops_convention``), ``framework`` (megatron only: the plan is a Megatron
    ``--pipeline-model-parallel-layout``), pins (``tp``, ``cp``, ``ep``, ``micro_batch_size``, ``zero_stage``,
    ``recompute``) and ``homogeneous`` (True: also plan each single pool with the homogeneous search's whole space).

    Raises ``PlanInputError`` / ``ClusterSpecError`` / ``ModelSpecError`` (bad input) and ``NoFeasiblePlan``
    (no plan fits on any subset of the pools; the message names each subset's reason).
    """
    from .api_options import (FLOPS_CONVENTIONS, RECOMPUTE_CHOICES, at_risk_option, check_bool, check_choice,
                              check_keys, headroom_option, load_inputs)
    from .pool_search import search_pools
    from .space import SearchSpace
    check_keys(options, _KEYS, "plan over pools")
    o = dict(options)
    fw = o.get("framework") or "megatron"
    if fw != "megatron":
        raise PlanInputError(f"--framework {fw}: a plan over pools is a Megatron-LM --pipeline-model-parallel-layout "
                             f"(per-stage layers); DeepSpeed and torchtitan cannot express it; use megatron")
    mixed = resolve_pools(cluster)
    prec = o.get("precision", "bf16")
    home = next((p for p in mixed.pools if prec in p.cluster.supported_precisions), mixed.pools[0])
    inputs = load_inputs(model, home.cluster, nodes=home.num_nodes, global_batch_size=o.get("global_batch_size", 1024),
                         seq_length=o.get("seq_length", 4096), precision=prec,
                         flash_attention=o.get("flash_attention", True), dropout=o.get("dropout", False))
    conv = check_choice("flops_convention", o.get("flops_convention") or "megatron", FLOPS_CONVENTIONS)
    headroom = headroom_option(o.get("memory_headroom"))
    margin = at_risk_option(o.get("at_risk_margin"))
    top_k = o.get("top_k", 5)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise PlanInputError(f"--top-k {top_k!r}: must be a positive integer")
    if o.get("recompute") is not None:
        check_choice("recompute", o["recompute"], RECOMPUTE_CHOICES)
    kw: dict[str, Any] = {k: (o[k],) for k in ("tp", "cp", "ep") if o.get(k) is not None}
    for k in ("micro_batch_size", "zero_stage", "recompute"):
        if o.get(k) is not None:
            kw[k] = (o[k],)
    space = SearchSpace(**kw)
    res = search_pools(inputs.model, mixed, inputs.job, top_k, space, headroom, conv,
                       check_bool("homogeneous", o.get("homogeneous", True)), at_risk_margin=margin)
    if not res.plans:
        why = "; ".join(f"{'+'.join(mixed.pools[i].name for i in s.pools)}: {s.reason}" for s in res.subsets)
        raise NoFeasiblePlan(f"no plan fits on any subset of the pools ({why})")
    return build_pools_document(inputs.model, mixed, inputs.job, res, headroom, margin)
