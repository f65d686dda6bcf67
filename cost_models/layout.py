"""Where layers and ranks sit: pipeline layer split and Megatron's rank order.

Layer split: Megatron-LM splits ``num_layers`` evenly over ``pp`` stages unless
``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers`` are given, in which case the
remaining layers are split evenly over the middle stages (``megatron/core/transformer/transformer_block.py``
``get_num_layers_to_build``; divisibility rules in ``arguments.py``, see formulas.md Sec. 7.1 item 8).

Rank order: Megatron's default order is ``tp-cp-ep-dp-pp`` (tp innermost, pp outermost;
``megatron/core/parallel_state.py`` ``order="tp-cp-ep-dp-pp"``). A group of dimension X has a stride equal to the
product of the sizes of the dimensions inside it; from the stride and ``gpus_per_node`` we know how many of
the group's ranks share a node (or an NVLink domain).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ParallelConfig


class LayoutError(ValueError):
    """The layer split or rank layout is impossible (message names the field)."""


def uneven_split(num_layers: int, pp: int) -> tuple[int, int] | None:
    """Pick Megatron first/last-stage layer counts when ``num_layers % pp != 0``.

    Returns ``(first, last)`` with ``first == last`` and ``(num_layers - 2*first) % (pp - 2) == 0``, choosing the
    largest such count not above ``ceil(num_layers / pp)`` (the end stages also hold the embedding and the output
    layer, so they are given fewer layers: the Llama 3 paper, Sec. 3.3.2, removes one layer from the first and
    last stage of its 126-layer, 16-stage 405B run: 7 + 14 x 8 + 7). ``None`` when no such split exists or pp < 3.
    """
    if pp < 3:
        return None
    cap = math.ceil(num_layers / pp)
    for x in range(cap, 0, -1):
        rest = num_layers - 2 * x
        if rest > 0 and rest % (pp - 2) == 0 and rest // (pp - 2) >= x:
            return x, x
    return None


def stage_layer_counts(num_layers: int, par: ParallelConfig) -> list[int]:
    """Decoder layers held by each pipeline stage (length ``pp``; sums to ``num_layers``).

    Raises:
        LayoutError: the split is impossible (layers not divisible by pp, or by the middle stages).
    """
    pp = par.pp
    first, last = par.first_stage_layers, par.last_stage_layers
    if first is None and last is None:
        if num_layers % pp:
            raise LayoutError(
                f"num_layers {num_layers} is not divisible by pp {pp}; give first/last stage layer counts")
        return [num_layers // pp] * pp
    if pp == 1:
        raise LayoutError("first/last stage layer counts need pp > 1")
    first = first if first is not None else 0
    last = last if last is not None else 0
    n_mid = pp - (1 if par.first_stage_layers is not None else 0) - (1 if par.last_stage_layers is not None else 0)
    rest = num_layers - first - last
    if n_mid == 0:
        if rest != 0:
            raise LayoutError(f"first + last stage layers ({first}+{last}) must equal num_layers {num_layers} when pp=2")
        return [first, last]
    if rest <= 0 or rest % n_mid:
        raise LayoutError(
            f"remaining {rest} layers are not divisible by the {n_mid} middle pipeline stages")
    mid = rest // n_mid
    counts = [mid] * pp
    if par.first_stage_layers is not None:
        counts[0] = first
    if par.last_stage_layers is not None:
        counts[-1] = last
    return counts


def stage_layer_ranges(num_layers: int, par: ParallelConfig) -> list[range]:
    """Global indices of the decoder layers on each stage."""
    out, start = [], 0
    for n in stage_layer_counts(num_layers, par):
        out.append(range(start, start + n))
        start += n
    return out


#: Megatron-LM default rank order, innermost first (parallel_state.py).
RANK_ORDER = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class GroupPlacement:
    """How one communication group's ranks are spread: ``size`` ranks, ``ranks_per_domain`` of them per
    NVLink domain, over ``num_domains`` domains (1 = the whole group is inside one NVLink domain)."""

    size: int
    ranks_per_domain: int

    @property
    def num_domains(self) -> int:
        return math.ceil(self.size / self.ranks_per_domain)

    @property
    def intra_domain(self) -> bool:
        return self.num_domains == 1


def group_placement(dim: str, par: ParallelConfig, domain_size: int) -> GroupPlacement:
    """Placement of the ``dim`` group (tp, cp, dp, pp, or ep) under Megatron's ``tp-cp-ep-dp-pp`` order.

    ``domain_size`` is the number of GPUs joined by NVLink (8 on a DGX, 72 on GB200 NVL72). The EP group is
    laid over the dp x cp x tp ranks (EP carved from them), so its stride is ``etp``.
    """
    sizes = {"tp": par.tp, "cp": par.cp, "dp": par.dp, "pp": par.pp}
    if dim == "ep":
        stride, size = par.expert_tp, par.ep
    else:
        stride = 1
        for d in ("tp", "cp", "dp", "pp"):
            if d == dim:
                break
            stride *= sizes[d]
        size = sizes[dim]
    if size == 1:
        return GroupPlacement(1, 1)
    per_domain = max(1, min(size, domain_size // stride)) if stride <= domain_size else 1
    return GroupPlacement(size, per_domain)
