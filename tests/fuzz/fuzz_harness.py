"""Run plan3d on one fuzzed input and check what came out (tests/fuzz).

``run_inprocess`` calls the console-script entry point ``planner.cli.main`` with ``sys.argv`` set, catching
``SystemExit``, under a wall-clock alarm (a call that outlives it is a hang). ``run_console`` runs the installed
``plan3d`` script in a subprocess. ``check_outcome`` applies the invariants every input must keep (issue 14):

* exit code in {0, 1, 2}; exit 2 is exactly one line on stderr; never a traceback;
* JSON output (``--format json``) parses under strict JSON (no NaN / Infinity) and every number is finite;
* per plan: tp * pp * dp * cp == GPUs; micro_batch_size * num_microbatches * dp == global batch size;
  peak <= capacity when feasible; 0 < MFU < 1 for BF16/FP16 plans; ranks 1..n in rank order (the plans that clear
  the at-risk memory margin first, then those within it, each part by the objective);
* the same input gives byte-identical output (checked by the callers that re-run).

A failed check is a ``Finding`` (a kind and a detail); the fuzz tests collect them instead of stopping at the first,
so one run reports counts per kind (tests/fuzz/conftest.py prints them).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: A call longer than this (wall seconds) is a hang. Generous: the CI machine has 2 shared cores.
HANG_S = float(os.environ.get("PLAN3D_FUZZ_HANG_S", "120"))
#: Address space the fuzzing process may use (GiB): a runaway allocation becomes a MemoryError, which main()
#: reports as an internal error (a finding) instead of the kernel killing the whole run.
MAX_MEM_GIB = float(os.environ.get("PLAN3D_FUZZ_MAX_MEM_GIB", "8"))


def _limit_memory() -> None:
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = int(MAX_MEM_GIB * 2**30)
        if soft == resource.RLIM_INFINITY or soft > want:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on every platform
        pass


def _max_rss_mib() -> float:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    except ImportError:  # pragma: no cover
        return 0.0


class _Hang(BaseException):
    """Raised by the alarm inside a call that outlived HANG_S (a BaseException, so ``main()`` cannot catch it)."""


@dataclass
class Outcome:
    argv: list[str]
    code: int | None
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    crash: str | None = None  # an exception that escaped main() (a traceback for the user)
    hang: bool = False
    #: growth of the process's peak resident memory during the call, MiB
    rss_growth_mib: float = 0.0


@dataclass
class Finding:
    kind: str
    detail: str
    argv: list[str] = field(default_factory=list)
    #: the input files the run read (path -> text, bytes that are not UTF-8 escaped), to reproduce it
    files: dict[str, str] = field(default_factory=dict)


def run_inprocess(argv: list[str], hang_s: float = HANG_S, cwd: str | None = None) -> Outcome:
    """``plan3d *argv`` in this process (``planner.cli.main``), stdout/stderr captured, in directory ``cwd``
    (relative output paths land there, not in the checkout)."""
    from planner.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_argv = sys.argv
    code: int | None = 0
    crash = None
    hang = False

    def _alarm(signum, frame):  # pragma: no cover - only on a hang
        raise _Hang()

    _limit_memory()
    rss0 = _max_rss_mib()
    use_alarm = hasattr(signal, "SIGALRM") and hang_s > 0
    if use_alarm:
        prev = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, hang_s)
    here = os.getcwd()
    offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"  # a drawn 'org/name' is a Hub id: the fuzzer never touches the network
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["plan3d", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except _Hang:
        hang, code = True, None
    except BaseException as e:  # noqa: BLE001 - anything else escaping main() is a traceback for the user
        crash, code = f"{type(e).__name__}: {str(e)[:200]}", None
    finally:
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, prev)
        sys.argv = old_argv
        os.chdir(here)
        if offline is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = offline
    return Outcome(list(argv), code, out.getvalue(), err.getvalue(), wall, cpu, crash, hang,
                   _max_rss_mib() - rss0)


def run_console(argv: list[str], hang_s: float = HANG_S, cwd: str | None = None) -> Outcome:
    """``plan3d *argv`` through the installed console script (a subprocess)."""
    exe = os.path.join(os.path.dirname(sys.executable), "plan3d")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-c", "from planner.cli import main; main()"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd + list(argv), capture_output=True, text=True, timeout=hang_s, cwd=cwd,
                           env={**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return Outcome(list(argv), None, "", "", time.perf_counter() - t0, 0.0, hang=True)
    crash = "traceback" if "Traceback (most recent call last)" in p.stderr else None
    return Outcome(list(argv), p.returncode, p.stdout, p.stderr, time.perf_counter() - t0, 0.0, crash)


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


def strict_json(text: str):
    """Parse as strict JSON: NaN / Infinity (which Python's json accepts) are an error."""
    return json.loads(text, parse_constant=_reject_constant)


def nonfinite_paths(obj, path: str = "$") -> list[str]:
    """Paths of the non-finite floats in a parsed JSON value."""
    if isinstance(obj, float):
        return [] if math.isfinite(obj) else [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in nonfinite_paths(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in nonfinite_paths(v, f"{path}[{i}]")]
    return []


def _opt(argv: list[str], name: str) -> str | None:
    """The last value given to option ``name`` (``--name V`` or ``--name=V``)."""
    val = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith(name + "="):
            val = a.split("=", 1)[1]
    return val


def check_document(doc: dict, argv: list[str]) -> list[Finding]:
    """Invariants of a plan document (``plan`` / ``evaluate`` / ``memory`` ``--format json``)."""
    out: list[Finding] = []
    if not isinstance(doc, dict) or "plans" not in doc or "input" not in doc:
        return out
    n = doc["input"]["cluster"]["num_gpus"]
    gbs = doc["input"]["job"]["global_batch_size"]
    prec = doc["input"]["job"]["precision"]
    plans = doc["plans"]
    if [p["rank"] for p in plans] != list(range(1, len(plans) + 1)):
        out.append(Finding("rank order", f"ranks {[p['rank'] for p in plans]}", argv))
    for p in plans:
        q = p["parallel"]
        if q["tp"] * q["pp"] * q["dp"] * q["cp"] != n:
            out.append(Finding("tp*pp*dp*cp != GPUs", f"plan {p['rank']}: {q} on {n} GPUs", argv))
        if q["micro_batch_size"] * q["num_microbatches"] * q["dp"] != gbs and p["feasible"]:
            out.append(Finding("mbs*m*dp != global batch", f"plan {p['rank']}: mbs {q['micro_batch_size']} m "
                                                           f"{q['num_microbatches']} dp {q['dp']} gbs {gbs}", argv))
        mem = p.get("memory")
        if p["feasible"] and mem is not None and mem["peak_bytes"] > mem["capacity_bytes"]:
            out.append(Finding("feasible plan over capacity", f"plan {p['rank']}: {mem['peak_bytes']} > "
                                                              f"{mem['capacity_bytes']}", argv))
        thr = p.get("throughput")
        if thr is not None and prec in ("bf16", "fp16") and not 0 < thr["mfu"] < 1:
            out.append(Finding("MFU outside (0, 1)", f"plan {p['rank']}: MFU {thr['mfu']}", argv))
    # plan order: the plans that clear the at-risk margin first, then those within it (``memory.at_risk``), each
    # part by the objective: throughput by tokens/s (ties by peak memory); headroom by peak memory; cost by GPU-hours
    objective = _opt(argv, "--objective") or "throughput"
    feas = [p for p in plans if p["feasible"] and p.get("throughput") and p.get("memory")]
    if argv[:1] == ["plan"] and len(feas) == len(plans) > 1:
        risk = [bool(p["memory"].get("at_risk")) for p in plans]
        if objective == "headroom":
            key = [p["memory"]["peak_bytes"] for p in plans]
        elif objective == "cost":
            key = [p["cost"]["gpu_hours"] for p in plans]
        else:
            key = [-p["throughput"]["tokens_per_s"] for p in plans]
        if list(zip(risk, key)) != sorted(zip(risk, key)):
            shown = [abs(k) for k in key]
            out.append(Finding("plans out of rank order", f"{objective}: {shown}, at risk {risk}", argv))
    return out


def check_outcome(o: Outcome) -> list[Finding]:
    """Every invariant that one run must keep (see the module docstring)."""
    a = o.argv
    if o.hang:
        return [Finding("hang", f"over {HANG_S:g} s", a)]
    if o.crash is not None:
        return [Finding("crash", o.crash, a)]
    out: list[Finding] = []
    if "Traceback (most recent call last)" in o.stderr:
        out.append(Finding("traceback", o.stderr.strip().splitlines()[-1][:200], a))
    if o.code == 3 and "internal error" in o.stderr:
        out.append(Finding("internal error", o.stderr.strip()[:300], a))
    elif o.code not in (0, 1, 2):
        out.append(Finding("exit code", f"{o.code}: {o.stderr.strip()[:200]}", a))
    if o.code == 2 and a:  # bare ``plan3d`` prints the help with exit 2 (the lead's choice): not an error line
        lines = o.stderr.rstrip("\n").split("\n")
        if len(lines) != 1 or not lines[0].startswith("plan3d: error: "):
            out.append(Finding("exit 2 not one line", repr(o.stderr[:300]), a))
    if o.code == 1 and o.stderr.strip() and not o.stderr.strip().splitlines()[-1].startswith("plan3d"):
        out.append(Finding("exit 1 without a plan3d line", repr(o.stderr[-300:]), a))
    text = o.stdout
    # ``--help`` anywhere (``plan3d --help clusters --format json``) prints the help and exits 0: not a document
    wants_help = "--help" in a or "-h" in a
    if _opt(a, "--format") == "json" and o.code in (0, 1) and _opt(a, "--output") is None \
            and _opt(a, "--emit") is None and text.strip() and not wants_help:
        try:
            doc = strict_json(text)
        except ValueError as e:
            return out + [Finding("invalid JSON", str(e)[:200], a)]
        bad = nonfinite_paths(doc)
        if bad:
            out.append(Finding("non-finite value", ", ".join(bad[:5]), a))
        out += check_document(doc, a)
    elif _opt(a, "--format") != "json" and o.code in (0, 1):
        cells = {c.strip() for line in text.splitlines() if "\u2502" in line for c in line.split("\u2502")}
        bad = cells & {"nan", "inf", "-inf", "nan%", "inf%", "NaN", "Infinity"}
        if bad:
            out.append(Finding("non-finite value", f"table cells {sorted(bad)}", a))
    if _opt(a, "--emit") == "deepspeed" and o.code == 0 and _opt(a, "--output") is None and text.strip():
        try:
            bad = nonfinite_paths(strict_json(text))
        except ValueError as e:
            return out + [Finding("invalid JSON", f"ds_config.json: {str(e)[:200]}", a)]
        if bad:
            out.append(Finding("non-finite value", "ds_config.json " + ", ".join(bad[:5]), a))
    return out
