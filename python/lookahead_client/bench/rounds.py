"""Rounds: the method of the engine benchmarks (``lookahead-bench vllm``, ``sglang``).

On a shared 2-core machine one engine run's speed moves by more than the differences the
benchmarks exist to decide (the same deterministic configuration measured 1.61x and 1.23x
plain in two runs). So an engine benchmark is run in *rounds*:

* a *trial* is one configuration run once over every workload, in a fresh process;
* every round runs a trial of every configuration, the baseline (``plain``) included, in an
  order rotated by one each round, so that no configuration always runs first or last;
* a configuration's speed-up is taken against the baseline **of the same round** (what the
  machine's load did to that round, it did to both), and reported as the median and the
  range (min-max) over rounds;
* two configurations are compared round by round, as the ratio of their speeds in each
  round: one is *ahead* (*behind*) when the 95% confidence interval of the ratio's geometric
  mean over rounds (a t-interval of the rounds' log ratios) lies above (below) 1; a difference
  the interval does not resolve is a *tie*;
* a trial that took over :data:`STRAY_FACTOR` times its configuration's median over the
  rounds (for one pass over one workload) is a *stray*: something besides the configuration
  happened to it. The verdicts keep every round and say, beside them, what the rounds without
  strays give, so that one stray trial cannot make an unexplained tie.

Why an interval and not "ahead in every round": the machine's pace moves by several percent
from one second to the next. Two processes of the *same* configuration, alive at once and
taking turns prompt by prompt, differed by 2-7% over the same twelve prompts, as much as two
run one after the other, and one process's passes over those prompts differed by +-5%
(docs/vllm-runs.md, run 41). So pairing trials closer in time does not help, and only more
measured time (more rounds) resolves a smaller difference: the interval narrows as the
rounds grow (trials that stray by 3% each: about +-5% at 5 rounds, +-3.5% at 8), while
"ahead in every round" grows harder to meet with every round, and at 3 rounds calls a
configuration with no real difference ahead or behind one time in four.

Each trial's wall and CPU seconds and the machine's load before it are kept with it.
:func:`run_rounds` says up front what a run costs, and shows a progress bar with an ETA.
"""

from __future__ import annotations

import math
import os
import pathlib
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lookahead_client.errors import InvalidArgumentError

__all__ = [
    "BASELINE",
    "CONFIDENCE",
    "STRAY_FACTOR",
    "Paired",
    "Spread",
    "Trial",
    "TrialCost",
    "TrialError",
    "compare",
    "paired_text",
    "rotated",
    "run_child",
    "run_children",
    "run_rounds",
    "schedule",
    "speedups",
    "strays",
]

#: The configuration every other is measured against, run in every round.
BASELINE = "plain"

#: The confidence of a paired verdict (:func:`compare`).
CONFIDENCE = 0.95

#: A trial slower than this many times its configuration's median over the rounds is a stray.
#: Trials stray by a few percent (docs/vllm-runs.md run 41); one pass in run 50 took 5.3x its
#: median, and its interval went from +-6% to -37%/+146%.
STRAY_FACTOR = 1.5

T = TypeVar("T")


@dataclass(frozen=True)
class Trial:
    """One configuration's run in one round (``position``: its place in the round)."""

    round: int
    position: int
    config: str


def rotated(configs: Sequence[str], round_index: int) -> list[str]:
    """``configs`` in the order of round ``round_index``: rotated left by one each round."""
    if not configs:
        return []
    shift = round_index % len(configs)
    return list(configs[shift:]) + list(configs[:shift])


def schedule(configs: Sequence[str], rounds: int, baseline: str = BASELINE) -> list[Trial]:
    """Every trial of a run, in the order they run: ``rounds`` rounds of every configuration
    (the baseline added first when missing), rotated by one each round.

    Raises:
        InvalidArgumentError: ``rounds`` below 1, or a configuration named twice.
    """
    if rounds < 1:
        raise InvalidArgumentError(f"rounds must be at least 1, got {rounds}", field="rounds")
    if len(set(configs)) != len(configs):
        raise InvalidArgumentError(f"a configuration is named twice: {configs}", field="configs")
    names = list(configs) if baseline in configs else [baseline, *configs]
    return [Trial(r, i, name) for r in range(rounds) for i, name in enumerate(rotated(names, r))]


@dataclass(frozen=True)
class Spread:
    """A figure over rounds: the median and the range."""

    median: float
    low: float
    high: float
    rounds: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        """The spread of ``values`` (one per round).

        Raises:
            ValueError: no values, or one that is not finite.
        """
        data = [float(v) for v in values]
        if not data or not all(math.isfinite(v) for v in data):
            raise ValueError(f"a spread needs finite values, got {data}")
        return cls(statistics.median(data), min(data), max(data), len(data))

    def as_dict(self, digits: int = 3) -> dict[str, float | int]:
        """``{"median", "min", "max", "rounds"}``, rounded, for JSON."""
        return {
            "median": round(self.median, digits),
            "min": round(self.low, digits),
            "max": round(self.high, digits),
            "rounds": self.rounds,
        }

    def __str__(self) -> str:
        if self.rounds == 1:
            return f"{self.median:.3f}"
        return f"{self.median:.3f} [{self.low:.3f}-{self.high:.3f}]"


def speedups(seconds: Sequence[Mapping[str, float]], baseline: str = BASELINE) -> dict[str, Spread]:
    """Each configuration's speed-up over the baseline of the same round.

    Args:
        seconds: per round, each configuration's seconds for the same work (the baseline's
            included).

    Raises:
        ValueError: a round without the baseline, or a time that is not positive.
    """
    per_config: dict[str, list[float]] = {}
    for r, row in enumerate(seconds):
        if baseline not in row:
            raise ValueError(f"round {r} has no {baseline!r} trial")
        if any(not s > 0 for s in row.values()):
            raise ValueError(f"round {r} has a time that is not positive: {dict(row)}")
        for name, s in row.items():
            per_config.setdefault(name, []).append(row[baseline] / s)
    return {name: Spread.of(values) for name, values in per_config.items()}


def strays(seconds: Sequence[float]) -> list[int]:
    """The rounds (indices) in which a configuration took over :data:`STRAY_FACTOR` times its
    median ``seconds`` over all rounds; none with fewer than 3 rounds (of two, neither is
    known to be the odd one)."""
    if len(seconds) < 3:
        return []
    typical = statistics.median(seconds)
    return [i for i, s in enumerate(seconds) if s > STRAY_FACTOR * typical]


@dataclass(frozen=True)
class Paired:
    """One configuration's speed over another's, paired round by round: the rounds' ratios
    (:attr:`spread`: median, min-max) and their geometric mean with its :data:`CONFIDENCE`
    interval (``low``, ``high``; None with a single round, which cannot say how far a trial
    strays)."""

    spread: Spread
    mean: float
    low: float | None
    high: float | None

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        """The rounds' spread (:meth:`Spread.as_dict`), ``mean`` and ``ci`` ([low, high] or
        None), rounded, for JSON."""
        ci = None if self.low is None or self.high is None else [self.low, self.high]
        return {
            **self.spread.as_dict(digits),
            "mean": round(self.mean, digits),
            "ci": None if ci is None else [round(x, digits) for x in ci],
        }

    def __str__(self) -> str:
        return paired_text(self.as_dict())


def paired_text(ratio: Mapping[str, Any]) -> str:
    """A :meth:`Paired.as_dict` as the benchmarks print it: the mean, its interval, and the
    rounds' median and range."""
    if ratio["ci"] is None:
        return f"{ratio['mean']:.3f}, one round"
    low, high = ratio["ci"]
    return (
        f"{ratio['mean']:.3f}, {CONFIDENCE:.0%} CI {low:.3f}-{high:.3f}; rounds "
        f"{ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]"
    )


def compare(seconds_a: Sequence[float], seconds_b: Sequence[float]) -> tuple[str, Paired]:
    """How configuration A's speed compares with B's, paired round by round.

    Args:
        seconds_a: A's seconds in each round.
        seconds_b: B's seconds for the same work in the same rounds.

    Returns:
        ``("ahead" | "behind" | "tie", A's speed over B's)``: ahead (behind) when the
        confidence interval of the ratio's geometric mean over rounds lies above (below) 1;
        otherwise the rounds do not resolve the difference (always so with one round).

    Raises:
        ValueError: the two have different numbers of rounds, or none, or a time that is not
            positive.
    """
    if len(seconds_a) != len(seconds_b) or not seconds_a:
        raise ValueError(f"rounds differ: {len(seconds_a)} against {len(seconds_b)}")
    if any(not s > 0 for s in (*seconds_a, *seconds_b)):
        raise ValueError(f"a time is not positive: {list(seconds_a)}, {list(seconds_b)}")
    ratios = [b / a for a, b in zip(seconds_a, seconds_b, strict=True)]
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return "tie", Paired(Spread.of(ratios), math.exp(mean), None, None)
    from scipy.stats import t  # the bench extra's; the rest of the module needs none

    half = t.ppf(0.5 + CONFIDENCE / 2, len(logs) - 1) * statistics.stdev(logs) / len(logs) ** 0.5
    low, high = math.exp(mean - half), math.exp(mean + half)
    paired = Paired(Spread.of(ratios), math.exp(mean), low, high)
    if low > 1.0:
        return "ahead", paired
    if high < 1.0:
        return "behind", paired
    return "tie", paired


@dataclass(frozen=True)
class TrialCost:
    """What one trial cost the machine.

    ``cpu_s`` counts the trial's child processes once they have ended (an engine's own
    worker processes included when the engine waited for them); ``load`` is the machine's
    1-minute load average as the trial started (the benchmark's own earlier trials count in
    it for up to a minute).
    """

    wall_s: float
    cpu_s: float
    load: float

    def as_dict(self) -> dict[str, float]:
        """For JSON."""
        return {"wall_s": round(self.wall_s, 1), "cpu_s": round(self.cpu_s, 1), "load": self.load}


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_rounds(
    trials: Sequence[Trial],
    run_trial: Callable[[Trial], T],
    *,
    estimate_s: Callable[[Trial], float],
    what: str,
    stream: Any = None,
) -> list[tuple[Trial, T, TrialCost]]:
    """Runs ``trials`` in order; says first what the run will cost, then shows progress.

    Args:
        trials: from :func:`schedule`.
        run_trial: runs one trial (a fresh process of the configuration) and returns its
            result; its children must have ended when it returns (their CPU time is counted).
        estimate_s: a rough guess of one trial's seconds, for the cost said up front.
        what: a few words on what one trial does, for that line.
        stream: where the lines and the bar go (default stderr).

    Returns:
        Each trial with its result and its cost, in the order run.
    """
    from tqdm import tqdm

    stream = stream or sys.stderr
    guess = sum(estimate_s(t) for t in trials)
    rounds = len({t.round for t in trials})
    print(
        f"{len(trials)} trials ({rounds} round(s) x {len(trials) // max(rounds, 1)} "
        f"configurations), each {what}: about {guess / 60:.0f} min on a 2-core machine "
        "(a rough guess; the bar's ETA follows the trials actually run)",
        file=stream,
        flush=True,
    )
    out = []
    bar = tqdm(total=len(trials), unit="trial", file=stream, dynamic_ncols=True)
    try:
        for trial in trials:
            bar.set_description(f"round {trial.round + 1}/{rounds} {trial.config}")
            load = round(os.getloadavg()[0], 2)
            cpu = _children_cpu_seconds()
            started = time.perf_counter()
            result = run_trial(trial)
            cost = TrialCost(time.perf_counter() - started, _children_cpu_seconds() - cpu, load)
            out.append((trial, result, cost))
            bar.update()
    finally:
        bar.close()
    return out


class TrialError(RuntimeError):
    """A trial's process failed; the message ends with the tail of its log."""


def run_child(command: Sequence[str], env: Mapping[str, str], trial: Trial) -> None:
    """Runs one trial's process; :func:`run_children` with one."""
    run_children([(command, env)], trial)


def run_children(children: Sequence[tuple[Sequence[str], Mapping[str, str]]], trial: Trial) -> None:
    """Runs a trial's processes side by side (several engines at once), each with its output
    in a log file of its own, so that engines' start-up noise stays off the progress bar.

    Each process runs in a session of its own, killed whole (the engine's own processes too)
    if the benchmark is interrupted or terminated, or as soon as another of the trial's
    processes fails (an engine waiting for its sibling would wait for nothing).

    Args:
        children: each process's command and environment.

    Raises:
        TrialError: a process exited with an error (naming the trial, the log's last lines
            and where the whole log is).
    """
    logs = [
        tempfile.NamedTemporaryFile(
            "w+", prefix=f"lookahead-bench-r{trial.round}-", suffix=".log", delete=False
        )
        for _ in children
    ]
    procs: list[subprocess.Popen] = []
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        for (command, env), log in zip(children, logs, strict=True):
            procs.append(
                subprocess.Popen(
                    list(command),
                    env=dict(env),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        failed = _first_failure(procs)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for child in procs:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        for log in logs:
            log.close()
    if failed is None:
        for log in logs:
            os.unlink(log.name)
        return
    index, status = failed
    lines = pathlib.Path(logs[index].name).read_text(errors="replace").splitlines(keepends=True)
    which = f" (process {index + 1} of {len(children)})" if len(children) > 1 else ""
    raise TrialError(
        f"{trial.config} failed in round {trial.round + 1}{which} (exit status {status}); "
        f"the last lines of its log ({logs[index].name}):\n{''.join(lines[-30:])}"
    )


def _first_failure(procs: Sequence[subprocess.Popen]) -> tuple[int, int] | None:
    """Waits for every process, in short slices so that a signal's handler runs in this (the
    main) thread however the signal was delivered; returns the index and exit status of the
    first to fail (the others are left running for the caller to kill), or None."""
    while True:
        running = False
        for index, child in enumerate(procs):
            status = child.poll()
            if status is None:
                running = True
            elif status != 0:
                return index, status
        if not running:
            return None
        time.sleep(0.2)


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)
