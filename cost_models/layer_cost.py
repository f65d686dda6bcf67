"""Forward costs of one decoder layer for one micro-batch on one GPU (seconds), term by term, and what a layer
adds to its stage's forward and backward. Each term lives in its own module: ``gemm`` (weight GEMMs),
``attention`` (attention core), ``elementwise`` (memory-bound work), ``collectives`` (TP, CP, EP), ``moe_overhead``
(routing bookkeeping, host time per expert).
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from model_zoo.spec import ModelSpec

from .attention import attention_core_s
from .collectives import TP_BACKWARD_OVERLAP_WINDOW, cp_layer_s, ep_layer_s, moe_token_dispatcher, tp_layer_s
from .config import ParallelConfig, TrainingJob
from .data_parallel import overlapped_exposed_s
from .elementwise import layer_memory_bound_s
from .gemm import layer_gemms_s, op_sac_recomputed_gemms_s
from .layout import GroupPlacement
from .moe_overhead import moe_routing_s


@dataclass
class LayerCost:
    """One decoder layer's forward seconds by term (one micro-batch, one GPU); backward multipliers are applied by
    ``LayerCost.forward_s`` / ``backward_s``."""

    gemm: float = 0.0
    gemm_backward: float = 0.0  # the backward's GEMMs: input and weight gradients (``gemm.layer_gemms_s``)
    gemm_backward_mlp: float = 0.0  # the MLP / MoE block's share of ``gemm_backward``
    gemm_mlp: float = 0.0  # the MLP / MoE block's GEMMs (router, experts, shared experts) within ``gemm``
    gemm_up: float = 0.0  # MLA up-projections (q_b, kv_b) within ``gemm``
    gemm_sac: float = 0.0  # GEMMs torchtitan's per-op selective checkpointing re-runs (within ``gemm``)
    mem_mlp: float = 0.0  # the MLP activation's memory-bound share within ``mem``
    attn_f: float = 0.0
    attn_b: float = 0.0
    mem: float = 0.0
    tp: float = 0.0
    tp_blocking: float = 0.0  # the share of ``tp`` outside the TP linears (a MoE token dispatcher's gather / scatter)
    cp: float = 0.0
    ep: float = 0.0
    moe: bool = False  # a MoE layer: only its attention block's GEMMs hide the backward TP collectives
    routing_f: float = 0.0  # MoE routing bookkeeping (router kernel, token permutation), forward
    routing_b: float = 0.0  # the same, backward

    def compute_forward_s(self) -> float:
        """GEMMs + attention + memory-bound work, forward."""
        return self.gemm + self.attn_f + self.mem

    def compute_backward_s(self) -> float:
        """Backward compute: the input- and weight-gradient GEMMs (``gemm_backward``), 2x the memory-bound work, the
        attention core's own backward."""
        return self.gemm_backward + self.attn_b + 2 * self.mem

    def comm_forward_s(self, tp_exposed: float, ep_exposed: float) -> float:
        """Exposed TP, CP and EP communication, forward (``tp_exposed`` / ``ep_exposed``: shares not overlapped)."""
        return self.tp * tp_exposed + self.cp + self.ep * ep_exposed

    def tp_backward_s(self, tp_shares: tuple[float, float]) -> float:
        """Exposed TP seconds of the backward: the ``(exposed, overlapped)`` shares of ``tp``
        (``collectives.tp_backward_shares``), the overlapped part charged what it takes beyond the column-parallel
        linears' backward GEMMs (``TP_BACKWARD_OVERLAP_WINDOW`` x their block's weight-gradient GEMMs, half of
        ``gemm_backward``) and the slowdown of the GEMMs under it (``data_parallel.overlapped_exposed_s``). The blocking
        share ``tp_blocking`` (a MoE token dispatcher's gather and scatter, plain autograd collectives;
        ``collectives.mlp_block_tp_collectives``) is charged in full under that asynchronous schedule; in a MoE layer
        only the attention block's GEMMs hide the rest."""
        exposed, overlapped = tp_shares
        if not overlapped:
            return self.tp * exposed
        free = self.tp - self.tp_blocking
        backward = self.gemm_backward - self.gemm_backward_mlp if self.moe else self.gemm_backward
        window = TP_BACKWARD_OVERLAP_WINDOW * backward / 2  # the weight-gradient GEMMs: half the backward's
        return self.tp_blocking + free * exposed + overlapped_exposed_s(free * overlapped, window)

    def comm_backward_s(self, tp_shares: tuple[float, float], ep_exposed: float) -> float:
        """Exposed TP (``tp_backward_s``), CP (K/V and their gradients: 2x) and EP communication, backward."""
        return self.tp_backward_s(tp_shares) + 2 * self.cp + self.ep * ep_exposed


def layer_cost(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, layer: int,
               framework: str, groups: dict[str, GroupPlacement]) -> LayerCost:
    """Forward costs of decoder layer ``layer`` for one micro-batch on one GPU (seconds), ``groups`` the rank
    placement of each parallel dimension (``layout.group_placement``)."""
    c = LayerCost(moe=model.moe is not None and model.is_moe_layer(layer))
    c.gemm, c.gemm_mlp, c.gemm_up, c.gemm_backward, c.gemm_backward_mlp = layer_gemms_s(model, cluster, job, par,
                                                                                        layer, framework)
    if uses_op_sac(framework):
        c.gemm_sac = op_sac_recomputed_gemms_s(model, cluster, job, par, layer, framework)
    c.attn_f, c.attn_b = attention_core_s(model, cluster, job, par, framework, layer)
    c.mem, c.mem_mlp = layer_memory_bound_s(model, cluster, job, par, layer, framework)
    c.tp, c.tp_blocking = tp_layer_s(model, cluster, job, par, groups, layer, framework.split("_")[0])
    c.cp = cp_layer_s(model, cluster, job, par, groups, c.attn_f)
    c.ep = ep_layer_s(model, cluster, job, par, layer, groups, framework.split("_")[0])
    c.routing_f, c.routing_b = moe_routing_s(model, cluster, job, par, layer,
                                             moe_token_dispatcher(job, groups.get("ep")))
    return c


#: Frameworks whose ``recompute: selective`` is per-op selective activation checkpointing (torchtitan's
#: ``selective_ac_option = "op"``, the default of its Llama configs) rather than Megatron's ``--recompute-modules``.
OP_SAC_FRAMEWORKS = ("torchtitan",)
#: Share of a layer's forward TP communication that per-op selective checkpointing re-runs: sequence-parallel TP
#: all-gathers one activation before the attention and the MLP block and reduce-scatters one after each; the policy
#: saves ``reduce_scatter_tensor`` and recomputes the all-gathers (torchtitan ``_save_list``).
OP_SAC_TP_SHARE = 0.5


def uses_op_sac(framework: str) -> bool:
    """Whether ``framework``'s selective recompute is torchtitan's per-op policy (``OP_SAC_FRAMEWORKS``)."""
    return framework.split("_")[0] in OP_SAC_FRAMEWORKS


def selective_recompute_s(x: LayerCost, par: ParallelConfig, framework: str = "megatron") -> float:
    """Forward compute seconds that selective recompute re-runs in backward.

    Megatron-LM / NeMo: the modules of ``--recompute-modules``
    (``TransformerConfig.recompute_modules``; default ``core_attn``, Korthikanti et al. 2022 Sec. 5):
    ``core_attn`` the attention core, ``mlp`` a dense layer's MLP and ``moe`` a MoE layer's MoE block (GEMMs and
    activation: megatron-core ``TransformerLayer`` sets ``recompute_mlp`` for ``mlp`` only ``if not
    self.is_moe_layer``, and ``TransformerConfig.recompute_modules``: "mlp: recompute the dense MLP submodule",
    "moe: recompute the MoE layer"; Megatron-LM d48bd6be), ``mla_up_proj`` MLA's up-projections, ``moe_act`` a MoE
    layer's expert activation; ``layernorm`` and ``shared_experts`` are small and counted as the MLP's memory-bound
    share (``_mlp_recomputed``).

    torchtitan (``OP_SAC_FRAMEWORKS``): per-op checkpointing saves the outputs of the attention kernel and of every
    other ``aten.mm`` and recomputes all else: the other GEMMs (``LayerCost.gemm_sac``) and all memory-bound work
    (norms, rotary, activation, residual adds, float8 casts) of the layer (``parallelize_llama.py``
    ``_apply_ac_to_transformer_block``, option ``op``); the TP all-gathers are ``OP_SAC_TP_SHARE`` (the caller)."""
    if uses_op_sac(framework):
        return x.gemm_sac + x.mem
    mods = set(getattr(par, "recompute_modules", None) or ("core_attn",))
    block, act = _mlp_recomputed(x, mods)
    t = 0.0
    if "core_attn" in mods:
        t += x.attn_f
    if block:
        t += x.gemm_mlp + x.mem_mlp + x.routing_f
    elif act:
        t += x.mem_mlp
    if "mla_up_proj" in mods:
        t += x.gemm_up
    return t


def _mlp_recomputed(x: LayerCost, mods: set[str]) -> tuple[bool, bool]:
    """(whole MLP block, its memory-bound share only) that selective recompute's ``mods`` re-run in layer ``x``:
    the block under ``moe`` in a MoE layer and ``mlp`` in a dense one (``selective_recompute_s``); the activation
    share under ``moe_act`` / ``shared_experts`` (MoE layers) or ``layernorm`` (both)."""
    block = ("moe" if x.moe else "mlp") in mods
    act = bool(mods & ({"moe_act", "layernorm", "shared_experts"} if x.moe else {"layernorm"}))
    return block, act


def recompute_breakdown_s(x: LayerCost, par: ParallelConfig, full: bool,
                          framework: str = "megatron") -> tuple[float, float, float]:
    """(GEMM, attention, memory-bound) forward seconds that recompute re-runs for one layer: all of them under
    full recompute of the layer, else the modules of selective recompute (``selective_recompute_s``)."""
    if not full and par.recompute == "selective" and uses_op_sac(framework):
        return x.gemm_sac, 0.0, x.mem
    mods = set(getattr(par, "recompute_modules", None) or ("core_attn",)) if par.recompute == "selective" else set()
    block, act = _mlp_recomputed(x, mods)
    gemm = x.gemm if full else (x.gemm_mlp if block else 0.0) + (x.gemm_up if "mla_up_proj" in mods else 0.0)
    attn = x.attn_f if full or "core_attn" in mods else 0.0
    mem = x.mem + x.routing_f if full else (x.mem_mlp if block or act else 0.0) + (x.routing_f if block else 0.0)
    return gemm, attn, mem
