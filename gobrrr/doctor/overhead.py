"""What the doctor itself costs: the profiler settings, and recorded steps against plain ones.

A profiler slows the program it watches, and a loop that keeps the GPU fed when run plainly can turn
host-bound under it (nanoGPT's train.py, eager, one H200: 127 ms per iteration plainly, 184 ms in the
recorded steps). So every report carries both step times:

1. Recorded: the mean step of the recording window (ProfilerStep#k, from the trace).
2. Plain: after the window closes the profiler and the sync detective are off; the doctor times the
   next `plain_steps` steps between step boundaries (`time.perf_counter`, no sync: the same
   boundaries as the recorded steps) and takes their mean, the time from the first boundary to the
   last over their number. Not the median: a boundary (an optimizer step) finds the host some way
   ahead of the GPU, so one interval is long when the next is short, and only the sum is steady
   (measured on an H200: the median of 8 intervals was 5% under the script's own timing, the mean
   within 1%). The step in which the trace was saved, and the one after it (the GPU's queue, drained
   by the save, fills again), are not among them.
3. The ratio recorded / plain (with about one standard error, `ratio_se`, from the spread of both sets of
   steps), and what the extra time does to the shares: the profiler's work is
   host work, so in a loop it makes host-bound it shows as GPU idle with the host late (`host_bound`,
   then `launch_gaps`). `corrected` takes the added ms per step off those two causes (never below 0)
   and gives every share over a plain step: an estimate, marked as one.

Settings (`ProfilerSettings`), lightest first; the doctor's default keeps line attribution, from steps of
their own (lines.py: the figure steps record without stacks, the line steps after them with):
  activities  CPU + CUDA (kernels, copies, runtime calls): the figures          always
  stack       Python frames (`with_stack`): which line of yours made the gap    default on, in the line steps
  detective   the runtime sync detective over the same steps: the sync's kind   default off (--detective)
  shapes      input shapes of every op (`record_shapes`)                        off (--shapes)
  memory      allocations (`profile_memory`)                                    off (--memory)
`gobrrr bench doctor` measures each one's cost on a nanoGPT-like loop, eager and compiled
(BENCHMARKS.md, doctor).
"""
from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import asdict, dataclass

# A recorded step this much slower than a plain one gets its shares marked as inflated.
MARK_RATIO = 1.1


@dataclass(frozen=True)
class ProfilerSettings:
    stack: bool = True        # Python frames: line attribution
    detective: bool = False   # the sync detective's wrappers over the recorded steps
    shapes: bool = False      # record_shapes
    memory: bool = False      # profile_memory

    def to_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        on = [k for k, v in asdict(self).items() if v]
        return "+".join(["kineto"] + on)


# The settings `gobrrr bench doctor` compares, each against the plain loop, in one run.
BENCH_SETTINGS = {
    "kineto (figure steps)": ProfilerSettings(stack=False),
    "kineto+stack (line steps)": ProfilerSettings(),
    "kineto+stack+detective": ProfilerSettings(detective=True),
    "kineto+stack+shapes": ProfilerSettings(shapes=True),
    "kineto+stack+memory": ProfilerSettings(memory=True),
}


def make_profiler(settings: ProfilerSettings, *, cuda: bool, schedule=None, on_trace_ready=None):
    """A torch.profiler.profile with these settings (not started)."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with warnings.catch_warnings():  # "events are cleared at the end of each cycle": we want that
        warnings.simplefilter("ignore", UserWarning)
        return torch.profiler.profile(activities=acts, with_stack=settings.stack, record_shapes=settings.shapes,
                                      profile_memory=settings.memory, schedule=schedule,
                                      on_trace_ready=on_trace_ready)


def overhead_figures(recorded_ms: list[float], plain_ms: list[float], settings: ProfilerSettings,
                     gpu: dict | None = None) -> dict:
    """Recorded vs plain step time, their ratio, and (with GPU figures) the shares corrected for it."""
    out: dict = {"settings": settings.to_dict(), "plain_steps": len(plain_ms),
                 "plain_steps_ms": [round(x, 4) for x in plain_ms], "recorded_ms": None, "plain_ms": None,
                 "ratio": None, "ratio_se": None, "added_ms": None, "inflated": False, "corrected": None}
    if recorded_ms:
        out["recorded_ms"] = round(statistics.fmean(recorded_ms), 4)
    if plain_ms:
        out["plain_ms"] = round(statistics.fmean(plain_ms), 4)
    if not (recorded_ms and plain_ms) or out["plain_ms"] <= 0:
        return out
    rec, plain = out["recorded_ms"], out["plain_ms"]
    out["ratio"] = round(rec / plain, 4)
    # about one standard error of the ratio, from both means' own spread: single steps of a host-bound loop vary
    # by tens of percent (36-116 ms for one nanoGPT-like loop on an H100), so a ratio of 8-step means moves by
    # 5-10% from run to run, and the report says so rather than print two digits it cannot stand behind
    out["ratio_se"] = round(out["ratio"] * math.hypot(_rel_se(recorded_ms), _rel_se(plain_ms)), 4)
    out["added_ms"] = round(rec - plain, 4)
    out["inflated"] = out["ratio"] >= MARK_RATIO
    if gpu and gpu.get("idle_breakdown_ms") is not None:
        out["corrected"] = corrected_shares(gpu, n_steps=len(recorded_ms), added_ms=max(rec - plain, 0.0),
                                            plain_ms=plain)
    return out


def _rel_se(xs: list[float]) -> float:
    """The standard error of the mean of `xs` over the mean (0 for fewer than two values)."""
    if len(xs) < 2 or statistics.fmean(xs) <= 0:
        return 0.0
    return statistics.stdev(xs) / math.sqrt(len(xs)) / statistics.fmean(xs)


def corrected_shares(gpu: dict, *, n_steps: int, added_ms: float, plain_ms: float) -> dict:
    """The idle breakdown per plain step, with the profiler's added host time taken off the host-side causes.

    Per step: each cause's idle ms (window total / steps); `host_bound`, then `launch_gaps`, give up the
    added ms (not below 0); the shares are over the plain step. An estimate: the profiler's time is assumed
    to land where the host was already late, which is where a host-bound loop spends it.
    """
    per_step = {k: v / max(n_steps, 1) for k, v in gpu["idle_breakdown_ms"].items()}
    left = added_ms
    for cause in ("host_bound", "launch_gaps"):
        take = min(per_step.get(cause, 0.0), left)
        per_step[cause] = per_step.get(cause, 0.0) - take
        left -= take
    pct = {k: round(min(100.0, 100.0 * v / plain_ms), 3) for k, v in per_step.items()}
    return {"idle_breakdown_pct": pct, "compute_idle_pct": round(min(100.0, sum(pct.values())), 3),
            "unexplained_ms": round(left, 4)}


def time_steps(step_fn, n: int, sync=None) -> float:
    """Mean ms per call of `step_fn` over `n` calls, `sync()` (e.g. torch.cuda.synchronize) around them."""
    import time

    if sync:
        sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step_fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) * 1e3 / n


def measure_settings(step_fn, *, cuda: bool, steps: int = 10, warmup: int = 3, rounds: int = 2,
                     settings: dict[str, ProfilerSettings] | None = None) -> list[dict]:
    """Each setting's recorded ms/step beside the plain ms/step, measured in turns in one process.

    First an unmeasured profiler session of one step (as the doctor's start-up window is). Per round: plain
    (no profiler), then each setting (profiler started, `warmup` steps, `steps` timed steps recorded, trace
    discarded). Rounds alternate so a drift in clocks or caches hits all alike;
    the figures are the medians over rounds. `step_fn` runs one whole training step.
    """
    import torch

    from gobrrr.doctor.quiet import kineto_quiet

    sync = torch.cuda.synchronize if cuda else None
    settings = settings if settings is not None else BENCH_SETTINGS
    first = make_profiler(ProfilerSettings(), cuda=cuda)  # a first session, not measured (the doctor's start-up
    with kineto_quiet():                                   # window is one): CUPTI's one-time set-up lands here
        first.start()
    time_steps(step_fn, 1, sync)
    with kineto_quiet():
        first.stop()
    plain: list[float] = []
    rec: dict[str, list[float]] = {k: [] for k in settings}
    for _ in range(rounds):
        time_steps(step_fn, warmup, sync)
        plain.append(time_steps(step_fn, steps, sync))
        for name, s in settings.items():
            watcher = None
            if s.detective:
                from gobrrr.syncs.watch import watch_syncs

                watcher = watch_syncs("count")
            prof = make_profiler(s, cuda=cuda)
            with kineto_quiet():
                prof.start()
            try:
                if watcher is not None:
                    watcher.__enter__()
                time_steps(step_fn, warmup, sync)
                rec[name].append(time_steps(step_fn, steps, sync))
            finally:
                if watcher is not None:
                    watcher.__exit__(None, None, None)
                with kineto_quiet():
                    prof.stop()
    p = statistics.median(plain)
    rows = [{"setting": "plain", "ms": round(p, 4), "ratio": 1.0}]
    for name, s in settings.items():
        ms = statistics.median(rec[name])
        rows.append({"setting": name, "ms": round(ms, 4), "ratio": round(ms / p, 4), **s.to_dict()})
    return rows
