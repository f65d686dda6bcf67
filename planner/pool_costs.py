"""Per-layer and per-stage cost facts of one pool for the pools search (``planner.pool_search``).

The search chooses per-stage layer counts (``planner.pool_split``) from a stage's time and memory as functions of
its layer count. Both come from the cost models' own terms, evaluated once per (pool, tp, cp, dp, ep, etp,
micro-batch, sequence parallel, recompute):

* **time** (``layer_times``): a decoder layer's forward + backward seconds on the pool's cluster, from
  ``cost_models.step_time.layer_pass_s`` / ``output_layer_s`` (the functions ``estimate_step`` composes), for
  Megatron-LM's defaults (no TP communication overlap beyond its asynchronous backward collectives, no EP overlap,
  no CUDA graph, the GPU's default FP8 recipe): compute, exposed TP/CP/EP communication, MoE routing
  and host time, selective or full recompute; the first stage's embedding and the last stage's output layer, loss
  and MTP modules as fixed seconds. ``tests/test_pools.py`` checks these against ``estimate_step``'s per-stage times,
  so a change of the step model that is not mirrored here fails a test;
* **memory** (``stage_memory``): bytes of the stage's model states (``memory.stage_params``,
  ``memory.model_state_terms``), stored activations per layer times the micro-batches the stage holds in flight
  (``activations.activation_bytes_per_layer``, ``layer_input_bytes`` under full recompute,
  ``activations.in_flight_microbatches``), the backward working set, token ids, logits and the calibrated reserve: the
  backward phase of ``memory.estimate_memory`` with its pipeline and expert-parallel buffers (``memory_buffers``)
  but without the other transients, so it is a lower bound of the exact per-stage estimate, which then decides
  (``planner.pool_search`` lowers a stage's layer cap and re-splits when a term left out here binds).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cluster_specs.spec import ClusterSpec
from cost_models import step_time as stm
from cost_models.config import ParallelConfig, TrainingJob, compute_bytes
from cost_models.fp8_recipe import job_host_cost_class
from cost_models.layout import group_placement
from cost_models.activations import activation_bytes_per_layer, expert_buffer_factor, layer_input_bytes
from cost_models.memory import (TOKEN_ID_BYTES, logits_bytes_per_element, model_state_terms, precision_state_options,
                                stage_params, state_options_of)
from cost_models.memory_buffers import moe_dispatch_buffers, pipeline_p2p_buffers
from model_zoo.spec import ModelSpec


#: Layer kinds ``layer_kinds`` tells apart: dense or MoE MLP (+1), full or sliding-window attention (+2).
NUM_LAYER_KINDS = 4


def layer_kinds(model: ModelSpec) -> list[int]:
    """Kind of every decoder layer: 0 dense MLP, 1 MoE, plus 2 with sliding-window attention
    (``ModelSpec.layer_kind``: the per-layer costs depend on the layer only through it)."""
    out = []
    for i in range(model.num_layers):
        moe, window = model.layer_kind(i)
        out.append((1 if model.moe is not None and moe else 0) + (2 if window is not None else 0))
    return out


def representatives(kinds: list[int] | tuple[int, ...]) -> dict[int, int]:
    """One layer index of each kind present in ``kinds`` (``layer_kinds``): kind -> index."""
    return dict(_representatives(tuple(kinds)))


@lru_cache(maxsize=64)
def _representatives(kinds: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    rep: dict[int, int] = {}
    for i, k in enumerate(kinds):
        rep.setdefault(k, i)
    return tuple(rep.items())


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of one micro-batch's forward + backward on one pool: per decoder layer of each kind (``layer_s[k]``,
    0 where the kind is absent), the first stage's embedding, the last stage's output layer + loss + MTP, and one
    P2P send between two stages of this pool."""

    layer_s: tuple[float, ...]
    first_s: float
    last_s: float
    p2p_s: float
    #: the forward part of ``layer_s``, ``first_s`` and ``last_s`` (seconds)
    layer_f: tuple[float, ...] = (0.0,) * NUM_LAYER_KINDS
    first_f: float = 0.0
    last_f: float = 0.0

    @property
    def forward_share(self) -> float:
        """The largest forward / (forward + backward) of a layer kind or end stage (<= 1/2 here)."""
        pairs = list(zip(self.layer_f, self.layer_s)) + [(self.first_f, self.first_s), (self.last_f, self.last_s)]
        return max((f / t for f, t in pairs if t > 0), default=0.0)


def layer_times(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                framework: str = "megatron", kinds: list[int] | None = None) -> LayerTimes:
    """``LayerTimes`` of ``par`` (tp, cp, dp, ep, etp, micro-batch, sp, recompute; ``par.pp`` > 1 for the P2P
    placement) on ``cluster`` (module docstring). ``kinds``: ``layer_kinds(model)``, if already known."""
    kinds = layer_kinds(model) if kinds is None else kinds
    dom = cluster.node.nvlink_domain_size
    groups = {d: group_placement(d, par, dom) for d in ("tp", "cp", "ep", "dp", "pp")}
    fp8_recipe = job_host_cost_class(job, cluster, model, par, framework)
    # the framework's TP schedule without TP communication overlap, as estimate_step defaults it
    tp_b = stm.tp_backward_shares(framework.split("_")[0], False, par.sequence_parallel)
    per_kind, fwd = [0.0] * NUM_LAYER_KINDS, [0.0] * NUM_LAYER_KINDS
    lc: dict[int, stm.LayerCost] = {}
    for kind, i in representatives(kinds).items():
        x = stm.layer_cost(model, cluster, job, par, i, framework, groups)
        lc[kind] = x
        f, b = stm.layer_pass_s(model, cluster, job, par, i, x, framework, 1.0, 1.0, fp8_recipe, False,
                                par.recompute == "full", tp_b)
        per_kind[kind] = f + b
        fwd[kind] = f
    last_f, last_b, _ = stm.output_layer_s(model, cluster, job, par, framework, lambda i: lc[kinds[i]], 1.0, 1.0,
                                           tp_b, fp8_recipe, False)
    last = last_f + last_b
    emb = stm.embedding_s(model, cluster, job, par)
    first = 3 * emb
    p2p = stm.pipeline_p2p_s(model, cluster, job, par, groups) if par.pp > 1 else 0.0
    return LayerTimes(tuple(per_kind), first, last, p2p, tuple(fwd), emb, last_f)


@dataclass(frozen=True)
class StageMemoryFacts:
    """Bytes on one GPU of a stage (module docstring), for one (structure, micro-batch, sp, recompute, zero) on one
    pool: model states per decoder layer of each kind, stored activations per layer of each kind and per in-flight
    micro-batch, the backward working set (the smaller kind's: a lower bound), the first stage's embedding states
    and token ids per in-flight micro-batch, the last stage's output-layer states, its activations per in-flight
    micro-batch (MTP layers) and its logits, the reserve, and the backward's buffers: the gradient a non-last stage
    receives and, when every layer is MoE, the expert-parallel all-to-all copy (``cost_models.memory_buffers``)."""

    layer_states: tuple[float, ...]
    layer_act: tuple[float, ...]
    working: float
    first_states: float
    first_act: float
    last_states: float
    last_act: float
    logits: float
    reserve: float
    p2p_recv: float = 0.0
    ep_buffers: float = 0.0

    def base(self, stage: int, pp: int, in_flight: float) -> float:
        """Bytes of stage ``stage`` (of ``pp``) with no decoder layer (backward phase)."""
        b = self.reserve + self.working + self.ep_buffers
        if stage == 0:
            b += self.first_states + self.first_act * in_flight
        if stage == pp - 1:
            b += self.last_states + self.last_act * in_flight + self.logits
        else:
            b += self.p2p_recv
        return b

    def per_layer(self, in_flight: float) -> tuple[float, ...]:
        """Bytes per decoder layer of each kind on a stage holding ``in_flight`` micro-batches."""
        return tuple(s + a * in_flight for s, a in zip(self.layer_states, self.layer_act))


def stage_memory(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig,
                 framework: str = "megatron", kinds: list[int] | None = None) -> StageMemoryFacts:
    """``StageMemoryFacts`` of ``par`` on ``cluster`` (``par.pp`` >= 2 so that the first and last stage differ).
    ``kinds``: ``layer_kinds(model)``, if already known."""
    kinds = layer_kinds(model) if kinds is None else kinds
    vocab = model.padded_vocab_size(par.tp)
    shard, eshard = par.dp * par.cp, par.expert_dp
    opts = {**state_options_of(par), **precision_state_options(job.precision)}
    bf16 = bool(getattr(par, "grad_reduce_in_bf16", False))

    def states(sp) -> float:
        return (sum(model_state_terms(framework, par.zero_stage, sp.dense, shard, bf16, **opts))
                + sum(model_state_terms(framework, par.zero_stage, sp.expert, eshard, bf16, **opts)))

    reps = representatives(kinds)
    layer_states, layer_act, full_act = [0.0] * NUM_LAYER_KINDS, [0.0] * NUM_LAYER_KINDS, []
    lin = layer_input_bytes(model, job, par)
    for kind, i in reps.items():
        # stage index -1 is neither the first nor the last: the layer's own parameters only
        layer_states[kind] = states(stage_params(model, par, -1, range(i, i + 1), vocab))
        act = activation_bytes_per_layer(model, job, par, i, framework)
        full_act.append(act)
        layer_act[kind] = lin if par.recompute == "full" else act
    working = (2 if par.recompute == "full" else 1) * min(full_act)
    tokens = job.seq_length / par.cp * par.micro_batch_size
    tok_ids = TOKEN_ID_BYTES * tokens + (tokens * model.hidden_size if job.dropout else 0) / (
        par.tp if par.sequence_parallel else 1)
    last_kind = kinds[-1]
    mtp_act = model.num_mtp_layers * (full_act[list(reps).index(last_kind)] if par.recompute != "full" else lin)
    p2p = pipeline_p2p_buffers(framework, 0, 2, 1, 1, 1.0, lin)["backward"]
    ep = 0.0
    if model.moe is not None and all(k % 2 == 1 for k in kinds):
        # the busiest EP rank's received copies (activations.expert_buffer_factor: dropless imbalance)
        copies = tokens / (par.tp if par.sequence_parallel else 1) * model.moe.top_k * expert_buffer_factor(
            model, job, par)
        ep = sum(moe_dispatch_buffers(copies, model.hidden_size, par.ep,
                                      compute_bytes(job.precision))["backward"].values())
    return StageMemoryFacts(
        layer_states=tuple(layer_states), layer_act=tuple(layer_act), working=working,
        first_states=states(stage_params(model, par, 0, range(0), vocab)), first_act=tok_ids,
        last_states=states(stage_params(model, par, par.pp - 1, range(0), vocab)), last_act=mtp_act,
        logits=tokens * vocab / par.tp * logits_bytes_per_element(job, framework),
        reserve=float(cluster.calibration.memory_reserve_bytes), p2p_recv=sum(p2p.values()), ep_buffers=ep)

