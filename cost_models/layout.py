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


def uneven_split(num_layers: int, pp: int, asymmetric: bool = True) -> tuple[int, int] | None:
    """Pick Megatron first/last-stage layer counts when ``num_layers % pp != 0``.

    Returns ``(first, last)`` with ``first == last`` and ``(num_layers - 2*first) % (pp - 2) == 0``, choosing the
    largest such count not above ``ceil(num_layers / pp)`` (the end stages also hold the embedding and the output
    layer, so they are given fewer layers: the Llama 3 paper, Sec. 3.3.2, removes one layer from the first and
    last stage of its 126-layer, 16-stage 405B run: 7 + 14 x 8 + 7). When no symmetric split exists (an odd layer
    count over an even pp: DeepSeek-V3's 61 layers over 16), the last stage, which also holds the output layer and
    the logits, gets one layer fewer than the first: ``(x, x - 1)`` (61 over 16: 3 + 14 x 4 + 2); with pp 2,
    ``(ceil(L/2), floor(L/2))``. ``asymmetric=False``: symmetric splits only (pp >= 3). ``None`` when no split
    exists or pp < 2.
    """
    if pp < 2 or (pp == 2 and not asymmetric):
        return None
    if pp == 2:
        return (num_layers + 1) // 2, num_layers // 2
    cap = math.ceil(num_layers / pp)
    for x in range(cap, 0, -1):
        rest = num_layers - 2 * x
        if rest > 0 and rest % (pp - 2) == 0 and rest // (pp - 2) >= x:
            return x, x
    if not asymmetric:
        return None
    for x in range(cap, 1, -1):
        rest = num_layers - 2 * x + 1
        if rest > 0 and rest % (pp - 2) == 0 and rest // (pp - 2) >= x:
            return x, x - 1
    return None


def deepspeed_pipeline_layout(num_layers: int, pp: int) -> str | None:
    """The layer split Megatron-DeepSpeed runs when ``pp`` does not divide the layers, as a one-chunk-per-stage
    layout string (embedding on the first stage, loss on the last); None when ``pp`` divides them (or pp < 2, or
    more stages than layers). ``GPTModelPipe`` partitions with ``partition_method='type:transformer'``: DeepSpeed's
    ``partition_balanced`` (``runtime/utils.py``) over weight 1 per transformer layer, 0 for the rest, which puts
    the heavier stages first: 70 layers over 12 stages as ``[6] * 10 + [5] * 2`` (BLOOM-176B's run), 126 over 16 as
    ``[8] * 14 + [7] * 2`` (run with deepspeed 0.19.8)."""
    if pp < 2 or num_layers % pp == 0 or num_layers < pp:
        return None
    q, r = divmod(num_layers, pp)
    chunks = ["t" * (q + 1)] * r + ["t" * q] * (pp - r)
    chunks[0] = "E" + chunks[0]
    chunks[-1] = chunks[-1] + "L"
    return "|".join(chunks)


def stage_layer_counts(num_layers: int, par: ParallelConfig) -> list[int]:
    """Decoder layers held by each pipeline stage (length ``pp``; sums to ``num_layers``).

    Three ways, as Megatron-LM (``get_transformer_layer_offset`` in
    ``megatron/core/transformer/transformer_layer.py``, ``get_num_layers_to_build``):

    * even: ``num_layers / pp`` each;
    * ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first/last-pipeline-num-layers``): the rest
      split evenly over the middle stages;
    * ``account_for_embedding/loss_in_pipeline_split``: the embedding and/or the loss count as one layer each,
      ``L' = L + e + l`` is split evenly, and the first (last) stage holds one decoder layer fewer.

    Raises:
        LayoutError: the split is impossible (layers not divisible by pp, or by the middle stages), or the two
            uneven mechanisms are combined (Megatron rejects that in ``arguments.py``).
    """
    counts = chunk_layer_counts(num_layers, par, vpp=1)
    return [c[0] for c in counts]


def chunk_layer_counts(num_layers: int, par: ParallelConfig, vpp: int | None = None) -> list[list[int]]:
    """Decoder layers of each model chunk of each stage: ``out[stage][chunk]`` (``vpp`` chunks per stage,
    default ``par.vpp``). Interleaving needs every stage's layers to split evenly over its chunks, except that
    under ``account_for_*`` the embedding/loss pseudo-layer takes one slot of the first/last chunk
    (``L'`` divisible by ``pp * vpp``; formulas.md Sec. 7.1 items 6 and 8).

    Raises:
        LayoutError: the split is impossible; the message names the rule.
    """
    pp = par.pp
    v = par.vpp if vpp is None else vpp
    if par.pipeline_layout is not None:
        return _layout_chunk_counts(num_layers, par, v)
    emb, loss = int(par.account_for_embedding_in_pipeline_split), int(par.account_for_loss_in_pipeline_split)
    first, last = par.first_stage_layers, par.last_stage_layers
    if (emb or loss) and (first is not None or last is not None):
        raise LayoutError("account_for_*_in_pipeline_split cannot be combined with first/last stage layer counts")
    if emb or loss:
        total = num_layers + emb + loss
        if total % (pp * v):
            what = "+1 embedding " * emb + "+1 loss " * loss
            raise LayoutError(f"num_layers {num_layers} {what}= {total} is not divisible by pp*vpp = {pp}*{v}")
        per_chunk = total // (pp * v)
        out = [[per_chunk] * v for _ in range(pp)]
        out[0][0] -= emb
        out[-1][-1] -= loss
        if min(min(c) for c in out) < 0 or sum(map(sum, out)) != num_layers:
            raise LayoutError(f"num_layers {num_layers} is too small for pp*vpp = {pp}*{v} with account_for_*")
        return out
    if first is None and last is None:
        if num_layers % pp:
            raise LayoutError(
                f"num_layers {num_layers} is not divisible by pp {pp}; give first/last stage layer counts")
        per_stage = [num_layers // pp] * pp
    else:
        if pp == 1:
            raise LayoutError("first/last stage layer counts need pp > 1")
        n_mid = pp - (first is not None) - (last is not None)
        rest = num_layers - (first or 0) - (last or 0)
        if n_mid == 0:
            if rest != 0:
                raise LayoutError(
                    f"first + last stage layers ({first}+{last}) must equal num_layers {num_layers} when pp=2")
            per_stage = [first, last]
        else:
            # Megatron-LM splits the rest evenly over the stages without a given count (get_num_layers_to_build);
            # its arguments.py asserts that split is even, and a stage with no decoder layer is not a layout
            ends = [(k, n) for k, n in (("first", first), ("last", last)) if n is not None]
            given = f"{' + '.join(k for k, _ in ends)} stage layers ({' + '.join(str(n) for _, n in ends)}" + (
                f" = {num_layers - rest})" if len(ends) > 1 else ")")
            others = f"{n_mid} {'middle' if len(ends) > 1 else 'other'} pipeline stage{'s' if n_mid > 1 else ''}"
            if rest < 0:
                raise LayoutError(f"{given} exceed the model's {num_layers} layers")
            if rest == 0:
                raise LayoutError(f"{given} take all {num_layers} layers: the {others} would be empty (each stage "
                                  f"needs at least one layer)")
            if rest < n_mid:
                raise LayoutError(f"{given} leave {rest} of the {num_layers} layers for the {others}: each stage "
                                  f"needs at least one layer")
            if rest % n_mid:
                raise LayoutError(f"the {rest} layers left after the {given} are not divisible by the {others}")
            per_stage = [rest // n_mid] * pp
            if first is not None:
                per_stage[0] = first
            if last is not None:
                per_stage[-1] = last
    bad = sorted({c for c in per_stage if c % v})
    if bad:
        raise LayoutError(f"stage layer counts {bad} are not divisible by vpp {v}")
    return [[c // v] * v for c in per_stage]


def parse_pipeline_layout(layout: str) -> list[str]:
    """Expand a Megatron ``--pipeline-model-parallel-layout`` string into its model chunks.

    Grammar (megatron/core/transformer/pipeline_parallel_layer_layout.py): chunks separated by ``|``; symbols
    ``E`` (embedding), ``t`` (decoder layer), ``m`` (MTP layer), ``L`` (loss); ``X*N`` repeats a symbol and
    ``(...)*N`` a group (which may contain ``|``); commas and spaces are ignored.
    ``"Et|(tt|)*30mL"`` -> ``["Et", "tt", ..., "tt", "mL"]`` (32 chunks).

    Raises:
        LayoutError: unknown symbol, unbalanced parentheses or a bad repeat count.
    """
    text = layout.replace(",", "").replace(" ", "")
    pos = 0
    # a layout of the deepest model plan3d accepts has ~2 x MAX_LAYERS symbols; "(t|)*999999999" would expand to
    # gigabytes, and thousands of nested parentheses would exhaust the parser's recursion (issue 14)
    from model_zoo.spec import MAX_LAYERS
    max_len, max_depth = 4 * MAX_LAYERS + 64, 32

    def seq(depth: int = 0) -> str:
        nonlocal pos
        if depth > max_depth:
            raise LayoutError(f"pipeline_layout: parentheses nested more than {max_depth} deep")
        out = ""
        while pos < len(text) and text[pos] != ")":
            ch = text[pos]
            if ch == "(":
                pos += 1
                item = seq(depth + 1)
                if pos >= len(text) or text[pos] != ")":
                    raise LayoutError(f"pipeline_layout {layout!r}: unbalanced parentheses")
                pos += 1
            elif ch in "Etm L|":
                item = ch
                pos += 1
            else:
                raise LayoutError(f"pipeline_layout {layout!r}: unknown symbol {ch!r} (allowed: E t m L | ( ) *N)")
            if pos < len(text) and text[pos] == "*":
                pos += 1
                start = pos
                while pos < len(text) and text[pos].isdigit():
                    pos += 1
                if start == pos:
                    raise LayoutError(f"pipeline_layout {layout!r}: '*' needs a repeat count")
                count = int(text[start:pos]) if pos - start <= 9 else max_len + 1
                if len(item) * count > max_len:
                    raise LayoutError(f"pipeline_layout: a repeat expands to more than {max_len} symbols (a model "
                                      f"has at most {MAX_LAYERS} layers)")
                item = item * count
            out += item
            if len(out) > max_len:
                raise LayoutError(f"pipeline_layout: expands to more than {max_len} symbols (a model has at most "
                                  f"{MAX_LAYERS} layers)")
        return out

    flat = seq()
    if pos != len(text):
        raise LayoutError(f"pipeline_layout {layout!r}: unbalanced parentheses")
    return flat.split("|")


def _layout_chunk_counts(num_layers: int, par: ParallelConfig, vpp: int) -> list[list[int]]:
    chunks = parse_pipeline_layout(par.pipeline_layout or "")
    pp = par.pp
    if len(chunks) % pp:
        raise LayoutError(f"pipeline_layout has {len(chunks)} chunks, not a multiple of pp {pp}")
    v = len(chunks) // pp
    if par.vpp > 1 and v != par.vpp:
        raise LayoutError(f"pipeline_layout has {v} chunks per pipeline rank but vpp is {par.vpp}")
    n_t = sum(c.count("t") for c in chunks)
    if n_t != num_layers:
        raise LayoutError(f"pipeline_layout places {n_t} decoder layers, the model has {num_layers}")
    if "E" not in chunks[0] or "L" not in chunks[-1]:
        raise LayoutError("pipeline_layout must start with E (embedding) and end with L (loss)")
    # chunk i runs on pipeline rank i % pp as its virtual stage i // pp
    per = [[chunks[vs * pp + r].count("t") for vs in range(v)] for r in range(pp)]
    if vpp == 1 and v > 1:
        return [[sum(c)] for c in per]
    return per


def balanced_pipeline_layout(num_layers: int, pp: int, vpp: int, mtp_layers: int = 0) -> str:
    """A Megatron layout string that spreads ``num_layers`` decoder layers over ``pp * vpp`` chunks, the
    embedding first and the MTP layers and loss last, the way Megatron-Bridge's recipes do:

    * the first chunk holds E + k layers, the middle ones k = ceil(L / chunks) and the last the rest + MTP +
      loss (Megatron-Bridge ``_get_deepseek_v3_pipeline_layout``, e.g. pp 4 x vpp 4: E + 4, 14 x 4, 1 + m + L);
    * when that leaves the last chunk negative, every chunk holds the same number of slots with E, m and L
      taking one each (Megatron-LM's DeepSeek-V3 layout ``Et|(tt|)*30mL`` for 32 chunks).

    Raises:
        LayoutError: no such layout (more chunks than layers).
    """
    n = pp * vpp
    tail = "m" * mtp_layers + "L"
    if n == 1:
        return "E" + "t" * num_layers + tail
    k = -(-num_layers // n)
    last = num_layers - k * (n - 1)
    if last >= 0:
        return "|".join(["E" + "t" * k] + ["t" * k] * (n - 2) + ["t" * last + tail])
    slots = num_layers + 2 + mtp_layers
    k = slots // n
    if slots % n or k - 1 - mtp_layers < 0:
        raise LayoutError(f"no balanced layout of {num_layers} layers over {n} pipeline chunks")
    chunks = ["E" + "t" * (k - 1)] + ["t" * k] * (n - 2) + ["t" * (k - 1 - mtp_layers) + tail]
    return "|".join(chunks)


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


def rank_chunks(num_layers: int, par: ParallelConfig, v: int) -> tuple[list, list[list[list[int]]]]:
    """Where each decoder layer runs: (per pipeline rank, its layers; per rank, its ``v`` model chunks' layers;
    chunk ``c`` of rank ``r`` is virtual stage ``virtual_stage(par, r, c)``).

    ``par.pipeline_layout`` (Megatron ``--pipeline-model-parallel-layout``): model chunk k runs on rank k % pp as
    virtual stage k // pp, layers numbered along the chunks (so the dense prefix of a MoE model sits on the first
    chunks); without interleaving a rank runs its chunks back to back as one. Otherwise each stage's range
    (``stage_layer_ranges``) split evenly over its ``v`` chunks (``pipeline.chunks_per_rank``: ``vpp`` under the
    interleaved orders, 2 under a V schedule, else 1).

    Raises:
        LayoutError: the layout's chunks do not hold ``num_layers`` layers over ``pp`` ranks and ``v`` chunks.
    """
    if par.pipeline_layout is not None:
        counts = [c.count("t") for c in parse_pipeline_layout(par.pipeline_layout)]
        if len(counts) % par.pp or sum(counts) != num_layers:
            raise LayoutError(f"pipeline_layout {par.pipeline_layout!r}: {len(counts)} chunks holding {sum(counts)} "
                              f"layers for pp {par.pp} and {num_layers} layers")
        per_rank = len(counts) // par.pp
        starts = [sum(counts[:k]) for k in range(len(counts))]
        by_rank = [[list(range(starts[c * par.pp + r], starts[c * par.pp + r] + counts[c * par.pp + r]))
                    for c in range(per_rank)] for r in range(par.pp)]
        if per_rank != v and v > 1:
            raise LayoutError(f"pipeline_layout {par.pipeline_layout!r} has {per_rank} chunks per rank, vpp is {v}")
        chunks = by_rank if per_rank == v else [[[i for ch in ranks for i in ch]] for ranks in by_rank]
        return [[i for ch in ranks for i in ch] for ranks in by_rank], chunks
    ranges = stage_layer_ranges(num_layers, par)
    chunks = []
    for rg in ranges:
        lay = list(rg)
        chunks.append([lay[c * len(lay) // v:(c + 1) * len(lay) // v] for c in range(v)])
    return ranges, chunks


# --- which model pieces each pipeline rank holds, by schedule ---------------------------------------------------
#: Schedules whose ranks hold two model chunks in a V: rank r runs virtual stages r and 2p-1-r, so rank 0 holds
#: both the embedding and the output layer (torch ``generate_stage_to_rank_mapping`` style "v": ZB-V, DualPipeV).
V_SHAPE_SCHEDULES = ("zb-v", "dualpipev")


def virtual_stage(par: ParallelConfig, rank: int, chunk: int) -> int:
    """Pipeline-order index of model chunk ``chunk`` of ``rank``: ``chunk*pp + rank`` (Megatron's interleaving), or
    ``rank`` / ``2pp-1-rank`` for the two chunks of a V schedule."""
    if par.pipeline_schedule in V_SHAPE_SCHEDULES:
        return rank if chunk == 0 else 2 * par.pp - 1 - rank
    return chunk * par.pp + rank


def rank_stages(par: ParallelConfig, rank: int) -> list[int]:
    """Model stages (indices into ``stage_layer_ranges``) whose layers ``rank`` holds: its own, and under DualPipe
    also the mirror stage ``pp-1-rank`` of the reverse-direction pipeline (two parameter copies; DeepSeek-V3 report,
    arXiv 2412.19437, Table 2 "Parameter 2x")."""
    if par.pipeline_schedule == "dualpipe" and par.pp > 1:
        return [rank, par.pp - 1 - rank]
    return [rank]


def holds_embedding(par: ParallelConfig, rank: int) -> bool:
    """Whether ``rank`` holds the word embedding (the first model stage)."""
    return 0 in rank_stages(par, rank)


def holds_output(par: ParallelConfig, rank: int) -> bool:
    """Whether ``rank`` holds the output layer, the loss and the MTP layers: the last model stage, which a V
    schedule places on rank 0."""
    if par.pipeline_schedule in V_SHAPE_SCHEDULES:
        return rank == 0
    return par.pp - 1 in rank_stages(par, rank)


def rank_layers(num_layers: int, par: ParallelConfig) -> list[list[int]]:
    """Decoder layer indices each pipeline rank holds (``stage_layer_ranges``, both stages under DualPipe). A V
    schedule's rank holds as many layers as its contiguous range (two chunks of ``L / 2p``)."""
    ranges = stage_layer_ranges(num_layers, par)
    return [[i for s in rank_stages(par, r) for i in ranges[s]] for r in range(par.pp)]
