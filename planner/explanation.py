"""Explanations: every constraint of a given configuration with its slack (``plan3d explain``), and, when no
plan fits, which constraint binds, by how much, and the nearest changes that make the job feasible.
"""
from __future__ import annotations

from dataclasses import dataclass

from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from model_zoo.spec import ModelSpec

from .checks import DEFAULT_MEMORY_HEADROOM, Constraint, constraint_report, memory_verdict
from .evaluation import Evaluation, evaluate
from .progress import Budget, Progress, no_progress


@dataclass
class Explanation:
    """A configuration's evaluation and all its constraints (satisfied and violated) with their slack."""

    evaluation: Evaluation
    constraints: list[Constraint]

    @property
    def binding(self) -> Constraint | None:
        """The violated constraint to fix first (structural before memory; among memory stages the most
        over), else the tightest memory stage."""
        bad = [c for c in self.constraints if not c.ok]
        structural = [c for c in bad if c.unit != "bytes"]
        if structural:
            return structural[0]
        if bad:
            return min(bad, key=lambda c: c.slack)
        mem = [c for c in self.constraints if c.unit == "bytes"]
        return min(mem, key=lambda c: c.slack) if mem else None


def explain_config(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, par: ParallelConfig, num_gpus: int,
                   memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron") -> Explanation:
    """Evaluate ``par`` and list every constraint with its slack."""
    ev = evaluate(model, cluster, job, par, num_gpus, memory_headroom, framework)
    cons = constraint_report(model, cluster, job, par, num_gpus, ev.memory, memory_headroom, framework)
    return Explanation(ev, cons)


def format_slack(c: Constraint) -> str:
    """Human slack: GiB for bytes, plain numbers otherwise."""
    if c.unit == "bytes":
        return f"{c.slack / 2**30:+.2f} GiB"
    if c.unit in ("", "remainder"):
        return "0" if c.ok else f"{c.slack:+g}"
    return f"{c.slack:+g} {c.unit}"


def explanation_rows(ex: Explanation) -> list[dict]:
    """JSON-ready rows, one per constraint (stable order)."""
    return [{"name": c.name, "ok": c.ok, "slack": c.slack, "unit": c.unit, "detail": c.detail} for c in ex.constraints]


def _plan_str(e: Evaluation, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
              at_risk_margin: float | None = None) -> str:
    """One layout and its prediction, with every knob ``plan3d evaluate`` needs to reproduce it (the stage split,
    the recomputed layers per chunk, vpp) and, given ``at_risk_margin``, "at risk" when its peak is within it."""
    p = e.parallel
    s = f"tp {p.tp} pp {p.pp} dp {p.dp}"
    if p.cp > 1:
        s += f" cp {p.cp}"
    if p.ep > 1:
        s += f" ep {p.ep}"
    if p.etp is not None and p.ep > 1:
        s += f" etp {p.etp}"
    if p.vpp > 1:
        s += f" vpp {p.vpp}"
    if p.schedule is not None:
        s += f" schedule {p.schedule}"
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        s += f" first/last stage layers {p.first_stage_layers or '-'}/{p.last_stage_layers or '-'}"
    if p.sequence_parallel:
        s += " sp"
    n = p.recompute_num_layers
    rc = p.recompute if n is None else f"{p.recompute} ({n} layer{'' if n == 1 else 's'} per chunk)"
    s += f" mbs {p.micro_batch_size} zero {p.zero_stage} recompute {rc}"
    if e.step is not None:
        s += f": {e.step.tokens_per_s:,.0f} tokens/s, step {e.step.step_s:.2f} s"
    if e.memory is not None:
        s += f", peak {e.memory.peak_bytes / 2**30:.1f} GiB"
        if at_risk_margin is not None and memory_verdict(e.memory, memory_headroom, at_risk_margin) == "at risk":
            s += f" (at risk: within {at_risk_margin:.0%} of capacity)"
    return s


def states_gpus(model: ModelSpec, cluster: ClusterSpec, frameworks, memory_headroom: float,
                **state_options: float) -> float:
    """GPUs (a fraction) that the model's parameter, gradient and optimizer states alone need when fully sharded
    (ZeRO-3: each term over the GPUs, ``cost_models.memory.model_state_terms`` with ``state_options``, the layout's
    state dtypes), under the most frugal of ``frameworks``, in the usable memory less the CUDA / allocator reserve;
    activations come on top. inf when nothing is usable."""
    from cost_models.memory import model_state_terms
    params = model.num_parameters() + model.mtp_params()
    limit = cluster.gpu.memory_bytes * (1 - memory_headroom) - cluster.calibration.memory_reserve_bytes
    if limit <= 0:
        return float("inf")
    return min(sum(model_state_terms(fw, 3, params, 1, **state_options)) for fw in frameworks) / limit


def relief_on_layout(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, p: ParallelConfig, num_gpus: int,
                     memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron",
                     where: str = "this layout", point_to_plan: bool = False) -> list[str]:
    """Predicted peak memory of ``p`` with ZeRO-3, with full recompute and with micro-batch 1 (each alone), and
    whether it then fits; with ``point_to_plan`` (``explain``'s refusal), when none fits, a last entry saying so,
    how many GPUs the model states alone fill at the layout's state dtypes (``states_gpus``; left out when states are
    offloaded to the host) and that ``plan3d plan`` searches the layouts."""
    usable = cluster.gpu.memory_bytes * (1 - memory_headroom)
    tries = []
    if p.zero_stage < 3 and p.dp * p.cp > 1 and not (framework == "deepspeed" and p.pp > 1):
        tries.append(("ZeRO-3", p.model_copy(update={"zero_stage": 3})))
    if p.recompute != "full":
        tries.append(("full recompute", p.model_copy(update={"recompute": "full", "recompute_num_layers": None})))
    if p.micro_batch_size > 1:
        tries.append(("micro-batch 1", p.model_copy(update={"micro_batch_size": 1})))
    out = []
    for what, q in tries:
        ev = evaluate(model, cluster, job, q, num_gpus, memory_headroom, framework)
        if ev.memory is not None:
            verdict = "fits" if ev.feasible else f"still over by {(ev.memory.peak_bytes - usable) / 2**30:.1f} GiB"
            extra = f", {ev.step.tokens_per_s:,.0f} tokens/s" if ev.feasible and ev.step is not None else ""
            out.append(f"{what} on {where}: peak {ev.memory.peak_bytes / 2**30:.1f} GiB ({verdict}{extra})")
    if point_to_plan and not any("(fits" in x for x in out):
        import math

        from cost_models.memory import precision_state_options, state_options_of
        opts = {**state_options_of(p), **precision_state_options(job.precision)}
        offloaded = opts["optimizer_offload_fraction"] > 0 or opts["param_offload"]
        need = states_gpus(model, cluster, {framework}, memory_headroom, **opts)
        more = (f"; the parameter, gradient and optimizer states alone fill more than {math.ceil(need) - 1} GPUs "
                f"fully sharded (ZeRO-3), before any activation" if need > num_gpus and not offloaded else "")
        out.append(f"no single change on {where} fits{more}: plan3d plan searches every layout of this job "
                   f"(and suggests a GPU count when none fits)")
    return out


def nearest_changes(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, space=None,
                    memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron",
                    closest: Evaluation | None = None, budget: Budget | None = None,
                    progress: Progress = no_progress, at_risk_margin: float | None = None) -> list[str]:
    """The nearest changes that make the job feasible, each with its predicted best plan (or memory), searched as
    ``plan`` searches (plans that clear ``at_risk_margin`` first; one that does not is said to be at risk).

    Tried in order: the closest layout with ZeRO-3 / full recompute / micro-batch 1 (predicted peak memory),
    lifting a pinned ZeRO stage / recompute / micro-batch, a shorter sequence (halved up to 4 times), and more
    GPUs (doubled up to 6 times, at most ``MAX_GPUS``). Each try is a search; they stop when ``budget`` (wall
    seconds) is spent, saying so, and report each try to ``progress``.
    """
    from dataclasses import replace

    from cluster_specs.spec import MAX_GPUS

    from .search import run_search
    from .space import SearchSpace
    space = space or SearchSpace()
    budget = budget or Budget(None)
    out: list[str] = []
    if closest is not None and closest.memory is not None:
        out += relief_on_layout(model, cluster, job, closest.parallel, num_gpus, memory_headroom, framework,
                                "the closest layout")
    tries: list[tuple[str, str, dict]] = []  # (group, label, search arguments); the first fit of a group ends it
    unpinned = SearchSpace()
    for field in ("zero_stage", "recompute", "micro_batch_size"):
        full = getattr(unpinned, field)
        if getattr(space, field) != full:
            tries.append((field, f"unpin {field.replace('_', '-')}", {"sp": replace(space, **{field: full})}))
    s = job.seq_length
    for _ in range(4):
        s //= 2
        if s < 128:
            break
        tries.append(("seq", f"--seq-length {s}", {"jb": job.model_copy(update={"seq_length": s})}))
    n = num_gpus
    for _ in range(6):
        n *= 2
        if n > MAX_GPUS:
            break
        tries.append(("gpus", f"--gpus {n}", {"n": n}))
    # every layout holds at least its 1/n share of every parameter's states (fully sharded, ZeRO-3), plus the
    # reserve: a try on n GPUs that cannot hold that much is skipped unsearched (seq and pins change no state)
    need = states_gpus(model, cluster, {framework, job.framework}, memory_headroom)

    def states_fit(n: int) -> bool:
        return need <= n

    done: set[str] = set()
    for group, label, kw in tries:
        if group in done or not states_fit(kw.get("n", num_gpus)):
            continue
        if budget.spent:
            out.append(f"(stopped trying changes after {budget.elapsed_s:.0f} s, the time budget; raise "
                       f"--time-budget to try {label} and beyond)")
            break
        progress(f"nothing fits; trying {label}")
        r = run_search(model, cluster, kw.get("jb", job), kw.get("n", num_gpus), 1, kw.get("sp", space),
                       memory_headroom, framework, at_risk_margin=at_risk_margin)
        if r.plans:
            out.append(f"{label}: {_plan_str(r.plans[0], memory_headroom, at_risk_margin)}")
            done.add(group)
    return out


def closest_structural_violations(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int,
                                  space=None, framework: str = "megatron") -> str:
    """The rules broken by the layout (tp, pp, cp over the divisors of the GPU count, or the pinned values) that
    breaks the fewest of them (ties: smaller tp, pp, cp), as ``name (message); ...``."""
    from pydantic import ValidationError

    from cost_models.config import ParallelConfig

    from .checks import check_config
    from .space import SearchSpace, divisors, layer_split
    space = space or SearchSpace()
    schedule = (space.pipeline_schedule or (None,))[0]
    best = None
    for tp in space.tp or divisors(num_gpus):
        for pp in space.pp or divisors(num_gpus):
            for cp in space.cp or [1]:
                split = layer_split(model, pp) or (None, None)
                if space.first_stage_layers or space.last_stage_layers:  # the pinned split, as the search has it
                    split = ((space.first_stage_layers or (None,))[0], (space.last_stage_layers or (None,))[0])
                dp = max(1, num_gpus // (tp * pp * cp))
                try:
                    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=(space.ep or (1,))[0],
                                         micro_batch_size=(space.micro_batch_size or (1,))[0],
                                         zero_stage=space.zero_stage[0], recompute=space.recompute[0],
                                         vpp=(space.vpp or (1,))[0],
                                         schedule=schedule if schedule not in ("1f1b", "interleaved") else None,
                                         first_stage_layers=split[0], last_stage_layers=split[1],
                                         sequence_parallel=tp > 1 and (space.ep or (1,))[0] > 1)
                except ValidationError:
                    continue
                v = check_config(model, cluster, job, par, num_gpus, framework=framework)
                key = (len(v), tp, pp, cp)
                if best is None or key < best[0]:
                    best = (key, par, v)
    if best is None:
        return "nothing (no candidate layout)"
    _, par, v = best
    rules = "; ".join(f"{x.name} ({x.message})" for x in v) or "no structural rule (memory or the search bounds)"
    return f"tp {par.tp} pp {par.pp} cp {par.cp}: {rules}"


def why_infeasible(model: ModelSpec, cluster: ClusterSpec, job: TrainingJob, num_gpus: int, res, space=None,
                   memory_headroom: float = DEFAULT_MEMORY_HEADROOM, framework: str = "megatron",
                   target_step_s: float | None = None, target_tokens_per_day: float | None = None,
                   at_risk_margin: float | None = None, budget: Budget | None = None,
                   progress: Progress = no_progress, gbs_tolerance: float | None = None) -> str:
    """One line: which constraint binds, by how much, and the nearest changes with their predicted result (when no
    layout divides the job: the nearest global batches and GPU counts that plan, searched as ``plan`` does, at
    ``at_risk_margin``), searched within ``budget`` (wall seconds), each try reported to ``progress``."""
    head = f"no feasible plan for {model.name} on {num_gpus} x {cluster.gpu.name}"
    note = getattr(res, "note", None)
    if note:  # min-gpus (a target or a deadline) stopped at its time budget before trying every count
        return f"{head}: no GPU count tried meets the target; {note}"
    if target_step_s is not None or target_tokens_per_day is not None:
        tgt = (f"step <= {target_step_s:g} s" if target_step_s is not None
               else f">= {target_tokens_per_day:.3g} tokens/day")
        fastest = ""
        missed = getattr(res, "missed", None)
        if missed:  # plans fit on num_gpus but miss: how far the fastest is from the target
            e = missed[0]
            q, got = e.parallel, (e.step.step_s if target_step_s is not None else e.step.tokens_per_s * 86400)
            ratio = got / (target_step_s if target_step_s is not None else target_tokens_per_day)
            fastest = (f"; the fastest on {num_gpus} GPUs (tp {q.tp} pp {q.pp} dp {q.dp} cp {q.cp} ep {q.ep}) "
                       + (f"takes {got:.4g} s" if target_step_s is not None else f"trains {got:.4g} tokens/day")
                       + f", {ratio:.3f}x the target")
            m = q.num_microbatches(job.global_batch_size)
            if m <= max(1, q.pp):
                # the batch, not the GPU count, caps it: each replica has too few micro-batches to share out
                fastest += (f", with {m} micro-batch(es) of {q.micro_batch_size} per replica (pp {q.pp}): the global "
                            f"batch {job.global_batch_size} caps how many GPUs help, raise --global-batch-size")
        pins = [f"--{k.replace('_', '-')}" for k in ("tp", "pp", "cp", "ep", "vpp", "micro_batch_size",
                                                     "first_stage_layers", "last_stage_layers", "pipeline_schedule")
                if space is not None and getattr(space, k, None) is not None]
        unpin = f", unpin {' '.join(pins)}," if pins else ""
        return f"{head}: no GPU count up to {num_gpus} meets the target {tgt}{fastest}; raise --gpus{unpin} or relax " \
               f"the target"
    if not res.nearest_infeasible:
        from .near_miss import describe, nearest_batches, nearest_gpu_counts
        from .space import SearchSpace
        why = closest_structural_violations(model, cluster, job, num_gpus, space, framework)
        gpn = cluster.node.gpus_per_node
        sp = space or SearchSpace()
        budget = budget or Budget(None)
        batches = describe(*nearest_batches(model, cluster, job, num_gpus, sp, memory_headroom, framework,
                                            at_risk_margin=at_risk_margin, budget=budget, progress=progress),
                           "global batches", gpn)
        gpus = describe(*nearest_gpu_counts(model, cluster, job, num_gpus, sp, memory_headroom, framework,
                                            at_risk_margin=at_risk_margin, budget=budget, progress=progress),
                        "GPU counts", gpn)
        stop = (f" (stopped looking after {budget.elapsed_s:.0f} s, the time budget; raise --time-budget to look "
                f"further)" if budget.spent else "")
        tol = ("(--global-batch-size-tolerance lets plan pick the batch)" if not gbs_tolerance else
               f"(--global-batch-size-tolerance {gbs_tolerance:g} allows +-{int(gbs_tolerance * job.global_batch_size)}"
               f" sequences: not enough for the batches above)")
        return (f"{head}: no layout satisfies the divisibility and framework rules; the closest breaks {why}; "
                f"{batches}; {gpus}{stop} {tol}; or change the sequence length or pins")
    ev = res.nearest_infeasible[0]
    mem = [v for v in ev.violations if v.name == "memory"]
    other = [v for v in ev.violations if v.name != "memory"]
    if mem:
        binding = (f"memory binds by {mem[0].excess / 2**30:.1f} GiB on the closest layout ({_plan_str(ev)}; "
                   f"{mem[0].message})")
    elif other:
        binding = f"{other[0].name} binds on the closest layout ({other[0].message})"
    else:
        binding = "no candidate passes the checks"
    changes = nearest_changes(model, cluster, job, num_gpus, space, memory_headroom, framework, ev, budget, progress,
                              at_risk_margin)
    tail = ("; ".join(changes) if changes else
            "no change tried (GPUs x64, ZeRO-3, full recompute, micro-batch 1, seq/16) fits")
    return f"{head}: {binding}. Nearest changes: {tail}"
