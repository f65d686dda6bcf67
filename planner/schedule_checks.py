"""The pipeline schedule's rules, re-checked independently of the search (``planner.checks`` lists them with the
other constraints; ``planner.space.schedule_options`` is the search's own copy).

* the framework runs the schedule (``FRAMEWORK_SCHEDULES``, each with its name there);
* 1F1B and GPipe run one model chunk per rank (vpp 1): Megatron-LM interleaves any rank holding several, and torch's
  ``Schedule1F1B`` / ``ScheduleGPipe`` are single-stage schedules;
* ZB-V and DualPipeV: two chunks per rank in a V over an even split of 2·pp virtual stages (torch
  ``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``: "requires exactly 2 stages per rank");
* DualPipe: an even pp and an even num_microbatches >= 2·pp; DualPipeV: >= 2·pp (deepseek-ai/DualPipe asserts);
* Megatron's combined 1F1B: a MoE model with ep > 1, virtual stages when pp > 1, no full recompute and no ``moe``
  recompute module, at most one MTP layer and then pp > 1 (megatron-core 0.16.1 ``TransformerConfig.__post_init__``),
  no Megatron-FSDP with virtual stages (``combined_1f1b.py``).
"""
from __future__ import annotations

from cost_models.config import ParallelConfig
from model_zoo.spec import ModelSpec

from .checks import Constraint

#: Pipeline schedules each framework runs (its own name for it): Megatron-LM ``pipeline_parallel/schedules.py``
#: (``forward_backward_pipelining_without_interleaving`` / ``_with_interleaving``) and ``combined_1f1b.py``
#: (``--overlap-moe-expert-parallel-comm``); DeepSpeed ``runtime/pipe/schedule.py`` ``TrainSchedule`` (1F1B order);
#: torchtitan ``pipeline_parallel_schedule`` = torch ``get_schedule_class`` names (torch 2.13
#: ``distributed/pipelining/schedules.py``). DualPipe (two directions, deepseek-ai/DualPipe) runs in none of them.
FRAMEWORK_SCHEDULES: dict[str, dict[str, str]] = {
    "megatron": {"1f1b": "1F1B", "interleaved": "interleaved 1F1B", "combined-1f1b": "combined 1F1B"},
    "deepspeed": {"1f1b": "TrainSchedule"},
    "torchtitan": {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe", "zb-v": "ZBVZeroBubble",
                   "dualpipev": "DualPipeV"},
}


def schedule_constraints(model: ModelSpec, par: ParallelConfig, m: int, framework: str) -> list[Constraint]:
    """The pipeline schedule's rules: the framework runs it, and its own shape rules (sources inline)."""
    s, p, v = par.pipeline_schedule, par.pp, par.vpp
    runs = FRAMEWORK_SCHEDULES.get(framework, {})
    out = [Constraint("schedule_framework", s in runs, 0.0 if s in runs else -1.0, "",
                      f"pipeline schedule {s} on {framework}: " + (f"runs as {runs[s]}" if s in runs else
                      f"{framework} runs {', '.join(runs)} only"
                      + (" (DualPipe's two-direction schedule: deepseek-ai/DualPipe; torchtitan runs DualPipeV)"
                         if s == "dualpipe" else "")))]
    add = out.append
    if s in ("1f1b", "gpipe") and v > 1:
        # a named single-chunk schedule with several chunks per rank runs as another schedule, or not at all
        add(Constraint("schedule_single_chunk", False, -1.0, "",
                       f"pipeline schedule {s} runs one model chunk per rank, not vpp {v}: Megatron-LM interleaves "
                       f"whenever a rank holds several (pipeline_parallel/schedules.py), torch's Schedule1F1B and "
                       f"ScheduleGPipe take one stage per rank (PipelineScheduleSingle); use --pipeline-schedule "
                       f"interleaved or --vpp 1"))
    uneven = (par.first_stage_layers is not None or par.last_stage_layers is not None or par.pipeline_layout is not None
              or par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split)
    if s in ("zb-v", "dualpipev"):
        # torch ScheduleZBVZeroBubble / ScheduleDualPipeV: "requires exactly 2 stages per rank", V placement of stages
        # r and 2p-1-r; plan3d models the even split only (model.num_layers over 2p virtual stages)
        add(Constraint("schedule_v_chunks", p > 1 and v == 2, 0.0 if p > 1 and v == 2 else -1.0, "",
                       f"{s} runs exactly two model chunks per rank on pp > 1 (vpp {v}, pp {p})"))
        add(Constraint("schedule_v_split", not uneven and model.num_layers % (2 * p) == 0,
                       -float(model.num_layers % (2 * p)) if not uneven else -1.0, "remainder",
                       f"{s}: num_layers {model.num_layers} split evenly over 2*pp = {2 * p} V stages"
                       + (" (no first/last, account-for or layout split)" if uneven else "")))
    if s == "dualpipev":
        add(Constraint("schedule_microbatches", m >= 2 * p, float(m - 2 * p), "micro-batches",
                       f"DualPipeV needs num_microbatches >= 2*pp (deepseek-ai/DualPipe dualpipev.py; torch "
                       f"ScheduleDualPipeV): {m} vs {2 * p}"))
    if s == "dualpipe":
        ok = p >= 2 and p % 2 == 0 and v == 1
        add(Constraint("schedule_dualpipe_pp", ok, 0.0 if ok else -1.0, "",
                       f"DualPipe runs an even pp >= 2 with one chunk per direction (pp {p}, vpp {v})"))
        ok = m % 2 == 0 and m >= 2 * p
        add(Constraint("schedule_microbatches", ok, float(m - 2 * p) if m % 2 == 0 else -1.0, "micro-batches",
                       f"DualPipe needs an even num_microbatches >= 2*pp (deepseek-ai/DualPipe dualpipe.py asserts): "
                       f"{m} vs {2 * p}"))
    if s == "combined-1f1b":
        # megatron-core TransformerConfig.__post_init__ (overlap_moe_expert_parallel_comm) and combined_1f1b.py
        ep_ok = model.moe is not None and par.ep > 1
        add(Constraint("schedule_combined_ep", ep_ok, 0.0 if ep_ok else -1.0, "",
                       "combined 1F1B overlaps the expert-parallel all-to-all: needs a MoE model with ep > 1 "
                       f"(ep {par.ep})"))
        vpp_ok = p == 1 or v > 1
        add(Constraint("schedule_combined_vpp", vpp_ok, 0.0 if vpp_ok else -1.0, "",
                       f"combined 1F1B with pp {p} > 1 needs virtual pipeline stages (vpp {v})"))
        rc_ok = par.recompute != "full" and "moe" not in (par.recompute_modules or ())
        add(Constraint("schedule_combined_recompute", rc_ok, 0.0 if rc_ok else -1.0, "",
                       f"combined 1F1B: no full recompute and no 'moe' recompute module (recompute {par.recompute})"))
        mtp_ok = model.num_mtp_layers == 0 or (model.num_mtp_layers == 1 and p > 1)
        add(Constraint("schedule_combined_mtp", mtp_ok, 0.0 if mtp_ok else -1.0, "",
                       f"combined 1F1B supports at most one MTP layer, and only with pp > 1 (MTP layers "
                       f"{model.num_mtp_layers}, pp {p})"))
        fsdp_ok = not (v > 1 and par.zero_stage >= 2)
        add(Constraint("schedule_combined_fsdp", fsdp_ok, 0.0 if fsdp_ok else -1.0, "",
                       "combined 1F1B with virtual pipeline stages does not run Megatron-FSDP (zero_stage "
                       f"{par.zero_stage}; combined_1f1b.py)"))
    return out
