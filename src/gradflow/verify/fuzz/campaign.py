"""A fuzz campaign: draw programs from the grammar (hypothesis, seeded), check each in a worker process (a
crash or hang of the process is a verdict, not the end of the run), shrink what fails, and report.

Each program is checked under the default configuration (`grad`, STORE_ALL, optimized) and one other of
`check.CONFIGS` (route x forwarding policy x optimization), chosen from the seed, so a long run covers every
configuration; `configs="all"` checks all eighteen.
"""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Sequence

import attrs

from gradflow.verify.fuzz.check import CONFIGS, DEFAULT, Verdict, spec_of
from gradflow.verify.fuzz.grammar import FEATURES, programs
from gradflow.verify.fuzz.program import Program
from gradflow.verify.fuzz.shrink import shrink

#: programs a worker checks before it is replaced (each keeps its compiled libraries loaded)
RECYCLE = 40


def draw(n: int, seed: int, features: Sequence[str] = FEATURES) -> list[Program]:
    """`n` distinct programs from the grammar, the same for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    found: dict[str, Program] = {}
    round_ = 0
    while len(found) < n and round_ < 20:
        batch: list[Program] = []

        @fixed_seed(seed * 7919 + round_)
        @settings(max_examples=max(2 * (n - len(found)), 10), database=None, phases=[Phase.generate],
                  deadline=None, suppress_health_check=list(HealthCheck))
        @given(programs(tuple(features)))
        def collect(program: Program) -> None:
            batch.append(program)

        collect()
        for program in batch:
            found.setdefault(program.render(True), program)
        round_ += 1
    return list(found.values())[:n]


def configs_for(index: int, seed: int, mode: str = "two") -> list[tuple]:
    if mode == "all":
        return list(CONFIGS)
    if mode == "default":
        return [DEFAULT]
    other = random.Random(seed * 1_000_003 + index).choice([c for c in CONFIGS if c != DEFAULT])
    return [DEFAULT, other]


#: the error of a crash verdict for a program that gave no verdict within the timeout
TIMEOUT = "Timeout"


class Worker:
    """One `gradflow.verify.fuzz.worker` process, with its own cache and scratch folders."""

    def __init__(self, root: Path, index: int) -> None:
        self.folder = root / f"worker{index}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen | None = None
        self.served = 0

    def start(self) -> None:
        env = {**os.environ, "GRADFLOW_CACHE": str(self.folder / "cache"), "OMP_NUM_THREADS": "1",
               "PYTHONWARNINGS": "ignore"}
        log = open(self.folder / "stderr.log", "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "gradflow.verify.fuzz.worker"], cwd=self.folder,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                        text=True, bufsize=1, start_new_session=True)
        self.served = 0

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
        self.process = None

    def check(self, spec: dict, timeout: float) -> Verdict:
        if self.process is None or self.served >= RECYCLE:
            self.stop()
            self.start()
        self.served += 1
        start = time.perf_counter()
        try:
            self.process.stdin.write(json.dumps(spec) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return self._died(start)
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return Verdict("crash", error=TIMEOUT, detail=f"no verdict within {timeout:.0f} s",
                           seconds=time.perf_counter() - start)
        line = self.process.stdout.readline()
        if not line:
            return self._died(start)
        return Verdict.from_json(json.loads(line))

    def _died(self, start: float) -> Verdict:
        code = self.process.wait()
        self.process = None
        what = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit status {code}"
        return Verdict("crash", error="ProcessDied", detail=f"the worker process died: {what}",
                       seconds=time.perf_counter() - start)


@attrs.frozen
class Result:
    index: int
    program: Program
    verdict: Verdict
    configs: tuple
    shrunk: Program | None = None


def _same_failure(a: Verdict, b: Verdict) -> bool:
    return a.kind == b.kind and (a.kind == "WRONG" or a.error == b.error)


def run(n: int, seed: int, jobs: int = 1, *, features: Sequence[str] = FEATURES, configs: str = "two",
        timeout: float = 600.0, shrink_attempts: int = 60, on_result: Callable[[Result], None] | None = None,
        programs_: Iterable[Program] | None = None) -> list[Result]:
    """Check `n` programs of `seed` on `jobs` worker processes; failures (WRONG, crash) are shrunk."""
    drawn = list(programs_) if programs_ is not None else draw(n, seed, features)
    root = Path(tempfile.mkdtemp(prefix="gradflow-fuzz-"))
    workers = [Worker(root, k) for k in range(max(1, jobs))]
    results: list[Result] = []
    pending = list(enumerate(drawn))
    try:
        import concurrent.futures as cf

        def job(worker: Worker, index: int, program: Program) -> Result:
            chosen = configs_for(index, seed, configs)
            spec = spec_of(program, chosen, seed=seed * 100_003 + index)
            verdict = worker.check(spec, timeout)
            shrunk = None
            # a program that hangs is reported as drawn: each check of a smaller candidate could take the
            # whole timeout again (sixty of them, ten hours at the default, the run stalled and its log silent)
            if verdict.kind in ("WRONG", "crash") and verdict.error != TIMEOUT and shrink_attempts > 0:
                failing = [c for c in chosen if tuple(c) == tuple(verdict.config)] or chosen

                def still(candidate: Program) -> bool:
                    again = worker.check(spec_of(candidate, failing, seed=spec["seed"]), timeout)
                    return _same_failure(again, verdict)

                shrunk = shrink(program, still, shrink_attempts)
            return Result(index, program, verdict, tuple(map(tuple, chosen)), shrunk)

        free = list(workers)
        with cf.ThreadPoolExecutor(max_workers=len(workers)) as pool:
            futures = {}
            while pending or futures:
                while pending and free:
                    index, program = pending.pop(0)
                    worker = free.pop()
                    futures[pool.submit(job, worker, index, program)] = worker
                done, _ = cf.wait(futures, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    free.append(futures.pop(future))
                    result = future.result()
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    finally:
        for worker in workers:
            worker.stop()
    return sorted(results, key=lambda r: r.index)


# ---- reporting --------------------------------------------------------------------------------------------

# What varies between refusals of one kind: quoted names (an apostrophe inside a word, `DaCe's`, opens
# none), the generated program's names (`i1`, `x0`, `__cse12`, DaCe's labels `for_10`, `x0_index_2`), numbers
_LABEL = re.compile(r"(?<!\w)'[^']*'|\"[^\"]*\"|\b(?:[A-Za-z]\d+|__\w*?\d+|\w+?(?:_\d+)+)\b|\b\d+\b")


def refusal_class(verdict: Verdict) -> str:
    """A refusal's class: the error type and its message with names and numbers masked, so that one limit
    met in many programs (`the loop over i1 (line 12, DaCe's label 'for_10')`, `... over i5 ...`) is one class."""
    text = _LABEL.sub("_", verdict.detail.splitlines()[0] if verdict.detail else "")
    return f"{verdict.error}: {text[:160]}"


def record(result: Result) -> dict:
    """One JSON line of a campaign log."""
    return {"index": result.index, "verdict": result.verdict.as_json(), "configs": [list(c) for c in result.configs],
            "source": result.program.render(True),
            "shrunk": result.shrunk.render(True) if result.shrunk is not None else None}


def report(records: Sequence[dict], command: str = "") -> str:
    """The markdown report of one or more campaign logs (`record` lines)."""
    kinds = Counter(r["verdict"]["kind"] for r in records)
    total = len(records)
    seconds = sorted(r["verdict"]["seconds"] for r in records)
    lines = ["# gradflow fuzz", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [f"Programs: {total}", "", "| verdict | programs | share |", "|---|---:|---:|"]
    for kind in ("ok", "WRONG", "unstable", "refused", "crash", "dace", "invalid"):
        share = 100.0 * kinds.get(kind, 0) / total if total else 0.0
        lines.append(f"| {kind} | {kinds.get(kind, 0)} | {share:.2f}% |")
    if seconds:
        median = seconds[len(seconds) // 2]
        lines += ["", f"Time per program: median {median:.1f} s, mean {sum(seconds) / total:.1f} s "
                      f"(each checked under two configurations, in a worker process)."]
    runs: dict[str, list[dict]] = {}
    for r in records:
        runs.setdefault(r.get("run", "(not recorded)"), []).append(r)
    if len(runs) > 1:
        kinds_ = ("ok", "WRONG", "unstable", "refused", "crash", "dace", "invalid")
        lines += ["", "| run | programs | " + " | ".join(kinds_) + " |", "|---|---:|" + "---:|" * len(kinds_)]
        for run, rs in runs.items():
            counts = Counter(r["verdict"]["kind"] for r in rs)
            lines.append(f"| `{run}` | {len(rs)} | " + " | ".join(str(counts.get(k, 0)) for k in kinds_) + " |")
    configs = Counter(tuple(c) for r in records for c in r["configs"])
    lines += ["", "| configuration (route, forwarding, optimize) | programs checked |", "|---|---:|"]
    for config, count in sorted(configs.items()):
        lines.append(f"| {', '.join(map(str, config))} | {count} |")
    classes = Counter(refusal_class(Verdict.from_json(r["verdict"])) for r in records
                      if r["verdict"]["kind"] == "refused")
    if classes:
        lines += ["", "## Refusals by class", "", "| class | programs |", "|---|---:|"]
        for cls, count in classes.most_common():
            lines.append(f"| {cls.replace('|', '/')} | {count} |")
    for kind in ("WRONG", "crash", "unstable"):
        failing = [r for r in records if r["verdict"]["kind"] == kind]
        if failing:
            lines += ["", f"## {kind}", ""]
            for r in failing[:20]:
                v = r["verdict"]
                lines += [f"- program {r['index']}, {v['config']}: {v['error']} {v['detail'].splitlines()[0][:200]}",
                          "", "```python", (r["shrunk"] or r["source"]).rstrip(), "```", ""]
    dace = [r for r in records if r["verdict"]["kind"] == "dace"]
    if dace:
        lines += ["", "## DaCe's own forward (not gradflow's)", ""]
        for reason, count in Counter(_LABEL.sub("_", r["verdict"]["detail"].splitlines()[0])[:160]
                                     for r in dace).most_common(10):
            lines.append(f"- {count} x {reason}")
    return "\n".join(lines) + "\n"
