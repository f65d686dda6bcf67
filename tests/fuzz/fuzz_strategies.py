"""Hypothesis strategies of hostile plan3d inputs, the four groups of issue 14.

1. ``argvs``: argument vectors for every subcommand, options taken from the CLI itself (typer's parameters), values
   drawn from pools of valid, boundary and absurd values, hostile files and junk tokens.
2. ``model_files``: Hugging Face ``config.json`` (tests/data/hf_configs) and model YAML (``plan3d models --show``)
   with keys deleted, values replaced by hostile ones, unknown keys added, then written as JSON or YAML, sometimes
   with their bytes mutated (non-UTF-8, truncated, deeply nested, oversized).
3. ``cluster_files``: cluster YAML (``plan3d clusters --show``) with leaves scaled by 10^k, replaced or deleted.
4. ``valid_jobs``: built-in model x built-in cluster x GPUs x batch x sequence x precision x objective x pins.

Every file is written under the session's scratch directory (``Scratch``); the CLI runs with that directory as its
working directory, so relative ``--output`` paths never land in the checkout.
"""
from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import yaml
from hypothesis import strategies as st

HF_DIR = Path(__file__).resolve().parent.parent / "data" / "hf_configs"
SUBCOMMANDS = ("plan", "evaluate", "memory", "explain", "validate", "models", "clusters", "schema")
#: Options the argv group never draws: ``validate --cross-validate`` refits the step-time constants once per source
#: group (README: about 100 s on a 2-core machine, 170 s in one process), beyond the harness's hang budget
#: (``fuzz_harness.HANG_S``) on CI's cores shared with the other test workers; its own tests time it
#: (``tests/test_validate.py``: the LOGO ratchet and the CLI's ``--cross-validate`` report).
NOT_DRAWN = {"validate": frozenset({"--cross-validate"})}

# --------------------------------------------------------------------------------------------- value pools

HOSTILE_NUMBERS = [0, -1, 1, 2, 3, 7, 1023, 2**31, 2**53 + 1, 2**63, 10**30, 10**400, -(10**30), 1e308, 1.7e308,
                   1e-308, 5e-324, 1e-297, -1e-297, 0.5, 1.5, -0.0, float("nan"), float("inf"), float("-inf")]
HOSTILE_VALUES = HOSTILE_NUMBERS + ["", "abc", "12", "1e3", "NaN", True, False, None, [], {}, [1, 2], {"a": 1},
                                    "\u00e9\u4e2d", "x" * 5000]
INT_TEXT = ["0", "-1", "1", "2", "3", "4", "7", "8", "16", "24", "64", "96", "128", "1000", "4096", "65536",
            "131072", "1048576", "1000000000", "9223372036854775808", "1" + "0" * 40, "1.5", "1e3", "", "abc",
            " 8", "0x10", "-0", "+8", "\u0668"]
FLOAT_TEXT = ["0", "-0.0", "0.05", "0.5", "1", "1e-9", "5e-324", "1e-300", "1e300", "1e308", "1e400", "nan",
              "inf", "-inf", "NaN", "-1", "0.3", "3600", "1e15", "1e25", "", "abc"]
JUNK = ["", "-", "--", "---x", "--gpus", "-m", "plan", "\u00e9", "x" * 300, "--format=json", "-o", "--help",
        "--version", "--tp=0", "--no-sequence-parallel", "@file", "%s%n", "$(echo)", "'", '"', "\\", ";", "\t",
        "a\nb", "\r", "plan\n--gpus"]


class Scratch:
    """The session's scratch directory and the hostile files in it (written once)."""

    def __init__(self, root: Path):
        self.root = root
        self.counter = itertools.count()
        self.model_paths: list[str] = []
        self.cluster_paths: list[str] = []
        self.dataset_paths: list[str] = []
        self.out_paths: list[str] = []
        self._write_fixed()

    def key(self, argv: list[str]) -> tuple:
        """``argv`` with each generated file replaced by its kind and a digest of its bytes: two inputs with the
        same key behave the same (only the file's name differs)."""
        import hashlib
        out = []
        for a in argv:
            p = Path(a)
            if a.startswith(str(self.root)) and p.name.startswith(("in", "config")) and p.is_file():
                kind = "config.json" if p.name == "config.json" else p.suffix
                out.append(f"{kind}:{hashlib.sha1(p.read_bytes()).hexdigest()}")
            else:
                out.append(a)
        return tuple(out)

    def contents(self, argv: list[str]) -> dict[str, str]:
        """The scratch files ``argv`` names, as text (bytes that are not UTF-8 escaped), for a finding's report."""
        out = {}
        for a in argv:
            p = Path(a)
            if a.startswith(str(self.root)) and p.is_file() and p.stat().st_size < 2**16:
                out[p.name] = p.read_bytes().decode("utf-8", "backslashreplace")
        return out

    def fresh(self, suffix: str) -> Path:
        return self.root / f"in{next(self.counter)}{suffix}"

    def _w(self, name: str, data: bytes | str) -> str:
        p = self.root / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(p)

    def _write_fixed(self) -> None:
        hf = json.loads((HF_DIR / "llama3.1-8b.json").read_text())
        deep = "[" * 200_000 + "]" * 200_000
        bomb = "a: &a ['x','x','x','x','x','x','x','x','x']\n" + "".join(
            f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
        common = {
            "bad_utf8": b"\xff\xfe\x00{\x80\x81 \xc3\x28",
            "latin1": "{\"model_type\": \"llama\", \"name\": \"caf\xe9\"}".encode("latin-1"),
            "deep": deep, "deep_dict": '{"a":' * 100_000 + "1" + "}" * 100_000,
            "empty": "", "null": "null", "list": "[1, 2, 3]", "scalar": "42",
            "huge_int": '{"model_type": "llama", "hidden_size": 1' + "0" * 5000 + "}",
            "oversized": " " * (5 * 2**20) + "{}",
            "bomb": bomb,
            "nan_hf": json.dumps({**hf, "hidden_size": float("nan"), "rope_theta": float("inf")}),
            "tiny_hf": json.dumps({**hf, "hidden_size": 1, "intermediate_size": 1, "num_attention_heads": 1,
                                   "num_key_value_heads": 1, "head_dim": 1, "vocab_size": 1}),
            "big_hf": json.dumps({**hf, "hidden_size": 2**40, "num_attention_heads": 2**20,
                                  "num_key_value_heads": 2**20, "vocab_size": 2**40}),
        }
        for name, data in common.items():
            self.model_paths.append(self._w(f"{name}.json", data))
            self.model_paths.append(self._w(f"{name}.yaml", data))
            self.cluster_paths.append(self._w(f"{name}_cluster.yaml", data))
            self.dataset_paths.append(self._w(f"{name}_rows.yaml", data))
        (self.root / "adir.json").mkdir(exist_ok=True)
        (self.root / "adir.yaml").mkdir(exist_ok=True)
        odd = [str(self.root / "adir.json"), str(self.root / "adir.yaml"), str(self.root / "missing.json"),
               "/dev/null", "/dev/zero", "/proc/self/status", "/", "a" * 5000 + ".yaml", "x/" * 3000 + "y.json",
               str(self.root / "bad_utf8.json") + "/sub"]
        self.model_paths += odd
        self.cluster_paths += odd
        self.dataset_paths += odd + [str(p) for p in (HF_DIR / "llama3.1-8b.json",)]
        self.out_paths = [str(self.root / "out.json"), str(self.root / "out_dir"), str(self.root / "adir.json"),
                          "/proc/version", "/nonexistent/dir/out.json", str(self.root / "o.svg"),
                          str(self.root / "o.png"), str(self.root / "o.txt"), "rel_out.json", "/dev/null",
                          "a" * 5000]


def builtin_models() -> list[str]:
    from model_zoo import list_models
    return list_models()


def builtin_clusters() -> list[str]:
    from cluster_specs import list_clusters
    return list_clusters()


def _cli_params() -> dict[str, list[tuple[list[str], list[str], bool, object, object, object]]]:
    """Per subcommand: (opts, secondary opts, is_flag, annotation, min, max) of each option, read from the CLI."""
    import typer.main as tm

    from planner.cli import app
    cmd = tm.get_command(app)
    out = {}
    for name, c in cmd.commands.items():
        rows = []
        for p in c.params:
            ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            rows.append((list(p.opts), list(p.secondary_opts), bool(getattr(p, "is_flag", False)), ann,
                         getattr(p, "min", None), getattr(p, "max", None)))
        out[name] = rows
    return out


_PARAMS: dict | None = None


def cli_params() -> dict:
    global _PARAMS
    if _PARAMS is None:
        _PARAMS = _cli_params()
    return _PARAMS


# --------------------------------------------------------------------------------------------- group 1: argv


def _value_for(opt: str, ann, scratch: Scratch) -> st.SearchStrategy[str]:
    """Values for one option: mostly of its type (valid, boundary or absurd), sometimes anything."""
    import enum
    anything = st.sampled_from(INT_TEXT + FLOAT_TEXT + JUNK)
    if opt in ("--model", "-m"):
        typed = st.sampled_from(builtin_models() + scratch.model_paths + [str(p) for p in HF_DIR.glob("*.json")]
                                + ["", "LLAMA3.1-8B", "llama", "gpt-1t", str(HF_DIR), "meta-llama/Llama-3.1-8B",
                                   "org/name@v1", "a/b/c"])
    elif opt in ("--cluster", "-c"):
        typed = st.sampled_from(builtin_clusters() + scratch.cluster_paths + ["", "dgx", "H100"])
    elif opt == "--dataset":
        typed = st.sampled_from(scratch.dataset_paths)
    elif opt in ("--output", "-o", "--plot", "--timeline"):
        typed = st.sampled_from(scratch.out_paths)
    elif opt == "--show":
        typed = st.sampled_from(builtin_models() + builtin_clusters() + ["", "nope"])
    elif isinstance(ann, type) and issubclass(ann, enum.Enum):
        typed = st.sampled_from([e.value for e in ann] + ["", "BF16", "none"])
    elif ann is int or ann == (int | None):
        typed = st.one_of(st.sampled_from(INT_TEXT), st.integers(-3, 300).map(str),
                          st.integers(0, 24).map(lambda k: str(2**k)))
    elif ann is float or ann == (float | None):
        typed = st.one_of(st.sampled_from(FLOAT_TEXT), st.floats(allow_nan=True, allow_infinity=True).map(repr))
    else:
        typed = anything
    return st.one_of(typed, typed, typed, anything)


@st.composite
def argvs(draw, scratch: Scratch) -> list[str]:
    """An argument vector: a subcommand (rarely none or an unknown one), a base of valid options (often), then 0-8
    options of that subcommand with drawn values, sometimes a junk token anywhere."""
    params = cli_params()
    sub = draw(st.sampled_from(list(SUBCOMMANDS) * 6 + ["", "nope", "--version", "--help"]))
    argv = [sub] if sub else []
    rows = [r for r in params.get(sub, []) if not NOT_DRAWN.get(sub, frozenset()) & set(r[0])]
    names = {o for r in rows for o in r[0]}
    if "--model" in names and draw(st.booleans()):
        argv += ["--model", draw(st.sampled_from(builtin_models())),
                 "--cluster", draw(st.sampled_from(builtin_clusters())),
                 "--nodes", draw(st.sampled_from(["1", "2", "4", "8", "16"]))]
    if rows:
        for _ in range(draw(st.integers(0, 8))):
            opts, secondary, is_flag, ann, lo, hi = draw(st.sampled_from(rows))
            name = draw(st.sampled_from(opts + secondary))
            if is_flag:
                argv.append(name)
            else:
                val = draw(_value_for(opts[0], ann, scratch))
                argv += [f"{name}={val}"] if draw(st.integers(0, 9)) == 0 and name.startswith("--") else [name, val]
    if draw(st.integers(0, 5)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(JUNK)))
    return argv


# --------------------------------------------------------------------------------------------- mutation helpers


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    yield path, obj


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _delete(obj, path):
    for k in path[:-1]:
        obj = obj[k]
    if isinstance(obj, dict):
        obj.pop(path[-1], None)
    else:
        del obj[path[-1]]


@st.composite
def mutated(draw, base: dict, scale_exponents=st.integers(-12, 12)) -> dict:
    """``base`` with 1-4 mutations: a numeric leaf scaled by 10^k, +-1, x2; a leaf replaced by a hostile value; a
    key deleted; an unknown key added."""
    d = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        leaves = [(p, v) for p, v in _leaves(d) if p]
        if not leaves:
            break
        path, val = draw(st.sampled_from(leaves))
        op = draw(st.sampled_from(["scale", "scale", "nudge", "hostile", "hostile", "delete", "add"]))
        if op == "scale" and isinstance(val, (int, float)) and not isinstance(val, bool):
            k = draw(scale_exponents)
            try:
                new = val * 10.0**k if isinstance(val, float) or k < 0 else val * 10**k
            except OverflowError:  # an int already scaled past a float's range, scaled down: stay exact
                new = val // 10**-k
            _set(d, path, new)
        elif op == "nudge" and isinstance(val, (int, float)) and not isinstance(val, bool):
            _set(d, path, draw(st.sampled_from([val + 1, val - 1, val * 2, val // 2 if isinstance(val, int) else val / 2,
                                                -val, 0])))
        elif op == "delete":
            _delete(d, path)
        elif op == "add":
            parent = d
            for k in path[:-1]:
                parent = parent[k]
            if isinstance(parent, dict):
                parent[draw(st.sampled_from(["extra", "num_layers", "moe", "gpu", "x" * 100]))] = \
                    copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES)))
        else:
            # a copy: a later "add" into a shared {} or [] would change HOSTILE_VALUES itself, and hypothesis then
            # sees the same choices draw differently (FlakyStrategyDefinition in the 10,000-input run)
            _set(d, path, copy.deepcopy(draw(st.sampled_from(HOSTILE_VALUES))))
    return d


def dump(data, fmt: str) -> bytes:
    """JSON (NaN / Infinity literals allowed, as a hostile writer would) or YAML text of ``data``."""
    if fmt == "json":
        try:
            return json.dumps(data, indent=1).encode()
        except ValueError:  # int too large to print
            return b"{}"
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    except (ValueError, yaml.YAMLError):
        return b"{}"


@st.composite
def byte_mutated(draw, text: bytes) -> bytes:
    """Mostly ``text`` unchanged; sometimes truncated, with bytes that are not UTF-8, or wrapped deep."""
    op = draw(st.sampled_from(["none"] * 8 + ["truncate", "badbyte", "wrap", "dupkey"]))
    if op == "truncate" and text:
        return text[: draw(st.integers(0, len(text) - 1))]
    if op == "badbyte":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\x80\x80", b"\xed\xa0\x80"])) + text[i:]
    if op == "wrap":
        n = draw(st.sampled_from([10, 100, 1000, 5000]))
        return b"[" * n + text + b"]" * n
    if op == "dupkey":
        return text + b"\n" + text
    return text


# --------------------------------------------------------------------------------------------- group 2: models


def _model_bases() -> list[tuple[str, dict]]:
    from model_zoo import get_model
    out = [("json", json.loads(p.read_text())) for p in sorted(HF_DIR.glob("*.json"))]
    for name in ("llama3.1-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "qwen2.5-7b", "bloom-176b"):
        out.append(("yaml", get_model(name).model_dump(mode="json", exclude_defaults=True)))
    return out


MODEL_BASES: list | None = None


@st.composite
def model_files(draw, scratch: Scratch) -> tuple[str, list[str]]:
    """(path of a mutated model file, the subcommand and options to run it with)."""
    global MODEL_BASES
    if MODEL_BASES is None:
        MODEL_BASES = _model_bases()
    fmt, base = draw(st.sampled_from(MODEL_BASES))
    data = draw(mutated(base))
    fmt = draw(st.sampled_from([fmt, fmt, fmt, "yaml" if fmt == "json" else "json"]))
    text = draw(byte_mutated(dump(data, fmt)))
    path = scratch.fresh(".json" if fmt == "json" else ".yaml")
    if fmt == "json" and draw(st.integers(0, 3)) == 0:
        path = path.parent / f"cfg{path.stem}" / "config.json"
        path.parent.mkdir()
    path.write_bytes(text)
    sub = draw(st.sampled_from(["plan", "plan", "plan", "evaluate", "memory", "explain"]))
    argv = [sub, "--model", str(path), "--cluster", "dgx-h200", "--gpus", draw(st.sampled_from(["8", "64"])),
            "--format", draw(st.sampled_from(["json", "json", "table"]))]
    return str(path), argv


# --------------------------------------------------------------------------------------------- group 3: clusters

CLUSTER_BASES: dict | None = None


@st.composite
def cluster_files(draw, scratch: Scratch) -> tuple[str, list[str]]:
    """(path of a cluster YAML mutated from ``plan3d clusters --show``, the command to plan on it)."""
    global CLUSTER_BASES
    if CLUSTER_BASES is None:
        from cluster_specs import get_cluster
        CLUSTER_BASES = {n: get_cluster(n).model_dump(mode="json") for n in builtin_clusters()}
    base = CLUSTER_BASES[draw(st.sampled_from(sorted(CLUSTER_BASES)))]
    data = draw(mutated(base, st.one_of(st.integers(-6, 6), st.sampled_from([-300, -100, -30, 30, 100, 300]))))
    text = draw(byte_mutated(dump(data, "yaml")))
    path = scratch.fresh(".yaml")
    path.write_bytes(text)
    model = draw(st.sampled_from(["llama3.1-8b", "mixtral-8x7b", "llama3.1-70b", "qwen2.5-7b", "gpt-1.7b"]))
    argv = [draw(st.sampled_from(["plan", "plan", "plan", "evaluate", "memory"])), "--model", model,
            "--cluster", str(path), "--nodes", draw(st.sampled_from(["1", "2", "4", "16"])), "--format",
            draw(st.sampled_from(["json", "json", "table"]))]
    if argv[0] != "plan":
        argv += ["--tp", draw(st.sampled_from(["1", "2", "8"]))]
    return str(path), argv


# --------------------------------------------------------------------------------------------- group 4: valid jobs


@st.composite
def valid_jobs(draw) -> list[str]:
    """``plan`` of a built-in model on a built-in cluster with a sensible job, objective and pins."""
    from cluster_specs import get_cluster
    model = draw(st.sampled_from(builtin_models()))
    cname = draw(st.sampled_from(builtin_clusters()))
    c = get_cluster(cname)
    nodes = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]))
    gbs = draw(st.sampled_from([1, 8, 64, 256, 512, 1024, 1536, 2048, 4096]))
    seq = draw(st.sampled_from([512, 2048, 4096, 8192, 32768, 131072]))
    prec = draw(st.sampled_from(c.supported_precisions))
    argv = ["plan", "--model", model, "--cluster", cname, "--nodes", str(nodes), "--global-batch-size", str(gbs),
            "--seq-length", str(seq), "--precision", prec, "--format", "json",
            "--top-k", str(draw(st.sampled_from([1, 3, 5, 10])))]
    objective = draw(st.sampled_from(["throughput"] * 6 + ["headroom", "min-gpus", "cost"]))
    if objective == "headroom":
        argv += ["--objective", "headroom", "--within", draw(st.sampled_from(["0", "0.05", "0.2"]))]
    elif objective == "min-gpus":
        argv += ["--objective", "min-gpus"]
        target = draw(st.sampled_from(["step", "tokens", "deadline"]))
        if target == "step":
            argv += ["--target-step-s", draw(st.sampled_from(["0.5", "2", "10", "60"]))]
        elif target == "tokens":
            argv += ["--target-tokens-per-day", draw(st.sampled_from(["1e9", "1e10", "1e11", "1e12"]))]
        else:
            argv += ["--deadline-days", draw(st.sampled_from(["1", "30", "365"])), "--train-tokens", "1e12"]
    elif objective == "cost":
        argv += ["--objective", "cost", "--deadline-days", draw(st.sampled_from(["7", "90"])), "--train-tokens",
                 draw(st.sampled_from(["1e11", "1e13"]))]
    elif draw(st.integers(0, 4)) == 0:
        argv += ["--train-tokens", draw(st.sampled_from(["1e9", "1.5e13"]))]
        if draw(st.booleans()):
            argv += ["--gpu-hour-price", draw(st.sampled_from(["2.5", "0.01"]))]
    fw = draw(st.sampled_from([None, None, "megatron", "deepspeed", "torchtitan"]))
    if fw:
        argv += ["--framework", fw]
    for opt, vals in (("--tp", ["1", "2", "4", "8"]), ("--pp", ["1", "2", "4", "8"]), ("--zero-stage", ["0", "1", "3"]),
                      ("--recompute", ["none", "selective", "full"]), ("--micro-batch-size", ["1", "2"])):
        if draw(st.integers(0, 7)) == 0:
            argv += [opt, draw(st.sampled_from(vals))]
    if draw(st.integers(0, 9)) == 0:
        argv += ["--memory-headroom", draw(st.sampled_from(["0", "0.1", "0.5"]))]
    return argv
