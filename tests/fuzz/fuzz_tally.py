"""The fuzz suite's budget and tally (issue 14).

Budget: ``PLAN3D_FUZZ_N`` inputs in all (default ``CI_FUZZ_N``, about a minute on the 2-core CI machine), split over
the four groups by ``SHARES``. Hypothesis runs derandomized (a fixed seed per test), without its database and without
shrinking, so CI sees the same inputs every time and a run goes through its whole budget, collecting every broken
invariant instead of stopping at the first; each test then fails if its group found any.

At the end pytest prints, per group, the inputs run and the findings by kind (with the shortest example of each),
and the slowest inputs with their wall and CPU seconds; the same goes to ``PLAN3D_FUZZ_REPORT`` (default
``.pytest_cache/plan3d_fuzz_report.json``) for ``benchmarks/bench_fuzz_slowest.py``.

A long run splits over processes with ``PLAN3D_FUZZ_SHARD=i/n`` (0 <= i < n): each process runs 1/n of every
group's budget, only inputs whose key hashes to i mod n, so the n processes run distinct inputs, the budget in all
(e.g. ``PLAN3D_FUZZ_N=10000 PLAN3D_FUZZ_SHARD=0/2`` and ``1/2`` side by side on two cores, each with its own
``PLAN3D_FUZZ_REPORT``).
"""
from __future__ import annotations

import os
import zlib
from collections import defaultdict
from pathlib import Path

from hypothesis import HealthCheck, Phase, assume, settings

from .fuzz_harness import Finding, Outcome, check_outcome, run_inprocess

#: Default total inputs (CI): the suite's other tests take ~2 min; this keeps the fuzz suite near one minute.
CI_FUZZ_N = 120
FUZZ_N = int(os.environ.get("PLAN3D_FUZZ_N", CI_FUZZ_N))


def _shard(text: str) -> tuple[int, int]:
    """``PLAN3D_FUZZ_SHARD`` "i/n" as (i, n); (0, 1) when unset."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"PLAN3D_FUZZ_SHARD={text!r}: expected i/n with 0 <= i < n") from None
    if not 0 <= i < n:
        raise ValueError(f"PLAN3D_FUZZ_SHARD={text!r}: expected i/n with 0 <= i < n")
    return i, n


SHARD, SHARDS = _shard(os.environ.get("PLAN3D_FUZZ_SHARD", "0/1"))
#: Share of the budget per group: argument vectors are cheap (most end at parsing), valid jobs the dearest.
SHARES = {"argv": 0.4, "model_files": 0.2, "cluster_files": 0.2, "valid_jobs": 0.2}
#: Slowest inputs kept for the report.
KEEP_SLOWEST = 25


def fuzz_settings(group: str) -> settings:
    return settings(max_examples=max(1, round(FUZZ_N * SHARES[group] / SHARDS)), deadline=None, derandomize=True,
                    database=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))


def _example(f: Finding) -> dict:
    return {"kind": f.kind, "detail": f.detail, "argv": f.argv, "files": f.files}


def kind_lines(kinds: dict[str, int], examples: list[dict]) -> list[str]:
    """Findings by kind, most frequent first, each with its shortest example (``examples``: ``_example`` dicts)."""
    lines = []
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        ex = min((e for e in examples if e["kind"] == kind), key=lambda e: len(" ".join(e["argv"])))
        lines.append(f"  {n:5d} x {kind}: {ex['detail'][:240]}\n          plan3d {' '.join(ex['argv'])[:400]}")
    return lines


class Tally:
    """Inputs run, findings and the slowest inputs, per group."""

    def __init__(self):
        self.runs: dict[str, int] = defaultdict(int)
        self.findings: dict[str, list[Finding]] = defaultdict(list)
        self.slowest: list[tuple[float, float, str, list[str], dict]] = []
        self.seen: set = set()
        #: the inputs during which the process's peak memory grew most (MiB, argv)
        self.memory: list[tuple[float, list[str]]] = []

    def record(self, group: str, o: Outcome, findings: list[Finding], files=None) -> None:
        """Count a run; keep it among the slowest (by CPU seconds: the machine's load does not count) with its input
        files (``files()``: path -> text), so a slow generated input can be reproduced."""
        self.runs[group] += 1
        self.findings[group] += findings
        if o.rss_growth_mib > 64:
            self.memory.append((round(o.rss_growth_mib), o.argv))
            self.memory.sort(key=lambda x: -x[0])
            del self.memory[10:]
        if len(self.slowest) < KEEP_SLOWEST or o.cpu_s > self.slowest[-1][1]:
            self.slowest.append((o.wall_s, o.cpu_s, group, o.argv, files() if files else {}))
            self.slowest.sort(key=lambda x: -x[1])
            del self.slowest[KEEP_SLOWEST:]

    def by_kind(self, group: str) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = defaultdict(list)
        for f in self.findings[group]:
            out[f.kind].append(f)
        return out

    def summary(self, group: str) -> str:
        return "\n".join(kind_lines({k: len(v) for k, v in self.by_kind(group).items()},
                                     [_example(f) for f in self.findings[group]]))

    def report(self) -> dict:
        return {"inputs": dict(self.runs), "total_inputs": sum(self.runs.values()),
                "findings": {g: {k: len(v) for k, v in self.by_kind(g).items()} for g in self.runs},
                "examples": [_example(f) for g in self.runs for fs in self.by_kind(g).values() for f in fs[:3]],
                "memory_growth_mib": [{"mib": m, "argv": a} for m, a in self.memory],
                "slowest": [{"wall_s": round(w, 3), "cpu_s": round(c, 3), "group": g, "argv": a, "files": f}
                            for w, c, g, a, f in self.slowest]}


TALLY = Tally()
#: the tallies of the processes that ran fuzz inputs (``Tally.report``), for the end-of-run summary: this process's
#: own, or, under pytest-xdist, each worker's as it reached the controller (``pytest_testnodedown`` in
#: ``tests/conftest.py``)
REPORTS: list[dict] = []


def merged_report(reports: list[dict]) -> dict:
    """One report from the reports of several processes: inputs and findings summed, the examples, memory growth and
    slowest inputs pooled (the slowest by CPU seconds, ``KEEP_SLOWEST`` kept)."""
    out: dict = {"inputs": defaultdict(int), "findings": defaultdict(lambda: defaultdict(int)), "examples": [],
                 "memory_growth_mib": [], "slowest": []}
    for r in reports:
        for g, n in r["inputs"].items():
            out["inputs"][g] += n
        for g, kinds in r["findings"].items():
            for k, n in kinds.items():
                out["findings"][g][k] += n
        for key in ("examples", "memory_growth_mib", "slowest"):
            out[key] += r[key]
    out["memory_growth_mib"] = sorted(out["memory_growth_mib"], key=lambda m: -m["mib"])[:10]
    out["slowest"] = sorted(out["slowest"], key=lambda s: -s["cpu_s"])[:KEEP_SLOWEST]
    out["inputs"] = dict(out["inputs"])
    out["findings"] = {g: dict(k) for g, k in out["findings"].items()}
    out["total_inputs"] = sum(out["inputs"].values())
    return out


def summary_lines(report: dict) -> list[str]:
    """The end-of-run summary of a report: per group the inputs run and the findings by kind (with the shortest
    example of each), the inputs during which memory grew most, and the slowest inputs (wall s / CPU s)."""
    shard = f", shard {SHARD}/{SHARDS}" if SHARDS > 1 else ""
    lines = [f"plan3d fuzz: {report['total_inputs']} inputs (PLAN3D_FUZZ_N={FUZZ_N}{shard})"]
    for g in SHARES:
        if g not in report["inputs"]:
            continue
        kinds = report["findings"].get(g, {})
        lines.append(f"{g:14s} {report['inputs'][g]:6d} inputs, {sum(kinds.values())} findings")
        lines += kind_lines(kinds, report["examples"])
    if report["memory_growth_mib"]:
        lines.append("peak memory grew most during (MiB):")
        lines += [f"  {m['mib']:7d}  plan3d {' '.join(m['argv'])[:200]}" for m in report["memory_growth_mib"][:5]]
    lines.append("slowest inputs (wall s / CPU s):")
    lines += [f"  {s['wall_s']:7.2f} {s['cpu_s']:7.2f}  {s['group']:13s} plan3d {' '.join(s['argv'])[:200]}"
              for s in report["slowest"][:10]]
    return lines
#: a file holding the input now running (``PLAN3D_FUZZ_CURRENT``), unset: none
CURRENT = Path(os.environ["PLAN3D_FUZZ_CURRENT"]) if os.environ.get("PLAN3D_FUZZ_CURRENT") else None


def fuzz_one(group: str, argv: list[str], scratch, rerun: bool = False) -> Outcome | None:
    """Run one input in-process, check it, re-run it for byte identity when asked (or when it was quick), tally.
    An input this group already ran is rejected (``assume``): hypothesis then draws another, so the budget counts
    distinct inputs. Under ``PLAN3D_FUZZ_SHARD`` an input of another shard is rejected the same way."""
    key = (group, scratch.key(argv))
    assume(key not in TALLY.seen)
    if SHARDS > 1:
        assume(zlib.crc32(repr(key).encode()) % SHARDS == SHARD)
    TALLY.seen.add(key)
    if CURRENT:  # the input now running, for a run the kernel kills
        try:
            CURRENT.write_text(" ".join(argv) + "\n")
        except OSError:
            pass
    o = run_inprocess(argv, cwd=str(scratch.root))
    findings = check_outcome(o)
    # a run cut short by its wall-clock time budget may stop elsewhere on a re-run: not a determinism finding
    if not findings and o.code in (0, 1) and (rerun or o.wall_s < 0.3) and "time budget" not in o.stderr:
        o2 = run_inprocess(argv, cwd=str(scratch.root))
        if (o2.code, o2.stdout) != (o.code, o.stdout):
            findings.append(Finding("not byte-identical on a re-run", f"exit {o.code} then {o2.code}", argv))
    if findings:
        for f in findings:
            f.files = scratch.contents(argv)
    TALLY.record(group, o, findings, lambda: scratch.contents(argv))
    return o


def assert_clean(group: str) -> None:
    assert not TALLY.findings[group], (f"{len(TALLY.findings[group])} findings in {TALLY.runs[group]} inputs:\n"
                                       + TALLY.summary(group))
