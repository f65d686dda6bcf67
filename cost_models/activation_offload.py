"""Activation offloading to host memory (Megatron-LM fine-grained activation offloading): what moves, what stays.

Megatron-core ``--fine-grained-activation-offloading --offload-modules M...`` (``megatron/core/pipeline_parallel/
fine_grained_activation_offload.py``; ``docs/user-guide/features/fine_grained_activation_offloading.md``, commit
d98e8a6): each listed submodule's saved tensors (its input activations, as autograd saves them) are copied to pinned
host memory on a side stream (``d2h_stream``) at the end of that submodule's forward, their GPU storage released, and
reloaded on ``h2d_stream`` before the submodule's backward (the next layer's group is reloaded while the current one
runs backward: ``bulk_reload``). The tensors each module moves, in the terms of
``cost_models.activations.activation_terms_per_layer`` (``OFFLOADED_TERMS``):

=================  ==========================================================================================
module             saved tensors moved
=================  ==========================================================================================
``attn_norm``      the layer input (input layernorm's input)
``qkv_linear``     the QKV projection's input (the layernorm output)
``core_attn``      Q, K, V and the softmax statistics (flash attention's fp32 log-sum-exp)
``attn_proj``      the attention output (the output projection's input; Megatron requires ``core_attn`` with it,
                   the same tensor being saved by both)
``mlp_norm``       the pre-MLP layernorm's input
``expert_fc1``     the dispatched tokens (the experts' fc1 input)
``moe_act``        the experts' fc1 output (the activation function's input)
``fused_group_mlp``  the whole grouped expert MLP (fc1 input and output, fc2 input)
=================  ==========================================================================================

Dense MLP activations have no offload module. Layers under full recompute save only their input and are not offloaded.

What stays on the GPU (``OFFLOAD_RESIDENT_LAYERS``): after the first iteration the manager keeps the last group of each
name on the GPU (``post_warmup_callback``: "Do not offload the last X groups so that the reloading won't block the
computing stream"), and one layer's groups are in flight at a time (its D2H copy in forward, its reload ahead of the
backward that needs it): two layers' offloaded bytes of the peak stage.

Time (``transfer_exposed_s``): the copies run on their own streams, overlapped with the compute of the layer that
produced them (forward) or of the layer before them in backward; a layer exposes what its copy takes beyond its
compute, ``max(0, bytes / host_link - compute)``. Forward copies (device-to-host) and backward reloads (host-to-device)
use the two directions of the link. The host link is the cluster's ``host_link_bytes_per_s`` (per GPU per direction:
PCIe Gen5 x16 64 GB/s on DGX H100, NVLink-C2C 225 GB/s on GB200), which is why offloading pays on GB200: a 4096-token
Llama-3.1-70B layer's attention tensors (TP 8) cross C2C in less time than the layer computes.
"""
from __future__ import annotations

#: Megatron ``--offload-modules`` choices (``TransformerConfig.offload_modules``; ``gdp_qkv`` is for gated delta
#: networks, not modelled).
OFFLOAD_MODULES: tuple[str, ...] = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                    "moe_act", "fused_group_mlp")
#: Terms of ``activation_terms_per_layer`` each module moves to the host (module docstring).
OFFLOADED_TERMS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("attn_norm_in",),
    "qkv_linear": ("qkv_in",),
    "core_attn": ("qkv", "softmax_stats"),
    "attn_proj": ("attn_out",),
    "mlp_norm": ("mlp_norm_in",),
    "expert_fc1": ("expert_fc1_in",),
    "moe_act": ("expert_fc1_out",),
    "fused_group_mlp": ("expert_fc1_in", "expert_fc1_out", "expert_fc2_in"),
}
#: Layers of offloaded bytes still on the GPU at the stage's peak: the group kept back to not stall the first
#: backward, and the one in flight (module docstring).
OFFLOAD_RESIDENT_LAYERS = 2


def check_offload_modules(modules: tuple[str, ...]) -> None:
    """Megatron's rules for ``--offload-modules`` (``TransformerConfig.__post_init__``).

    Raises:
        ValueError: an unknown module; ``attn_proj`` without ``core_attn``; ``fused_group_mlp`` with ``expert_fc1``
        or ``moe_act``.
    """
    bad = [m for m in modules if m not in OFFLOAD_MODULES]
    if bad:
        raise ValueError(f"offload module {bad[0]!r}: allowed values are {', '.join(OFFLOAD_MODULES)}")
    if "attn_proj" in modules and "core_attn" not in modules:
        raise ValueError("offload module attn_proj needs core_attn (its input is core attention's output, "
                         "saved by both)")
    if "fused_group_mlp" in modules and {"expert_fc1", "moe_act"} & set(modules):
        raise ValueError("offload module fused_group_mlp moves the whole grouped MLP: not with expert_fc1 or moe_act")


def offloaded_bytes(terms: dict[str, float], modules: tuple[str, ...] | None) -> float:
    """Bytes of one layer's activation ``terms`` (``activation_terms_per_layer``) that ``modules`` move to the host."""
    if not modules:
        return 0.0
    names = {t for m in modules for t in OFFLOADED_TERMS[m]}
    return sum(v for k, v in terms.items() if k in names)


def transfer_exposed_s(nbytes: float, compute_s: float, link_bytes_per_s: float | None) -> float:
    """Seconds one layer's copy of ``nbytes`` adds to a pass whose compute under it takes ``compute_s``:
    ``max(0, nbytes / link - compute_s)`` (module docstring). No link figure: 0 for nothing to move.

    Raises:
        ValueError: bytes to move but no host link bandwidth.
    """
    if nbytes <= 0:
        return 0.0
    if not link_bytes_per_s:
        raise ValueError("activation offloading needs the cluster's host link bandwidth "
                         "(operations.storage.host_link_bytes_per_s)")
    return max(0.0, nbytes / link_bytes_per_s - compute_s)
