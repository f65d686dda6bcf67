"""The search space: candidate domains per knob and the cheap divisibility / framework rules.

Both searches draw their candidates from here: the enumerator (``planner.search``) walks ``candidates``, the
CP-SAT solver (``planner.solver``) takes the ``structures`` (tp, pp, cp, dp, ep, layer split) and the per-knob
domains (``micro_batch_options``, ``vpp_options``, ``sp_options``, ``zero_options``) as its variables' domains.
The independent checker (``planner.checks``) re-checks every emitted plan without using this module.

Rules (sources in ``planner.checks``): heads and KV heads by tp, tp within the NVLink domain, layers by pp (or a
Megatron first/last uneven split), sequence by 2*cp (and by cp*tp under SP), experts by ep and the expert grid
``ep*etp`` dividing ``dp*cp*tp``, global batch by ``mbs*dp``, interleaving only with ``m % pp == 0`` and stage
layer counts divisible by vpp, SP forced when tp > 1 and ep > 1 (Megatron) and with any tp > 1 (torchtitan),
DeepSpeed pipeline with ZeRO <= 1 over an even layer split, torchtitan with ZeRO 0 or 3 (FSDP2) and no
interleaving over an uneven split; pipeline schedules by framework (``schedule_options``).

The domains are what the frameworks accept, with three bounds that define the space (not prunes of it):

* micro-batch: every divisor of the per-replica batch ``global_batch_size / dp`` (Megatron, DeepSpeed and
  torchtitan take any size that divides it);
* context parallelism: every divisor of ``world / (tp * pp)`` with ``seq_length % (2 * cp) == 0`` (load-balanced
  causal CP); no minimum of tokens per rank: the step model prices the ring exchange that a short chunk cannot
  hide (``cost_models.step_time``), so the ranking, not the space, decides;
* expert tensor parallelism (MoE, ep > 1): Megatron every divisor of tp that divides the expert FFN width
  (``--expert-tensor-parallel-size``; parallel_state needs ``etp * ep * pp`` to divide the world; the step model
  prices ETP only inside the TP group, so etp > tp is left to ``evaluate``); torchtitan 1 or tp
  (``expert_tensor_parallel_degree``); DeepSpeed 1;
* uneven splits (``stage_splits``): Megatron's ``--decoder-first/last-pipeline-num-layers`` with each end stage
  holding between ``mid - END_STAGE_LIGHTER`` and ``mid`` layers, ``mid`` the middle stages' count (pp 2: the
  two stages within ``END_STAGE_LIGHTER`` layers of each other's half), besides the even split. The end stages
  carry the embedding, the output layer, the loss and (first stage) the most in-flight micro-batches, so they are
  the ones worth lightening (issue 10); a heavier end stage is both slower and larger than a middle one.

The searches do not prune this space except where a proof says the optimum cannot be removed (``planner.solver``
docstring).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Iterator

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.layout import deepspeed_pipeline_layout, uneven_split
from model_zoo.spec import ModelSpec

ZERO_STAGES = (0, 1, 2, 3)
#: Recompute granularities searched. ``full`` is not paired with a free ``recompute_num_layers``: the searches
#: derive the fewest recomputed layers per chunk that fit (``planner.recompute``), since recompute time grows and
#: memory falls with it.
RECOMPUTE = ("none", "selective", "full")
MAX_VPP = 8
#: Most layers by which an end stage of an uneven split is lighter than a middle stage (``stage_splits``): the
#: Llama 3 405B run lightened each end stage by 1 (7 + 14 x 8 + 7, Sec. 3.3.2), Megatron-Bridge's GLM-4.5 fix by 2
#: (10 + 6 x 12 + 10, PR #5551); the output layer and loss weigh about V / (12 h) decoder layers (< 3 for every
#: model of the zoo).
END_STAGE_LIGHTER = 3


@functools.lru_cache(maxsize=8192)
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n`` in increasing order."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(small + large[::-1])


@dataclass(frozen=True)
class SearchSpace:
    """Which knobs the search may vary (a user can pin any of them from the CLI)."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    #: None = every divisor of the per-replica batch
    micro_batch_size: tuple[int, ...] | None = None
    zero_stage: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (True, False)
    vpp: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None
    pipeline_schedule: tuple[str, ...] | None = None
    #: pinned decoder layers of the first / last pipeline stage (whatever split gives them; the even split too)
    first_stage_layers: tuple[int, ...] | None = None
    last_stage_layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Structure:
    """The integer grid of one layout: tp x pp x cp x dp = world, ep carved from dp*cp*tp, the layer split."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int | None
    first: int | None
    last: int | None
    #: a one-chunk-per-stage layout string the framework runs instead (Megatron-DeepSpeed's own balanced split,
    #: ``layout.deepspeed_pipeline_layout``); None: the even or first/last split above
    layout: str | None = None

    def per_stage_layers(self, num_layers: int) -> list[int]:
        """Distinct layer counts per stage (vpp must divide each)."""
        if self.layout is not None:
            return sorted({c.count("t") for c in self.layout.split("|")})
        if self.first is None:
            return [num_layers // self.pp]
        if self.pp == 2:
            return sorted({self.first, self.last})
        return sorted({self.first, self.last, (num_layers - self.first - self.last) // (self.pp - 2)})


def layer_split(model: ModelSpec, pp: int) -> tuple[int | None, int | None] | None:
    """The default split: even if possible, else Megatron first/last stage counts (``layout.uneven_split``), else
    None (pp impossible)."""
    if model.num_layers % pp == 0:
        return (None, None)
    if pp > model.num_layers:
        return None
    return uneven_split(model.num_layers, pp)


def stage_splits(num_layers: int, pp: int) -> list[tuple[int | None, int | None]]:
    """Every layer split of the space over ``pp`` stages: ``(None, None)`` (even) when pp divides the layers, and
    Megatron first/last counts ``(f, l)`` with ``mid - END_STAGE_LIGHTER <= f, l <= mid`` (f, l >= 1), the middle
    stages holding ``mid = (L - f - l) / (pp - 2)`` each; pp 2: ``(f, L - f)`` with both within
    ``END_STAGE_LIGHTER`` of ``L / 2``. Falls back to ``layout.uneven_split`` when none lies in that band.
    Increasing (f, l) order, the even split first."""
    L, d = num_layers, END_STAGE_LIGHTER
    if pp == 1:
        return [(None, None)]
    out: list[tuple[int | None, int | None]] = [(None, None)] if L % pp == 0 else []
    if pp > L:
        return out
    if pp == 2:
        lo, hi = max(1, -(-L // 2) - d), min(L - 1, L // 2 + d)
        out += [(f, L - f) for f in range(lo, hi + 1) if 2 * f != L]
    else:
        for mid in range(-(-L // pp), (L + 2 * d) // pp + 1):
            rest = L - (pp - 2) * mid
            for f in range(max(1, mid - d, rest - mid), min(mid, rest - max(1, mid - d)) + 1):
                if (f, rest - f) != (mid, mid):
                    out.append((f, rest - f))
    if not out:
        extra = uneven_split(L, pp)
        if extra is not None:
            out.append(extra)
    return out


def structures(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
               space: SearchSpace = SearchSpace(), framework: str = "megatron") -> Iterator[Structure]:
    """Every (tp, pp, cp, dp, ep, etp, split) with exact products that passes the divisibility rules.

    Expert tensor parallelism (MoE, ep > 1): ``etp_options``. The expert grid ``ep x etp`` must divide
    ``dp x cp x tp``. Layer splits: ``stage_splits``."""
    a, g = model.num_attention_heads, model.num_kv_heads
    dom = cluster.node.nvlink_domain_size
    s = job.seq_length
    for tp in divisors(num_gpus):
        if space.tp is not None and tp not in space.tp:
            continue
        if tp > dom or a % tp or (model.mla is None and g % tp and tp % g):
            continue
        for pp in divisors(num_gpus // tp):
            if space.pp is not None and pp not in space.pp:
                continue
            splits = stage_splits(model.num_layers, pp)
            layout = None
            if framework == "deepspeed":
                # Megatron-DeepSpeed balances the layers itself (partition_method 'type:transformer', front-loaded:
                # 126 over 16 as 14 x 8 + 2 x 7), which no first/last split describes: that layout instead
                layout = deepspeed_pipeline_layout(model.num_layers, pp)
                splits = [(None, None)] if layout is not None or model.num_layers % pp == 0 else []
                if layout is not None and (space.first_stage_layers is not None or space.last_stage_layers is not None):
                    counts = [c.count("t") for c in layout.split("|")]
                    if not ((space.first_stage_layers is None or counts[0] in space.first_stage_layers)
                            and (space.last_stage_layers is None or counts[-1] in space.last_stage_layers)):
                        splits = []
            if layout is None and (space.first_stage_layers is not None or space.last_stage_layers is not None):
                even = model.num_layers // pp
                splits = [(f, la) for f, la in splits
                          if (space.first_stage_layers is None or (f or even) in space.first_stage_layers)
                          and (space.last_stage_layers is None or (la or even) in space.last_stage_layers)]
            if not splits:
                continue
            for cp in divisors(num_gpus // (tp * pp)):
                if space.cp is not None and cp not in space.cp:
                    continue
                if cp > 1 and s % (2 * cp):
                    continue
                if cp > 1 and not job.flash_attention and framework != "deepspeed":
                    # ring attention runs fused kernels (planner.checks: cp_fused_attention)
                    continue
                if framework == "deepspeed" and cp > 1 and (model.num_attention_heads // tp) % cp:
                    # Megatron-DeepSpeed runs cp as DeepSpeed-Ulysses, whose all-to-all scatters each tp rank's
                    # attention heads over the cp ranks (planner.checks: deepspeed_ulysses_heads)
                    continue
                dp = num_gpus // (tp * pp * cp)
                eps = [1]
                if model.moe is not None:
                    eps = [e for e in divisors(model.moe.num_experts) if (dp * cp * tp) % e == 0]
                for ep in eps:
                    if space.ep is not None and ep not in space.ep:
                        continue
                    etps = [None] if ep == 1 else etp_options(model, tp, framework, space)
                    for etp in etps:
                        if etp is not None and (dp * cp * tp) % (ep * etp):
                            continue
                        for first, last in splits:
                            yield Structure(tp, pp, cp, dp, ep, etp, first, last, layout)


def etp_options(model: ModelSpec, tp: int, framework: str = "megatron",
                space: SearchSpace = SearchSpace()) -> list[int]:
    """Expert tensor parallel sizes for ep > 1: Megatron every divisor of tp dividing the expert FFN width
    (``--expert-tensor-parallel-size``; ColumnParallelLinear divides the width by it), torchtitan 1 or tp
    (``expert_tensor_parallel_degree``), DeepSpeed 1."""
    if framework == "deepspeed" or tp == 1:
        out = [1]
    elif framework == "torchtitan":
        out = [1, tp]
    else:
        width = model.moe.expert_ffn_hidden_size if model.moe is not None else 0
        out = [e for e in divisors(tp) if width % e == 0]
    return [e for e in out if space.etp is None or e in space.etp]


def micro_batch_options(st: Structure, job: TrainingJob, space: SearchSpace = SearchSpace()) -> tuple[int, ...]:
    """Micro-batch sizes that divide the per-replica batch ``global_batch_size / dp`` (increasing; none when dp
    does not divide the global batch); ``space.micro_batch_size`` pins them."""
    if job.global_batch_size % st.dp:
        return ()
    per_replica = job.global_batch_size // st.dp
    if space.micro_batch_size is not None:
        return tuple(b for b in space.micro_batch_size if per_replica % b == 0)
    return divisors(per_replica)


def vpp_options(model: ModelSpec, st: Structure, num_microbatches: int, framework: str = "megatron",
                space: SearchSpace = SearchSpace()) -> list[int]:
    """Virtual pipeline sizes: 1, or v > 1 with pp > 1, m % pp == 0 and every stage's layers divisible by v."""
    out = [1]
    if st.pp > 1 and num_microbatches % st.pp == 0 and framework != "deepspeed":
        per_stage = st.per_stage_layers(model.num_layers)
        # torchtitan has no Megatron-style first/last split with interleaving, but runs the account-for split
        # (its pipeline_parallel_first/last_stage_less_layers = 1)
        plain_ok = not (framework == "torchtitan" and st.first is not None)
        out += [v for v in range(2, MAX_VPP + 1)
                if (plain_ok and all(c % v == 0 for c in per_stage))
                or _account_split_fits(model.num_layers, st, v, framework)]
    if space.vpp is not None:
        out = [v for v in out if v in space.vpp]
    return out


def _account_split_fits(num_layers: int, st: Structure, vpp: int, framework: str) -> bool:
    """Megatron interleaves an uneven split by counting the embedding and the loss as one layer each
    (``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``; Llama 3.1 405B: 126 + 2
    over pp 16 x vpp 8, the Llama 3 paper's layout, Sec. 3.3.2): allowed when (L + 2) splits evenly over pp x vpp
    and gives each rank the layer counts of the uneven split ``st`` (first = last = (L + 2) / pp - 1). torchtitan
    runs the same split (``pipeline_parallel_first/last_stage_less_layers = 1``); DeepSpeed does not interleave."""
    if framework not in ("megatron", "torchtitan") or st.first is None or st.first != st.last:
        return False
    return (num_layers + 2) % (st.pp * vpp) == 0 and st.first == (num_layers + 2) // st.pp - 1


def sp_options(st: Structure, job: TrainingJob, framework: str = "megatron",
               space: SearchSpace = SearchSpace(), moe: bool = False) -> list[bool]:
    """Sequence parallel on/off: needs tp > 1 and (s/cp) % tp == 0; forced on for tp > 1 in a MoE model (``moe``;
    Megatron-LM's ``MoELayer.forward`` raises in training without it) or with ep > 1 (Megatron), and with any tp > 1
    (torchtitan)."""
    ok_on = st.tp > 1 and (job.seq_length // st.cp) % st.tp == 0
    opts = [sp for sp in space.sequence_parallel if (not sp) or ok_on]
    if (framework == "megatron" and st.tp > 1 and (st.ep > 1 or moe)) or (framework == "torchtitan" and st.tp > 1):
        # torchtitan's tensor parallel plan shards the norms over the sequence (apply_tp: SequenceParallel)
        opts = [sp for sp in opts if sp]
    if framework == "deepspeed" and st.cp > 1:
        # Megatron-DeepSpeed runs cp as DeepSpeed-Ulysses sequence parallelism, which megatron/initialize.py
        # refuses together with Megatron-LM's sequence parallelism (RuntimeError)
        opts = [sp for sp in opts if not sp]
    return opts


def zero_options(st: Structure, framework: str = "megatron", space: SearchSpace = SearchSpace(),
                 moe: bool = False) -> list[int]:
    """ZeRO stages: sharding needs dp*cp > 1; DeepSpeed's pipeline engine <= 1, DeepSpeed MoE (``moe``) <= 2;
    torchtitan FSDP2 3, or 0 (DDP) only when data parallelism is the only dimension."""
    out = []
    for z in space.zero_stage:
        if z >= 1 and st.dp * st.cp == 1:
            continue  # nothing to shard over
        if framework == "deepspeed" and st.pp > 1 and z >= 2:
            continue
        if framework == "deepspeed" and moe and z >= 3:
            continue  # runtime/engine.py: "Native DeepSpeed MoE is not supported with ZeRO Stage 3"
        if framework == "torchtitan" and z in (1, 2):
            continue
        if framework == "torchtitan" and z == 0 and (st.tp, st.pp, st.cp, st.ep) != (1, 1, 1, 1):
            continue  # torchtitan's DDP: "DDP has not supported > 1D parallelism" (parallelize.py)
        out.append(z)
    return out


#: Pipeline schedules each framework's search adds to its default (1F1B, interleaved when vpp > 1): Megatron's
#: combined 1F1B; torchtitan's ZB-V and DualPipeV. GPipe (1F1B's bubble with m micro-batches in flight) and ZB-H1
#: (no framework runs it one stage per rank) are left to ``evaluate``; DualPipe runs in none of the three.
SEARCH_SCHEDULES = {"megatron": ("combined-1f1b",), "deepspeed": (), "torchtitan": ("zb-v", "dualpipev")}


def schedule_options(model: ModelSpec, st: Structure, num_microbatches: int, vpp: int, zero: int, rc: str,
                     framework: str = "megatron", space: SearchSpace = SearchSpace()) -> list[str | None]:
    """Pipeline schedules of one point: None (the default, 1F1B / interleaved) and the framework's others where
    their rules hold (sources in ``planner.checks.schedule_constraints``): combined 1F1B with a MoE model, ep > 1,
    virtual stages when pp > 1, no full recompute, at most one MTP layer (then pp > 1), no Megatron-FSDP with
    virtual stages;
    ZB-V and DualPipeV with pp > 1, two chunks per rank over an even split of the layers into 2 pp stages
    (DualPipeV: m >= 2 pp; with ep > 1 no activation checkpointing, torchtitan's EP overlap)."""
    out: list[str | None] = [None]
    p, L = st.pp, model.num_layers
    for s in SEARCH_SCHEDULES.get(framework, ()):
        if s == "combined-1f1b":
            ok = (model.moe is not None and st.ep > 1 and (p == 1 or vpp > 1) and rc != "full"
                  and (model.num_mtp_layers == 0 or (model.num_mtp_layers == 1 and p > 1))
                  and not (vpp > 1 and zero >= 2))
        else:
            ok = p > 1 and vpp == 2 and st.first is None and L % (2 * p) == 0
            if s == "dualpipev":
                ok = ok and num_microbatches >= 2 * p and not (st.ep > 1 and rc != "none")
        if ok:
            out.append(s)
    if space.pipeline_schedule is not None:
        pins = set(space.pipeline_schedule)
        # a pinned default name (1f1b, interleaved) is the default schedule of its vpp
        out = [s for s in out if (s or ("interleaved" if vpp > 1 else "1f1b")) in pins]
    return out


def dominated_by_cp_twin(cp: int, mbs: int, space: SearchSpace = SearchSpace()) -> bool:
    """True when a point with context parallelism ``cp`` and micro-batch ``mbs`` has a context-parallel twin in
    ``space`` that is at least as good on both axes, so neither search lists it: cp > 1 and mbs share a factor
    c > 1, and the twin (cp / c, dp x c, mbs / c, every other knob equal) is allowed by the pins.

    Why the twin is never worse (the cost models, ``cost_models.memory`` and ``cost_models.step_time``): both run
    the same tokens per rank per micro-batch (mbs x s / cp), the same number of micro-batches (GBS / (mbs x dp)),
    the same data-parallel x context-parallel shard group (dp x cp ranks, contiguous under Megatron's tp-cp-ep-dp-pp
    order) and the same tp, ep and pp groups, so their GEMMs, element-wise passes, activations, logits, model states
    and pipeline are identical; the twin's attention sees keys c times longer (the kernel's efficiency rises with
    the key length), its ring exchange has fewer steps (none at cp 1), and its shard group has no fewer ranks per
    NVLink domain. It satisfies every rule the point does (seq % 2cp, SP's seq / cp % tp, the expert grid, the
    micro-batch divisibility, the framework rules; DeepSpeed's SP ban applies to cp > 1 only). At equal values the
    ranking prefers the smaller cp (``planner.ranking.config_key``), so the optimum and the listed top K never
    need the dominated point. tests/test_space_dominance.py checks the inequality on sampled pairs."""
    if cp == 1:
        return False
    g = math.gcd(cp, mbs)
    if g == 1:
        return False
    if space.cp is None and space.micro_batch_size is None:
        return True
    return any((space.cp is None or cp // c in space.cp)
               and (space.micro_batch_size is None or mbs // c in space.micro_batch_size)
               for c in divisors(g)[1:])


def to_parallel(st: Structure, mbs: int, vpp: int, zero: int, sp: bool, rc: str,
                schedule: str | None = None) -> ParallelConfig:
    """The ParallelConfig of one point. An uneven split interleaved (vpp > 1 with first/last stage counts that
    vpp does not divide) is Megatron's account-for-embedding/loss split (``_account_split_fits``); ``schedule``
    None is the default (1F1B, interleaved when vpp > 1)."""
    first, last = st.first, st.last
    account = vpp > 1 and first is not None and any(c % vpp for c in (first, last))
    if account:
        first = last = None
    return ParallelConfig(tp=st.tp, pp=st.pp, dp=st.dp, cp=st.cp, ep=st.ep, etp=st.etp, vpp=vpp,
                          micro_batch_size=mbs, zero_stage=zero, sequence_parallel=sp, recompute=rc,
                          first_stage_layers=first, last_stage_layers=last,
                          account_for_embedding_in_pipeline_split=account, account_for_loss_in_pipeline_split=account,
                          pipeline_layout=st.layout, schedule=schedule)


def candidates(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
               space: SearchSpace = SearchSpace(), framework: str = "megatron") -> Iterator[ParallelConfig]:
    """Every configuration of ``space`` that passes the cheap divisibility rules (no memory, no time)."""
    for st in structures(model, cluster, job, num_gpus, space, framework):
        for mbs in micro_batch_options(st, job, space):
            m = job.global_batch_size // (mbs * st.dp)
            for vpp in vpp_options(model, st, m, framework, space):
                for zero in zero_options(st, framework, space, model.moe is not None):
                    for rc in space.recompute:
                        for sched in schedule_options(model, st, m, vpp, zero, rc, framework, space):
                            for sp in sp_options(st, job, framework, space, model.moe is not None):
                                yield to_parallel(st, mbs, vpp, zero, sp, rc, sched)
