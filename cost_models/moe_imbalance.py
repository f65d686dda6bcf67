"""Token imbalance of dropless MoE routing over expert-parallel ranks: the busiest rank's share of routed tokens.

Dropless routing (no capacity factor) sends every token copy to the expert the router picks, so the expert buffers
of one EP rank hold as many token copies as its experts received, and the rank with the busiest experts sets the
memory peak (and waits on no one: the expert GEMM, the permutation and the all-to-all receive buffers all scale with
it). Load-balancing (an auxiliary loss, or DeepSeek-V3's auxiliary-loss-free expert bias, arXiv 2412.19437 Sec.
2.1.2) makes the *expected* load of every expert equal; within one micro-batch the loads still scatter around the
mean, because a micro-batch holds a few sequences and their content picks its experts (DeepSeek-V3 Fig. 9: expert
load per Pile domain; Wang et al. 2024, arXiv 2408.15664, "MaxVio_batch").

Model. Let the routed copies one expert receives in one micro-batch be ``mean x (1 + X_e)`` with independent
``X_e`` of zero mean and standard deviation ``cv`` (coefficient of variation of expert load). A rank holds
``n = E / ep`` experts; its load is their sum (drawn without replacement from the ``E`` experts whose total is
fixed), so its relative deviation has standard deviation ``cv x sqrt((E - n) / ((E - 1) n))`` (finite-population
correction: 0 when one rank holds all experts), and the busiest of the ``ep`` ranks sits ``z(ep)`` of those above
the mean, ``z(m)`` the expected maximum of ``m`` standard normal draws (Blom/Royston: ``z(2) = 0.564``, ``z(8) =
1.424``, ``z(64) = 2.344``)::

    rank_load_ratio(E, ep) = 1 + cv x sqrt((E - n) / ((E - 1) n)) x z(ep)

Raising EP puts fewer experts on each rank (less averaging) over more ranks (a higher maximum), so the busiest rank's
ratio grows with ``ep``: 1 at ``ep = 1`` (every copy lands on the one rank), and at ``ep = E`` (one expert per rank)
the busiest expert's ratio ``1 + cv x z(E)``, the per-expert max/mean that training logs report (``MaxVio_batch`` +
1 in Wang et al.'s terms). The user-facing setting is that per-expert ratio (``expert_load_imbalance``, the busiest
expert's routed tokens over the mean in one micro-batch): ``cv = (ratio - 1) / z(E)``.

Default. ``DEFAULT_EXPERT_LOAD_CV`` = 0.429 is pinned by NVIDIA's sizing of the per-rank expert buffers of dropless
DeepSeek-V3 (256 experts) at EP 64: Megatron-Bridge's performance recipes set ``moe_expert_rank_capacity_factor =
1.5`` (``src/megatron/bridge/perf_recipes/deepseek/common.py`` ``_enable_deepseek_full_iteration_mxfp8``, commit
067f987; also Qwen3-MoE and GPT-OSS-120B at EP 16-64), the "multiplier on buffer size relative to the perfectly
balanced case ... headroom for real-world skew", chosen from profiles "so over-budget token drop is uncommon"
(Megatron-LM ``docs/user-guide/features/paged_stash.md``, commit d98e8a6). With ``n = 4``: ``0.5 = cv x
sqrt(252 / (255 x 4)) x z(64)`` gives ``cv = 0.429``, a busiest expert at 2.21 x the mean for 256 experts, 2.01 for
64, 1.61 for 8. Runs that force balanced routing (Megatron ``--moe-router-force-load-balancing``, as the published
performance recipes do) have ratio 1.0; a run without any balancing can be far above (GPT-OSS-20B's Bridge recipe
without auxiliary loss sizes EP-8 ranks at 7x).
"""
from __future__ import annotations

import math
from functools import lru_cache

#: Coefficient of variation of the routed tokens per expert within one micro-batch (module docstring: pinned by
#: Megatron-Bridge's ``moe_expert_rank_capacity_factor`` 1.5 for dropless DeepSeek-V3 at EP 64).
DEFAULT_EXPERT_LOAD_CV = 0.429

_GRID = 4000
_LO, _HI = -9.0, 9.0


@lru_cache(maxsize=1024)
def expected_max_normal(m: int) -> float:
    """``E[max of m independent standard normal draws]`` (dimensionless): ``int x m phi(x) Phi(x)^(m-1) dx``,
    midpoint rule on [-9, 9] (error < 1e-6 for m <= 1e6). ``z(1) = 0``, ``z(2) = 1/sqrt(pi)``.

    Raises:
        ValueError: ``m`` < 1.
    """
    if m < 1:
        raise ValueError(f"m must be >= 1, got {m}")
    if m == 1:
        return 0.0
    dx = (_HI - _LO) / _GRID
    total = 0.0
    for i in range(_GRID):
        x = _LO + (i + 0.5) * dx
        phi = math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2)))
        total += x * m * phi * cdf ** (m - 1)
    return total * dx


def expert_load_cv(num_experts: int, expert_load_imbalance: float | None) -> float:
    """Coefficient of variation of tokens per expert from the busiest expert's ratio to the mean
    (``expert_load_imbalance`` >= 1; None = ``DEFAULT_EXPERT_LOAD_CV``): ``(ratio - 1) / z(E)``.

    Raises:
        ValueError: a ratio below 1.
    """
    if expert_load_imbalance is None:
        return DEFAULT_EXPERT_LOAD_CV
    if expert_load_imbalance < 1:
        raise ValueError(f"expert_load_imbalance must be >= 1 (busiest expert / mean), got {expert_load_imbalance}")
    z = expected_max_normal(num_experts)
    return (expert_load_imbalance - 1.0) / z if z > 0 else 0.0


def default_expert_imbalance(num_experts: int) -> float:
    """The default busiest-expert / mean ratio of a model with ``num_experts`` routed experts, ``1 + cv0 x z(E)``."""
    return 1.0 + DEFAULT_EXPERT_LOAD_CV * expected_max_normal(num_experts)


def rank_load_ratio(num_experts: int, ep: int, expert_load_imbalance: float | None = None) -> float:
    """Routed token copies received by the busiest of ``ep`` expert-parallel ranks over the balanced share
    (dimensionless, >= 1; module docstring). ``ep`` must divide ``num_experts``; ``ep`` 1 gives 1.0."""
    if ep <= 1 or num_experts <= 1:
        return 1.0
    n = num_experts / ep
    cv = expert_load_cv(num_experts, expert_load_imbalance)
    spread = math.sqrt(max(0.0, (num_experts - n) / ((num_experts - 1) * n)))
    return 1.0 + cv * spread * expected_max_normal(ep)
