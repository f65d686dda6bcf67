"""The published-runs dataset of ``plan3d validate`` and what each row means: loading the rows (with the
plausible range of every number a row may hold), and turning a row into plan3d's inputs: the model (zoo, Hugging
Face config or the row's own shapes), the cluster its GPU label names, the training job, the parallel configuration,
the framework and FLOP convention, and the step-time options its recipe sets (``row_step_options``).

Where a row leaves a setting out, the framework's documented default is used and named in the row's assumptions
(``_FRAMEWORK_DEFAULTS``); what a row needs beyond its published columns is read from its ``setup`` block
(``planner/row_options.py``), each value with its source. Nothing here is keyed on a source's name.
"""
from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cluster_specs import ClusterSpecError, get_cluster, load_cluster
from cluster_specs.spec import ClusterSpec
from cost_models.config import ParallelConfig, TrainingJob
from cost_models.flops import model_flops_per_token_variant
from cost_models.fp8_recipe import host_cost_class
from cost_models.layout import deepspeed_pipeline_layout, parse_pipeline_layout, uneven_split
from model_zoo import get_model
from model_zoo.hf_config import from_hf_config
from model_zoo.spec import ModelSpec

from .errors import PlanInputError
from .row_options import apply_row_options, row_fp8_recipe, row_setup, setup_source

#: FLOP conventions a row's ``setup.flops_convention`` may name (used only for rows without tokens/s or step time):
#: ``n21_hardware``: Narayanan et al. SC21 eq. (3), 96·B·s·l·h²(1 + s/6h + V/16lh): GEMMs + full (not causal-halved)
#: attention, 4 passes with recompute, logits 3 passes; ``bloom_hardware``: BLOOM's Megatron-DeepSpeed logger, the
#: same formula with the checkpoint factor 4 on every term ("4*2 coefficient"); ``full_attention``: model FLOPs with
#: the attention core counted over the whole s x s matrix (Megatron-LM's ``num_floating_point_operations`` before
#: April 2025, formulas.md Sec. 3.2; NeMo 24.07); ``causal`` (the default): Megatron-LM's current count, causal
#: attention halved. Where a row has both tokens/s and TFLOP/s, ``implied_flops_per_token`` confirms the choice.
DEFAULT_CONVENTION = "causal"

#: Built-in zoo models by the (normalised) names rows use.
_ZOO_BY_NAME: list[tuple[str, str]] = [
    (r"^llama ?3(\.1)?[-_ ]?8b$", "llama3.1-8b"),
    (r"^llama ?3(\.1)?[-_ ]?70b$", "llama3.1-70b"),
    (r"^llama ?3(\.1)?[-_ ]?405b$", "llama3.1-405b"),
    (r"^llama ?2[-_ ]?7b$", "llama2-7b"),
    (r"^llama ?2[-_ ]?13b$", "llama2-13b"),
    (r"^llama ?2[-_ ]?70b$", "llama2-70b"),
    (r"^gpt ?3[-_ ]?175b$", "gpt3-175b"),
    (r"^nemotron[-_ ]?340b$", "nemotron-4-340b"),
    (r"^deepseek[-_ ]?v3", "deepseek-v3"),
    (r"^bloom 176b$", "bloom-176b"),
]

#: Qwen3 MoE architectures (Hugging Face config.json values) for rows that name them.
_HF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-30b-a3b": ("https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json", {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False, "max_position_embeddings": 40960}),
    "qwen3-235b-a22b": ("https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json", {
        "model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False, "max_position_embeddings": 40960}),
}

#: NeMo GPT-3 architectures (NeMo-Framework-Launcher launcher_scripts/conf/training/gpt3/{5b,20b}.yaml at commit
#: f4761e62315b9b1b991f101fc2be34a872cda708): GPT-2 BPE vocabulary (50257), ffn 4h, LayerNorm, biases, learned
#: positions, seq 2048. (layers, hidden, heads).
_NEMO_GPT3: dict[str, tuple[int, int, int]] = {"gpt3-5b": (24, 4096, 32), "gpt3-20b": (44, 6144, 48)}
_NEMO_GPT3_SOURCE = ("https://github.com/NVIDIA/NeMo-Framework-Launcher/blob/f4761e62315b9b1b991f101fc2be34a872cda708/"
                     "launcher_scripts/conf/training/gpt3/{}.yaml")

#: Nemotron-3 architectures (NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_{8b,22b}.yaml,
#: commits 329df4af / 3dd35614): squared-ReLU MLP (not gated), LayerNorm1p, no biases, RoPE, untied embeddings.
#: (layers, hidden, heads, ffn). Vocabulary 256000: the YAML leaves it to the tokenizer; 256k is the NeMo
#: sentencepiece vocabulary of the Nemotron family (model zoo nemotron-4-340b) - an assumption, named per row.
_NEMOTRON3: dict[str, tuple[int, int, int, int]] = {"nemotron-8b": (32, 4096, 32, 16384),
                                                    "nemotron-22b": (40, 6144, 48, 24576)}
_NEMOTRON3_SOURCE = {"nemotron-8b": "https://github.com/NVIDIA/NeMo-Framework-Launcher/blob/"
                                    "329df4afe20d7456105cd2b7727bfd2fc6d4f087/launcher_scripts/conf/training/nemotron/"
                                    "nemotron_8b.yaml",
                     "nemotron-22b": "https://github.com/NVIDIA/NeMo-Framework-Launcher/blob/"
                                     "3dd35614cf43b06711ad0eccaace3b6af0fc6a08/launcher_scripts/conf/training/nemotron/"
                                     "nemotron_22b.yaml"}

#: GPU label in a row -> built-in cluster. GB300 rows are not mapped to ``gb300-nvl72``: its GEMM efficiency is GB200's
#: (no GB300 matmul measurement exists in hardware.yaml or was found), and mapped that way its six rows come out 5-32%
#: too slow (LOGO 8.47% over 97 rows against 7.46% over 91, Dec 2026; 6.95% against 6.59%, and in-sample 5.76% against
#: 5.20%, on 2026-12-02), so they wait for a GB300 GEMM measurement (``_UNMAPPED_GPUS`` says so in the report).
_UNMAPPED_GPUS: list[tuple[str, str]] = [
    (r"^gb300", "gb300-nvl72 takes GB200's GEMM efficiency (no GB300 matmul measurement): not compared until one "
                "exists"),
]
_CLUSTER_BY_GPU: list[tuple[str, str]] = [
    (r"^gb200", "gb200-nvl72"),
    (r"^b200", "dgx-b200"),
    (r"^h200", "dgx-h200"),
    (r"^h100", "dgx-h100"),
]

#: Framework defaults used where a row leaves a setting out (each is named in the row's assumptions).
#: Megatron-LM ``arguments.py``: micro-batch 1, no recompute, no SP, no distributed optimizer, 1F1B.
#: NeMo / Megatron-Bridge recipes (``nemo/collections/llm/recipes``, Megatron-Bridge ``recipes``): distributed
#: optimizer on, sequence parallel on whenever TP > 1. torchtitan (``torchtitan/config/job_config.py``): FSDP
#: (ZeRO-3 sharding), sequence parallel inside its TP plan, seq_len 8192, pipeline micro-batch 1.
_FRAMEWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    "megatron": {"mbs": 1, "recompute": "none", "sp_with_tp": True, "zero": 1, "seq": None},
    "nemo": {"mbs": 1, "recompute": "none", "sp_with_tp": True, "zero": 1, "seq": None},
    "torchtitan": {"mbs": 1, "recompute": "none", "sp_with_tp": True, "zero": 3, "seq": 8192},
    "deepspeed": {"mbs": 1, "recompute": "none", "sp_with_tp": False, "zero": 1, "seq": None},
}

#: A row's framework when its ``setup`` names none: ``parallel.other.framework`` as published, by name.
_FRAMEWORK_NAMES: list[tuple[str, str]] = [
    (r"deepspeed", "deepspeed"), (r"torchtitan", "torchtitan"), (r"nemo|bridge", "nemo"), (r"megatron", "megatron"),
]


def row_framework(row: dict[str, Any]) -> str:
    """The row's framework: ``setup.framework``, else the published ``parallel.other.framework`` by name, else
    ``megatron`` (the framework whose defaults ``_FRAMEWORK_DEFAULTS`` fills in)."""
    fw = row_setup(row).framework
    if fw is not None:
        return fw
    text = str(((row.get("parallel") or {}).get("other") or {}).get("framework") or "").lower()
    return next((name for pat, name in _FRAMEWORK_NAMES if re.search(pat, text)), "megatron")


def row_convention(row: dict[str, Any]) -> str:
    """How the row's source counts TFLOP/s: ``setup.flops_convention``, else ``DEFAULT_CONVENTION``."""
    return row_setup(row).flops_convention or DEFAULT_CONVENTION


# --------------------------------------------------------------------------------------------- loading


def default_dataset() -> Path:
    """The packaged development rows (copied from /work/shared/data/published_runs.yaml, sources kept)."""
    return Path(str(resources.files("planner") / "data" / "published_runs_dev.yaml"))


#: Largest dataset read: the packaged development rows are 190 KiB; 4 MiB is 20x that and parses in a few seconds.
MAX_DATASET_BYTES = 4 * 2**20


def _row_ranges() -> dict[tuple[str, str], Any]:
    """(section, key) -> ``Plausible`` range of every number a row may hold: the specs' own ranges (model_zoo/spec.py,
    cluster_specs/spec.py, cost_models/config.py) for what they describe, the ones below for measurements."""
    from cluster_specs.spec import MAX_GPUS
    from cost_models.config import GLOBAL_BATCH
    from model_zoo import spec as ms
    from model_zoo.input_guard import Plausible
    degree = Plausible(1, MAX_GPUS, "a parallel degree: one GPU to MAX_GPUS")
    fraction = Plausible(1e-4, 1, "a fraction of peak")
    return {
        **{("parallel", k): degree for k in ("tp", "pp", "dp", "cp", "ep", "etp", "virtual_pipeline")},
        ("parallel", "micro_batch_size"): GLOBAL_BATCH, ("parallel", "global_batch_size"): GLOBAL_BATCH,
        ("hardware", "num_gpus"): degree, ("hardware", "gpus_per_node"): degree,
        ("hardware", "memory_gb"): Plausible(1, 100 * 288, "1 GB to 100x the 288 GB of the largest GPUs"),
        ("architecture", "num_layers"): ms.LAYERS, ("architecture", "hidden_size"): ms.WIDTH,
        ("architecture", "num_attention_heads"): ms.HEADS, ("architecture", "num_kv_heads"): ms.HEADS,
        ("architecture", "ffn_hidden_size"): ms.FFN, ("architecture", "vocab_size"): ms.VOCAB,
        ("architecture", "seq_length"): ms.POSITIONS,
        ("measured", "tokens_per_sec_per_gpu"): Plausible(1e-3, 1e9, "up to a 1B model at 100x GB200's peak"),
        ("measured", "tflops_per_gpu"): Plausible(1e-3, 1e6, "up to 100x GB200's dense FP4 10 PFLOP/s"),
        ("measured", "mfu"): fraction, ("measured", "hfu"): fraction,
        ("measured", "step_time_s"): Plausible(1e-4, 1e6, "0.1 ms to 11 days per step"),
    }


def load_rows(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows of a published-runs YAML file (a list of mappings with ``id``); one-line error on bad input: a file that
    cannot be read, is larger than MAX_DATASET_BYTES, not UTF-8, malformed or nested too deep; a row whose numbers
    are not numbers or outside their plausible range (``_row_ranges``), naming the row and the field."""
    from model_zoo.input_guard import parse, read_text
    p = Path(path) if path is not None else default_dataset()
    try:
        is_file, is_dir = p.is_file(), p.is_dir()
    except (OSError, ValueError) as e:  # a name too long for the file system
        raise PlanInputError(f"--dataset: {str(p)[:200]}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not is_file:
        raise PlanInputError(f"--dataset: {p}: " + ("is a directory; give a YAML file" if is_dir else "no such file"))
    text = read_text(p, MAX_DATASET_BYTES, PlanInputError, "--dataset")
    try:
        data = parse(text, "yaml", f"--dataset: {p.name}", PlanInputError)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlanInputError(f"--dataset: {p.name}: malformed YAML{at}: {' '.join(str(problem).split())}") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) and "id" in r for r in data):
        raise PlanInputError(f"--dataset: {p.name}: must be a YAML list of rows, each with an 'id'")
    seen: set = set()
    ranges = _row_ranges()
    for r in data:
        rid = r["id"]
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise PlanInputError(f"--dataset: {p.name}: row id {str(rid)[:60]!r} must be a string")
        if rid in seen:
            raise PlanInputError(f"--dataset: {p.name}: row id {rid!r} appears twice")
        seen.add(rid)
        for section in ("source", "model", "architecture", "hardware", "parallel", "measured"):
            if r.get(section) is not None and not isinstance(r[section], dict):
                raise PlanInputError(f"--dataset: {p.name}: row {rid!r}: {section} must be a mapping")
        for (section, k), rng in ranges.items():
            v = (r.get(section) or {}).get(k)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise PlanInputError(f"--dataset: {p.name}: row {rid!r}: {section}.{k} must be a number, got "
                                     f"{str(v)[:60]!r}")
            bad = rng.message(f"{section}.{k}", v)
            if bad:
                raise PlanInputError(f"--dataset: {p.name}: row {rid!r}: {bad}")
    return data


def _norm(s: str) -> str:
    return re.sub(r"\s*\(.*?\)\s*", " ", s.lower()).strip()


def row_model(row: dict[str, Any], notes: list[str]) -> ModelSpec | str:
    name = _norm(str(row.get("model", {}).get("name", "")))
    arch = row.get("architecture") or {}
    key = name.replace("_", "-").replace(" ", "-")
    for k, (src, cfg) in _HF_CONFIGS.items():
        if key == k:
            notes.append(f"architecture: {src}")
            return from_hf_config(cfg, name=k, source=src)
    if key in _NEMOTRON3:
        L, h, a, f = _NEMOTRON3[key]
        src = _NEMOTRON3_SOURCE[key]
        notes.append(f"architecture: {src}; vocab 256000 assumed (Nemotron sentencepiece)")
        return ModelSpec(name=key, source=src, family="nemotron", num_layers=L, hidden_size=h,
                         num_attention_heads=a, num_kv_heads=a, head_dim=h // a, ffn_hidden_size=f, gated_mlp=False,
                         activation="relu2", normalization="layernorm", vocab_size=256000,
                         tie_word_embeddings=False, position_embedding="rope", max_position_embeddings=4096)
    if key in _NEMO_GPT3:
        L, h, a = _NEMO_GPT3[key]
        src = _NEMO_GPT3_SOURCE.format(key.split("-")[1])
        notes.append(f"architecture: {src}")
        return ModelSpec(name=key, source=src, family="gpt", num_layers=L, hidden_size=h, num_attention_heads=a,
                         num_kv_heads=a, head_dim=h // a, ffn_hidden_size=4 * h, gated_mlp=False, activation="gelu",
                         normalization="layernorm", qkv_bias=True, linear_bias=True, vocab_size=50257,
                         tie_word_embeddings=True, position_embedding="learned", max_position_embeddings=2048)
    for pat, zoo in _ZOO_BY_NAME:
        if re.search(pat, name):
            m = get_model(zoo)
            if zoo == "deepseek-v3" and "w/o mtp" in str(row.get("model", {}).get("name", "")).lower():
                m = m.model_copy(update={"num_mtp_layers": 0})
            notes.append(f"architecture: model zoo '{zoo}'")
            return m
    need = ("num_layers", "hidden_size", "num_attention_heads")
    if any(arch.get(k) is None for k in need) or arch.get("moe"):
        # a zoo name written another way, when the row states no architecture of its own: case, spaces, hyphens,
        # underscores and dots ignored ("Llama3.1 70B" is llama3.1-70b)
        from model_zoo import list_models
        canon = re.sub(r"[\s._-]", "", name)
        zoo_key = next((z for z in list_models() if re.sub(r"[\s._-]", "", z) == canon), None) if canon else None
        if zoo_key is not None:
            notes.append(f"architecture: model zoo '{zoo_key}'")
            return get_model(zoo_key)
        return f"architecture not stated (missing {', '.join(k for k in need if arch.get(k) is None) or 'MoE dims'}) and no model of that name"
    h, a, L = arch["hidden_size"], arch["num_attention_heads"], arch["num_layers"]
    gated = str(arch.get("activation") or "").lower() in ("swiglu", "geglu")
    ffn = arch.get("ffn_hidden_size") or 4 * h
    if arch.get("ffn_hidden_size") is None:
        notes.append("ffn_hidden_size = 4h (GPT-3 style; row leaves it out)")
    return ModelSpec(
        name=str(row["model"].get("name")), source=f"published_runs row {row['id']}", num_layers=L, hidden_size=h,
        num_attention_heads=a, num_kv_heads=arch.get("num_kv_heads") or a, head_dim=h // a, ffn_hidden_size=ffn,
        gated_mlp=gated, activation="swiglu" if gated else "gelu", normalization="rmsnorm" if gated else "layernorm",
        qkv_bias=not gated, linear_bias=not gated, vocab_size=arch.get("vocab_size") or 51200,
        tie_word_embeddings=not gated, position_embedding="rope" if gated else "learned",
        max_position_embeddings=arch.get("seq_length") or 2048)


def _cluster_for(row: dict[str, Any], notes: list[str] | None = None) -> ClusterSpec | str:
    """The row's machine: the cluster its ``setup.cluster`` names (built-in name or YAML path), else the built-in
    cluster of its GPU label (``_CLUSTER_BY_GPU``; A100 by memory size); a string says why there is none."""
    hw = row.get("hardware") or {}
    named = row_setup(row).cluster
    if named is not None:
        try:
            c = load_cluster(named)
        except ClusterSpecError as exc:
            raise PlanInputError(f"row {row.get('id')!r}: setup.cluster: {exc}") from None
        if notes is not None:
            notes.append(f"cluster {c.name} (row setup: {c.description})")
        return c
    gpu = str(hw.get("gpu") or "").lower()
    if gpu.startswith("a100"):
        return get_cluster("dgx-a100-40g" if hw.get("memory_gb") == 40 else "dgx-a100-80g")
    for pat, name in _CLUSTER_BY_GPU:
        if re.search(pat, gpu):
            return get_cluster(name)
    for pat, why in _UNMAPPED_GPUS:
        if re.search(pat, gpu):
            return f"GPU '{hw.get('gpu')}': {why}"
    return f"no cluster spec for GPU '{hw.get('gpu')}'"


def row_precision(p: Any, notes: list[str]) -> str:
    s = str(p or "").lower()
    if not s:
        notes.append("precision bf16 (row leaves it out; the MFU/TFLOP ratio of such rows implies the BF16 peak)")
        return "bf16"
    if "fp8" in s or "float8" in s:
        return "fp8"
    return "fp16" if s.startswith("fp16") else "bf16"


def _recompute(r: Any, fw: str, notes: list[str]) -> str:
    s = str(r or "").lower()
    if not s:
        d = _FRAMEWORK_DEFAULTS[fw]["recompute"]
        notes.append(f"recompute {d} ({fw} default)")
        return d
    if s.startswith("full"):
        return "full"
    if s.startswith("selective"):
        return "selective"
    return "none"


def _layer_split(num_layers: int, pp: int, vpp: int) -> tuple[int | None, int | None]:
    """First/last stage layer counts when ``num_layers`` does not split evenly over ``pp`` (Megatron's
    ``--decoder-first/last-pipeline-num-layers``); (None, None) when it does."""
    if num_layers % pp == 0:
        return None, None
    u = uneven_split(num_layers, pp, asymmetric=False)
    if u is not None:
        return u
    # no symmetric split: full stages then the remainder on the last (the Megatron MoE recipes' DeepSeek-V3
    # layouts put 4 layers on every stage and 1 + MTP on the last: "Et*4|(t*4|)*14tmL")
    k = math.ceil(num_layers / pp)
    last = num_layers - (pp - 1) * k
    if last <= 0:
        k = num_layers // pp
        last = num_layers - (pp - 1) * k
    return None, last


def row_pipeline_layout(row: dict[str, Any]) -> tuple[str, str] | None:
    """The Megatron ``--pipeline-model-parallel-layout`` of a row whose recipe sets one, and where it was read (the
    published ``parallel.other.features`` "pp layout ...", else ``setup.pipeline_layout``); None if the recipe uses
    Megatron's default split."""
    other = (row.get("parallel") or {}).get("other") or {}
    m = re.search(r"pp layout\s+(\S+)", str(other.get("features", "")), re.I)
    if m:
        return m.group(1), f"pipeline layout {m.group(1)} (recipe YAML pipeline_model_parallel_layout)"
    s = row_setup(row)
    if s.pipeline_layout is not None:
        return s.pipeline_layout, f"pipeline layout {s.pipeline_layout} ({setup_source(s, 'pipeline_layout')})"
    return None


def torchtitan_split_layout(num_layers: int, stages: int) -> str:
    """torchtitan's default pipeline split as a Megatron layout string: ``generate_split_points``
    (``torchtitan/parallelisms/pipelining_utils.py``, Dec 2024) gives the first and last stage ``L // stages``
    layers and the middle stages one more while ``L % stages`` lasts; the embedding sits on the first stage, the
    norm and output layer on the last. Llama 3.1 405B (126 layers) over pp 8 x 2: 7, 14 x 8, 7."""
    base, extra = divmod(num_layers, stages)
    counts = [base] + [0] * (stages - 1)
    for i in range(1, stages - 1):
        counts[i] = base + (1 if extra > 0 else 0)
        extra -= 1 if extra > 0 else 0
    counts[-1] = num_layers - sum(counts[:-1])
    chunks = ["t" * c for c in counts]
    chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    return "|".join(chunks)


def row_model_cluster_seq(row: dict[str, Any], fw: str, notes: list[str]) -> tuple[ModelSpec, ClusterSpec, int] | str:
    """The row's model, cluster and sequence length (the framework's default when the row leaves it out, noted), or
    why one of them cannot be had."""
    model = row_model(row, notes)
    if isinstance(model, str):
        return model
    cluster = _cluster_for(row, notes)
    if isinstance(cluster, str):
        return cluster
    seq = (row.get("architecture") or {}).get("seq_length") or _FRAMEWORK_DEFAULTS[fw]["seq"]
    if seq is None:
        return "sequence length not stated"
    if (row.get("architecture") or {}).get("seq_length") is None:
        notes.append(f"seq_length {seq} ({fw} default)")
    return model, cluster, int(seq)


def build_inputs(row: dict[str, Any]) -> tuple[ModelSpec, ClusterSpec, TrainingJob, ParallelConfig, str, list[str]] | str:
    """(model, cluster, job, parallel config, framework, assumptions) for one row, or why it cannot be built."""
    notes: list[str] = []
    fw = row_framework(row)
    d = _FRAMEWORK_DEFAULTS[fw]
    p = row.get("parallel") or {}
    hw = row.get("hardware") or {}
    missing = [what for what, absent in (("GPU count", not hw.get("num_gpus")),
                                         ("global batch", p.get("global_batch_size") is None)) if absent]
    if missing:
        return f"{' and '.join(missing)} not stated (a tuned run needs both; the layout may be left out)"
    if p.get("tp") is None or p.get("pp") is None:
        return "parallel layout not stated (tp/pp): a tuned run (planner.tuned_runs)"
    built = row_model_cluster_seq(row, fw, notes)
    if isinstance(built, str):
        return built
    model, cluster, seq = built
    tp, pp, cp = int(p["tp"]), int(p["pp"]), int(p.get("cp") or 1)
    n = int(hw["num_gpus"])
    dp = int(p.get("dp") or n // (tp * pp * cp))
    if tp * pp * dp * cp != n:
        # the row's layout and batch are kept (per-GPU throughput depends on them, not on the GPU count)
        notes.append(f"num_gpus {n} != tp*pp*dp*cp = {tp * pp * dp * cp} as printed; the layout is used")
        n = tp * pp * dp * cp
    mbs = p.get("micro_batch_size")
    sp = p.get("sequence_parallel")
    if sp is None:
        sp = d["sp_with_tp"] and tp > 1
        if tp > 1:
            notes.append(f"sequence_parallel {sp} ({fw} default with TP > 1)")
    if fw == "torchtitan":
        zero = 3 if p.get("fsdp") is not False else 0
    elif p.get("distributed_optimizer") is True or (p.get("zero_stage") or 0) >= 1:
        zero = max(1, int(p.get("zero_stage") or 1))
    elif p.get("distributed_optimizer") is False or p.get("zero_stage") == 0:
        zero = 0
    else:
        zero = d["zero"]
        notes.append(f"zero_stage {zero} ({'distributed optimizer' if zero == 1 else 'FSDP'}, {fw} default)")
    vpp = int(p.get("virtual_pipeline") or 1)
    other = p.get("other") or {}
    sched = str(other.get("pp_schedule") or "").lower()
    if pp == 1:
        vpp = 1
    elif "interleaved" in sched and vpp == 1:
        vpp = 2
        notes.append("interleaved 1F1B with 2 stages per rank (torchtitan's default for the named schedule)")
    layout = row_pipeline_layout(row) if pp > 1 else None
    if layout is None and fw == "torchtitan" and pp > 1 and vpp > 1 and model.num_layers % (pp * vpp):
        text = torchtitan_split_layout(model.num_layers, pp * vpp)
        layout = (text, f"pipeline layout {text} (torchtitan default split points: first/last stage "
                        f"L // stages layers, middle ones one more)")
    if layout is None and fw == "deepspeed" and pp > 1 and vpp == 1 and model.num_layers % pp:
        text = deepspeed_pipeline_layout(model.num_layers, pp)
        if text is not None:
            layout = (text, f"pipeline layout {text} (Megatron-DeepSpeed's own balanced split, partition_method "
                            f"type:transformer: heavier stages first)")
    if layout is not None:
        chunks = [c.count("t") for c in parse_pipeline_layout(layout[0])]
        if len(chunks) % pp == 0 and sum(chunks) == model.num_layers:
            vpp = len(chunks) // pp
            notes.append(layout[1] + (f": {vpp} virtual stages per rank" if vpp > 1 else ""))
        else:
            layout = None
    account = {}
    if layout is None and (vpp > 1 and fw != "torchtitan" and model.num_layers % (pp * vpp)
            and (model.num_layers + 2) % (pp * vpp) == 0):
        # Megatron-Bridge/NeMo recipes interleave such models with the embedding and the loss counted as one
        # layer each (--account-for-embedding/loss-in-pipeline-split; e.g. Llama 3.1 405B: 126 + 2 over 8 x 8)
        account = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
        notes.append("uneven interleaved split: embedding and loss counted as pipeline layers (Megatron-Bridge)")
    first, last = _layer_split(model.num_layers, pp * vpp, 1) if vpp > 1 else _layer_split(model.num_layers, pp, 1)
    if layout is not None:
        first = last = None
    elif account:
        first = last = None
    elif vpp > 1 and (first is not None or last is not None):
        # interleaving needs layers % (pp*vpp) == 0 unless first/last stages are shortened; model the imbalance
        # with the plain split over pp
        first, last = _layer_split(model.num_layers, pp, 1)
    if first is not None or last is not None:
        notes.append(f"uneven pipeline split: first/last stage layers {first}/{last}")
    if mbs is None:
        mbs = d["mbs"]
        local_batch = int(p["global_batch_size"]) // dp
        if fw == "torchtitan" and pp > 1 and local_batch % (pp * vpp) == 0:
            # torchtitan (late 2024, the benchmark commits) splits the local batch into pp x stages-per-rank
            # micro-batches when pipeline_parallel_microbatches is unset (parallelisms/pipelining_utils.py
            # build_pipeline_schedule: n_microbatches = num_total_stages)
            mbs = local_batch // (pp * vpp)
            notes.append(f"micro_batch_size {mbs}: local batch {local_batch} over pp x stages per rank = "
                         f"{pp * vpp} micro-batches (torchtitan default)")
        else:
            notes.append(f"micro_batch_size {mbs} ({fw} default)")
    ep = int(p.get("ep") or 1)
    etp = p.get("etp")
    prec = row_precision(p.get("precision"), notes)
    setup = row_setup(row)
    if not p.get("recompute") and setup.recompute is not None:
        notes.append(f"recompute {setup.recompute} ({setup_source(setup, 'recompute')})")
    recompute = _recompute(p.get("recompute") or setup.recompute, fw, notes)
    par = ParallelConfig(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp, micro_batch_size=int(mbs),
                         zero_stage=zero, sequence_parallel=bool(sp), recompute=recompute,
                         first_stage_layers=first, last_stage_layers=last,
                         pipeline_layout=layout[0] if layout is not None else None, **account)
    # fused (flash) attention unless the row's setup says the run predates it; dropout only where it says so
    flash = setup.flash_attention is not False
    job = TrainingJob(global_batch_size=int(p["global_batch_size"]), seq_length=int(seq), precision=prec,
                      flash_attention=flash, dropout=setup.dropout is True)
    cluster, job, par = apply_row_options(row, cluster, job, par, notes, fw)  # recipe settings (row_options.py)
    return model, cluster, job, par, fw, notes


def fp8_recipe(row: dict[str, Any]) -> str:
    """Host-cost class (``cost_models.fp8_recipe.host_cost_class``: ``mx`` / ``cs``) of the FP8 scaling recipe a
    row's precision or feature list names (``row_options.row_fp8_recipe``; per-tensor when it names none: plain "fp8"
    is Transformer Engine's default delayed scaling)."""
    return host_cost_class(row_fp8_recipe(row) or "tensorwise")


def row_flops_per_token(model: ModelSpec, job: TrainingJob, par: ParallelConfig, convention: str) -> float:
    """FLOPs per token in a row's convention (``row_convention``)."""
    return model_flops_per_token_variant(model, job.seq_length, convention, par.recompute)


def implied_flops_per_token(row: dict[str, Any]) -> float | None:
    """measured TFLOP/s / measured tokens/s per GPU: the FLOPs per token the source counted (None if absent)."""
    m = row.get("measured") or {}
    if m.get("tflops_per_gpu") and m.get("tokens_per_sec_per_gpu"):
        return m["tflops_per_gpu"] * 1e12 / m["tokens_per_sec_per_gpu"]
    return None


def row_step_options(row: dict[str, Any], fw: str, notes: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The kernel set and ``estimate_step`` options of a row: torch.compile (``parallel.other.torch_compile``), TP
    communication overlap (``other.comm_overlap`` "tp-comm-overlap", ``other.async_tp``), overlapped gradient
    reduction ("overlap-grad-reduce", or ``setup.overlap_grad_reduce``), EP all-to-all overlap and full-iteration
    CUDA graphs (``other.features``, or ``setup.ep_overlap`` / ``setup.full_cuda_graph``), the backward TP schedule
    (``setup.async_tp_backward``) and the FP8 scaling recipe (``fp8_recipe``). Returns the framework
    (``torchtitan_compile`` for compiled torchtitan) and the keyword options."""
    other = (row.get("parallel") or {}).get("other") or {}
    if fw == "torchtitan" and other.get("torch_compile"):
        fw = "torchtitan_compile"
    tp_overlap = True if "tp-comm-overlap" in str(other.get("comm_overlap", "")) or other.get("async_tp") else None
    overlap_dp = True if "overlap-grad-reduce" in str(other.get("comm_overlap", "")) else None
    features = str(other.get("features", "")).lower()
    s = row_setup(row)
    if overlap_dp is None and s.overlap_grad_reduce is not None:  # a published comm_overlap wins over setup
        overlap_dp = s.overlap_grad_reduce
    ep_overlap = "ep overlap" in features or bool(s.ep_overlap)
    full_cg = "full cuda graph" in features or bool(s.full_cuda_graph)
    if notes is not None:
        # (setup key, note when true, note when false; None: no note)
        for key, yes, no in (("ep_overlap", "EP all-to-all overlap", None),
                             ("full_cuda_graph", "full-iteration CUDA graph", None),
                             ("overlap_grad_reduce", "gradient reduction overlapped",
                              "gradient reduction not overlapped"),
                             ("async_tp_backward", "TP backward collectives asynchronous",
                              "TP backward collectives blocking")):
            value = getattr(s, key)
            what = None if value is None else yes if value else no
            if what:
                notes.append(f"{what} ({setup_source(s, key)})")
    return fw, {"tp_comm_overlap": tp_overlap, "overlap_dp": overlap_dp, "ep_overlap": ep_overlap,
                "full_cuda_graph": full_cg, "fp8_recipe": fp8_recipe(row), "async_tp_backward": s.async_tp_backward}
