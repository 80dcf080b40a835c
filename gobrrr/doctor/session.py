"""`gobrrr doctor script.py`: run a script unmodified under the profiler and say where the GPU waits.

    gobrrr doctor [--steps N] [--warmup W] [--out DIR] script.py [script args...]

The script runs as `__main__` (runpy), with its own argv. The doctor records a bounded window:

1. From the start it records, in case the script never steps (a time window of `--window-s`
   seconds, stopped by a SIGALRM handler on the main thread, or the whole run if shorter).
2. Steps are found where the script steps an optimizer (a global optimizer step post-hook;
   only the first optimizer that steps counts) or where it calls `gobrrr.doctor.step()`
   (manual marks win over optimizer steps). At the first step the start-up recording is
   dropped; the warmup steps run with no profiler, except the last when W >= 3 (default 3), in
   which a fresh profiler warms up (torch's WARMUP action: kineto set up, nothing kept); from
   boundary W (1 runs as 2: see Session) it records a lead-in step (kept in trace.json, left out of
   the figures: the activity buffers start in it), then N steps, each marked `ProfilerStep#k`, then
   stops: the trace covers 1 + N steps, not the run. These figure steps record no Python stacks.
   Steps that first come after the time window closed, or after torch.compile compiled before the
   first step (compile_watch.py), are recorded the same way.
3. The boundary after, a fresh profiler with Python stacks records a lead-in step and `line_steps`
   (default 3) more into trace-lines.json: they only name the lines (lines.py); stacks cost a
   compiled step twice what the rest of the profiler does. (`line_steps` 0, a time window, --warmup 0
   and ranked runs record the stacks in the figure steps instead: one window.)
   When the last recorded step ends the profiler stops (the trace is saved); one step lets the
   GPU's queue fill again, then `plain_steps` steps run with no profiler and no sync detective:
   their mean is the plain step time, against which the report sets the recorded one (overhead.py).
4. Then the trace goes through build.py: gobrrr.doctor.timeline (figures), plot (timeline.png),
   advice (what to fix, merged with gobrrr lint); report.json, timeline.png and trace.json land in
   DIR and the summary is printed right then, while the script carries on (a real run lasts hours).
   A time window (no steps) is analysed as soon as it closes. When the script ends, report.json
   gets its exit code and one line says so.
5. Under torchrun (RANK and WORLD_SIZE > 1 in the environment) every rank does all of the above
   for the same step numbers into DIR/rank-N/; rank 0 then waits for the others' reports, writes
   the merged report.json and timeline.png into DIR and prints the one summary (ranks.py, merge.py).

The script's exit code is passed through; an exception in the script still writes the report
of what was recorded up to that point, prints the script's traceback and exits 1. A script that
ends (or raises) inside a recorded step leaves that step out of the figures: a partial step is
not a step (its time is whatever the script did last, often teardown); it stays in trace.json,
and the report counts only the complete steps it measured ("2 recorded", "ended after 2").

Python API: `gobrrr.doctor.profile(fn, steps=5)` profiles a function called once per step and
returns the report; `with gobrrr.doctor.profile() as doc: ... gobrrr.doctor.step()` profiles a
loop. Method after Holistic Trace Analysis (Meta, 2023): idle time and its causes from the trace.
"""
from __future__ import annotations

import contextvars
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

from gobrrr.doctor.build import NO_GPU_NOTE, build_report, snapshot
from gobrrr.doctor.compile_watch import CompileWatch
from gobrrr.doctor.config import DoctorConfig
from gobrrr.doctor.files import write_json
from gobrrr.doctor.overhead import ProfilerSettings, make_profiler
from gobrrr.doctor.quiet import kineto_quiet
from gobrrr.doctor.ranks import RankInfo, merge_window, rank_from_env, record_exit, wait_recorded
from gobrrr.doctor.report import summary

__all__ = ["DoctorConfig", "Session", "active_session", "step", "NO_GPU_NOTE"]

_ACTIVE: contextvars.ContextVar["Session | None"] = contextvars.ContextVar("gobrrr_doctor", default=None)


def active_session() -> "Session | None":
    """The doctor session recording this context, or None when no doctor is running."""
    return _ACTIVE.get()


def step() -> None:
    """Mark a step boundary for the doctor (a no-op when no doctor is running)."""
    session = _ACTIVE.get()
    if session is not None:
        session.step(manual=True)


class Session:
    """One doctor run: the profiler state machine, the step hooks and the outputs."""

    def __init__(self, cfg: DoctorConfig, *, script: str | None = None, argv: list[str] | None = None,
                 auto_steps: bool = True):
        import torch

        self.torch = torch
        self.cfg = cfg
        # torch's profiler crashes (torch 2.13, ~1 run in 3) when one step() both stops the
        # start-up trace and starts the recording, so recording starts at boundary 2 at the
        # earliest; warmup 0 records from the start instead (no restart at all).
        self.warmup = 2 if cfg.warmup == 1 else cfg.warmup
        # With 3 or more warmup steps the recording profiler starts one step early, in torch's WARMUP action
        # (kineto set up, nothing kept): its start-up cost lands in a warmup step, not in the first recorded one
        # (on a CPU that step took 240 ms against 3-4 ms for the next). Fewer, and it would start at boundary 1.
        self.profiler_warmup = 1 if self.warmup >= 3 else 0
        # The recording profiler's first RECORD step carries its start-up (the activity buffers, the Python
        # tracer meeting each code object for the first time): on an H200 a nanoGPT-like loop's recorded steps
        # cost 1.47x (compiled 3.03x) a plain one from a profiler's 1st step on, 1.30x (1.96x) from its 4th
        # on (BENCHMARKS.md, doctor). That step is recorded (it stays in trace.json) but left out of the
        # figures (build.py). --warmup 0 records from the start, as asked: nothing is left out there.
        self.lead_in = cfg.lead_in if self.warmup >= 1 else 0
        self.recorded = self.lead_in + cfg.steps   # steps the current recording profiler records
        self.script, self.argv = script, list(argv or [])
        self.cuda = torch.cuda.is_available()
        self.rank: RankInfo | None = rank_from_env()
        # Figures and lines from steps of their own (lines.py): the figure steps record without Python stacks, the
        # dearest setting, then `line_steps` steps with them name the lines. A time window, --warmup 0 and a ranked
        # run (the straggler's line needs the stacks of the very steps it was late in) keep one window with stacks.
        self.split = cfg.settings.stack and cfg.line_steps > 0 and self.warmup >= 1 and self.rank is None
        self.phase = "figures"      # which window the recording profiler records: "figures", then "lines"
        self._fig_step0 = self._line_step0 = 0
        self.figure_settings = cfg.settings  # what the recording the figures come from records (no stacks if split)
        self._pw = self.profiler_warmup  # the current profiler's WARMUP steps (none for the line steps)
        self._lines_path: Path | None = None
        self.base_out = Path(cfg.out_dir)
        self.out = self.rank.out_dir(self.base_out) if self.rank is not None else self.base_out
        self.plain_ms: list[float] = []    # plain steps after the recording (overhead.py)
        self._plain_t = 0.0
        # window: recording from the start, no boundary yet; warmup: start-up dropped, waiting for
        # step W; steps: recording steps; done: trace saved; window-closed: time window saved.
        self.mode = "idle"
        self.boundaries = 0         # step boundaries seen
        self.step_source = "time-window"
        self.manual = not auto_steps
        self.auto_steps = auto_steps
        self.report: dict | None = None
        self._prof = None
        self._first_opt = None
        self._hook = None
        self._token = None
        self._trace_path: Path | None = None
        self._alarm = False
        self._busy = False
        self._step0 = 0             # the boundary at which the current profiler's step 0 began
        self._t_start = 0.0
        # the sync detective (gobrrr.syncs) watches exactly what the trace records
        self._detective = None
        self.sync_report = None
        self._reported = False      # the summary of the last recording window was printed
        self._compile_watch: CompileWatch | None = None
        self._dropping = False      # stopping the start-up recording without saving it
        self.late_reason = ""       # "window" or "compile": why the start-up recording ended before a step
        self._sync_at_step = None   # the detective's counts at the last step boundary

    # -- profiler control -------------------------------------------------------------------
    # A torch.profiler.profile is driven by its schedule (the supported way to start and stop
    # tracing from inside a training loop, here from an optimizer hook): step k is the span
    # after boundary k, step 0 runs from the start to the first boundary. Two profilers, never
    # started in the same step() that stops another (torch 2.13 then crashes now and then):
    # the start-up one records step 0 only (kept if the script never steps) and is done at
    # boundary 1; a fresh one starts at boundary W - 1 (W >= 3: one step of torch's WARMUP first)
    # or W, and records N steps from W. The warmup steps before it run with no profiler at all.
    # (Recording in the start-up profiler's own later cycle cost a nanoGPT-like step 1.4-1.9x on
    # an H200, against ~1.1x for a profiler of its own.)

    def _new_profiler(self, schedule, first_step: int = 0, settings: ProfilerSettings | None = None):
        settings = self.cfg.settings if settings is None else settings
        prof = make_profiler(settings, cuda=self.cuda, schedule=schedule, on_trace_ready=self._on_trace_ready)
        prof.step_num, prof.current_action = first_step, schedule(first_step)  # ProfilerStep#k: k = the boundary
        with warnings.catch_warnings(), kineto_quiet():  # "events are cleared at the end of each cycle": we want that
            warnings.simplefilter("ignore", UserWarning)
            prof.start()
        return prof

    def _schedule(self, k: int):
        """The start-up profiler: step 0 (the whole run up to the first boundary), or with --warmup 0 the
        first N steps."""
        A = self.torch.profiler.ProfilerAction
        N = self.cfg.steps
        if self.warmup == 0:
            return A.RECORD if k < N - 1 else A.RECORD_AND_SAVE if k == N - 1 else A.NONE
        return A.RECORD_AND_SAVE if k == 0 else A.NONE

    def _schedule_steps(self, k: int):
        """A profiler that records the N steps after boundary `_step0`, warming up in the step before it
        (`profiler_warmup`; torch.profiler.schedule's warmup)."""
        A = self.torch.profiler.ProfilerAction
        j, N = k - self._step0, self.recorded
        if j < 0:
            return A.WARMUP if j >= -self._pw else A.NONE
        return A.RECORD if j < N - 1 else A.RECORD_AND_SAVE if j == N - 1 else A.NONE

    def _on_trace_ready(self, prof) -> None:
        if self._dropping:
            return
        if self.mode == "window" and self.warmup >= 1 and self.boundaries >= 1:
            return  # the start-up window: superseded by the steps to come
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / ("trace-lines.json" if self.phase == "lines" else "trace.json")
        if self.phase == "lines":
            self._lines_path = path
        else:
            self._trace_path = path
        prof.export_chrome_trace(str(path))

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> "Session":
        stale = ["report.json", "timeline.png", "trace.json", "trace-lines.json", "comm.json"]
        for name in stale:  # no stale files from an earlier run
            (self.out / name).unlink(missing_ok=True)
        if self.rank is not None and self.rank.is_main:
            for name in stale:
                (self.base_out / name).unlink(missing_ok=True)
        self._token = _ACTIVE.set(self)
        self._t_start = time.perf_counter()
        if self.auto_steps:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self.mode = "window"
        self._prof = self._new_profiler(self._schedule)
        self._watch()
        if self.warmup >= 1:  # torch.compile's first compile is no part of a start-up window worth keeping
            self._compile_watch = CompileWatch(self._on_compile_start)
            self._compile_watch.watch()
        if self.cfg.window_s > 0 and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGALRM, self._on_alarm)
            signal.setitimer(signal.ITIMER_REAL, self.cfg.window_s)
            self._alarm = True
        return self

    def _cancel_alarm(self) -> None:
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            self._alarm = False

    def _on_alarm(self, signum, frame) -> None:
        """The time window ran out before any step: save what was recorded, wait for steps."""
        if self._busy:  # inside our own step handling: try again shortly
            signal.setitimer(signal.ITIMER_REAL, 0.02)
            return
        f = frame
        while f is not None:  # stop only from the user's own code, not from inside torch
            name = f.f_code.co_filename.replace("\\", "/")
            if name.endswith("/runpy.py"):
                break  # below this are the doctor's frames that run the script
            if "/torch/" in name:
                signal.setitimer(signal.ITIMER_REAL, 0.02)
                return
            f = f.f_back
        self._cancel_alarm()
        if self.mode == "window" and self._prof is not None:
            self._unwatch()  # first: stopping the profiler syncs
            with kineto_quiet():
                self._prof.stop()  # saves the window through _on_trace_ready
            self._prof = None
            self.mode, self.late_reason = "window-closed", "window"
            self._close_window(f"no step in the first {self.cfg.window_s:g} s: recorded that time window")

    def _on_compile_start(self) -> None:
        """torch.compile starts compiling before the first step: drop the start-up recording (it would trace
        the compiler's Python call by call) and record the steps with a fresh profiler when they come."""
        if self.mode != "window" or self.boundaries or self._prof is None or self._busy:
            return
        self._cancel_alarm()
        self._unwatch(keep=False)
        self._dropping = True
        try:
            with warnings.catch_warnings(), kineto_quiet():
                warnings.simplefilter("ignore", UserWarning)
                self._prof.stop()
        finally:
            self._dropping = False
        self._prof = None
        self.mode, self.late_reason = "compiling", "compile"

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.manual:
            return
        if self._first_opt is None:
            self._first_opt = id(optimizer)
        if id(optimizer) == self._first_opt:
            self._boundary("optimizer")

    def step(self, manual: bool = True) -> None:
        if manual and not self.manual:
            self.manual = True  # manual marks win over optimizer steps from now on
        self._boundary("manual" if manual else "optimizer")

    def _boundary(self, source: str) -> None:
        self.boundaries += 1
        k, W, N = self.boundaries, self.warmup, self.recorded
        self._busy = True
        try:
            if self.mode == "settle":  # the step after the trace was saved refilled the GPU's queue: not plain
                self.mode, self._plain_t = "plain", time.perf_counter()
                return
            if self.mode == "plain":  # a plain step ended: no profiler, no detective
                now = time.perf_counter()
                self.plain_ms.append((now - self._plain_t) * 1e3)
                self._plain_t = now
                if len(self.plain_ms) >= self.cfg.plain_steps:
                    self.mode = "done"
                    self._close_window(f"recorded {self.cfg.steps} steps")
                return
            if self.mode in ("warmup", "window-closed", "compiling") and k >= max(W - self.profiler_warmup, 1):
                # the recording starts: a fresh profiler for N steps (after the warmup steps, or after the time
                # window closed, or after torch.compile's first compile dropped the start-up recording); it
                # warms up in the step before the first recorded one when there is a warmup step to spare
                self._cancel_alarm()
                self.step_source, self._step0, self.mode = source, k + self.profiler_warmup, "steps"
                self.phase, self.recorded, self._pw = "figures", self.lead_in + self.cfg.steps, self.profiler_warmup
                self._fig_step0 = self._step0
                self._reported = False  # a new window: its summary comes when it closes
                if self.split:
                    self.figure_settings = replace(self.cfg.settings, stack=False)
                self._prof = self._new_profiler(self._schedule_steps, first_step=k, settings=self.figure_settings)
                if not self.profiler_warmup and not self.lead_in:
                    self._watch()
                return
            if self.mode == "lines-wait":
                # the figure trace was saved at the boundary before (never start one profiler in the step() that
                # stops another): a fresh one with stacks records a lead-in and the line steps, no WARMUP step
                self.phase, self.recorded, self._pw = "lines", self.lead_in + self.cfg.line_steps, 0
                self._step0 = self._line_step0 = k
                self.mode = "steps"
                self._prof = self._new_profiler(self._schedule_steps, first_step=k, settings=ProfilerSettings())
                return
            if self.mode == "window" and W >= 1 and self._prof is not None:
                # boundary 1: the start-up window ends, dropped (the steps to come replace it)
                self._cancel_alarm()
                self.step_source = source
                with warnings.catch_warnings(), kineto_quiet():
                    warnings.simplefilter("ignore", UserWarning)
                    self._prof.step()
                self._prof, self.mode = None, "warmup"
                self._unwatch(keep=False)  # its syncs go with it
                return
            if self.mode not in ("window", "steps") or self._prof is None:
                return  # counted, not recorded
            self._cancel_alarm()
            self.step_source = source
            if self.phase == "figures" and k == self._step0 + self.lead_in and (self.profiler_warmup or self.lead_in):
                self._watch()  # the detective covers the steps in the figures: not the warm-up or lead-in one
            last = k - self._step0 >= N
            if last:
                self._unwatch()  # before the profiler stops: saving the trace syncs, and that sync is ours
            with warnings.catch_warnings(), kineto_quiet():  # "events are cleared at the end of each cycle"
                warnings.simplefilter("ignore", UserWarning)
                self._prof.step()
            self._sync_at_step = snapshot(self.sync_report)  # what the detective saw in the complete steps
            if last and self.phase == "figures" and self.split:
                self._prof, self.mode = None, "lines-wait"  # the line steps next
            elif last:
                self._prof = None
                self.plain_ms = []
                if self.cfg.plain_steps:  # one step to settle, then plain steps (the trace is saved: not in them)
                    self.mode = "settle"
                else:
                    self.mode = "done"
                    self._close_window(f"recorded {self.cfg.steps} steps")
            else:
                self.mode = "steps"
        finally:
            self._busy = False

    def _close_window(self, what: str) -> None:
        """The recording window closed (and its plain steps were timed): analyse it, write the files and
        print the summary now. Under torchrun only rank 0 prints, the merged summary of every rank."""
        self._analyze()
        self._reported = True
        if self.rank is not None and not self.rank.is_main:
            return
        shown, where = self.report, self.out
        if self.rank is not None:
            shown, where = merge_window(self.base_out, self.rank, self.report, self.cfg), self.base_out
        if self.cfg.print_summary:
            print(summary(shown), flush=True)
        print(f"gobrrr doctor: {what}; report in {where}/ (the script carries on; report.json gets its exit "
              "code when it ends)", file=sys.stderr, flush=True)

    def finish(self, exit_code: int = 0, error: BaseException | None = None) -> dict:
        """Stop recording (if still on), analyze what was recorded (unless its window already closed and
        was reported), then write the exit code and wall time into the report."""
        self._cancel_alarm()
        if self._compile_watch is not None:
            self._compile_watch.unwatch()
            self._compile_watch = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._unwatch()  # first: stopping the profiler syncs
        recording = self._prof is not None
        if recording:
            with kineto_quiet():
                self._prof.stop()  # saves what was recorded through _on_trace_ready
            self._prof = None
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        fresh = recording or self.report is None or not self._reported
        if fresh:
            self._analyze()
        assert self.report is not None
        self.report["exit_code"] = exit_code
        self.report["steps"]["seen"] = self.boundaries
        self.report["wall_s"] = round(time.perf_counter() - self._t_start, 3)
        if error is not None:
            self.report["error"] = {"type": type(error).__name__, "message": str(error),
                                    "traceback": "".join(traceback.format_exception(error))[-4000:]}
            self.report["notes"].append(f"the script raised {type(error).__name__}: the report covers what "
                                        "was recorded until then")
        self._write_report()
        if self.rank is not None:
            return self._finish_ranked(fresh, exit_code)
        if fresh and self.cfg.print_summary:
            print(summary(self.report))
        elif not fresh:
            print(f"gobrrr doctor: the script ended with exit code {exit_code}; {self.out / 'report.json'} "
                  "has it", file=sys.stderr)
        return self.report

    def _finish_ranked(self, fresh: bool, exit_code: int) -> dict:
        """Under torchrun: every rank has written its exit code; rank 0 merges (again, if the window was
        not merged yet) and puts every rank's exit code into the merged report."""
        if not self.rank.is_main:
            if exit_code:   # torchrun stops the other ranks once this one exits non-zero: let rank 0 finish first
                wait_recorded(self.base_out, self.rank)
            return self.report
        merged = merge_window(self.base_out, self.rank, self.report, self.cfg) if fresh else None
        merged = record_exit(self.base_out, self.rank, self.report, self.cfg, merged)
        if fresh and self.cfg.print_summary:
            print(summary(merged))
        else:
            codes = merged.get("exit_codes") or {}
            print(f"gobrrr doctor: the script ended with exit code {merged.get('exit_code')} "
                  f"(by rank: {', '.join(f'{k}: {v}' for k, v in codes.items())}); "
                  f"{self.base_out / 'report.json'} has it", file=sys.stderr)
        return self.report

    def _complete_steps(self, phase: str = "figures") -> int:
        """Recorded steps of a window (figures or lines) that ran to their end (a script can end or raise inside
        one)."""
        if phase == "lines":
            return max(0, min(self.lead_in + self.cfg.line_steps, self.boundaries - self._line_step0))
        start = self._fig_step0 if self._fig_step0 else (self.warmup if self.warmup >= 1 else 0)
        return max(0, min(self.lead_in + self.cfg.steps, self.boundaries - start))

    def steps_needed(self) -> int:
        """Step boundaries a whole run takes: warmup, the figure steps (lead-in first), the line steps (one step
        between, then a lead-in), one step to settle and the plain ones."""
        n = self.warmup + self.lead_in + self.cfg.steps
        if self.split:
            n += 1 + self.lead_in + self.cfg.line_steps
        return n + (1 + self.cfg.plain_steps if self.cfg.plain_steps else 0)

    def _watch(self) -> None:
        """Start the sync detective for a new recording (it replaces an earlier one's report), when the
        settings ask for it (--detective)."""
        from gobrrr.syncs.watch import watch_syncs

        self._unwatch(keep=False)
        if not self.cfg.settings.detective:
            return
        self._detective = watch_syncs("count")
        self.sync_report = self._detective.__enter__()

    def _unwatch(self, keep: bool = True) -> None:
        if self._detective is not None:
            self._detective.__exit__(None, None, None)
            self._detective = None
        if not keep:
            self.sync_report = None

    def __enter__(self) -> "Session":
        return self.start()

    def __exit__(self, et, ev, tb) -> bool:
        self.finish(exit_code=0 if ev is None else 1, error=ev)
        return False

    # -- outputs ----------------------------------------------------------------------------

    def _analyze(self) -> None:
        self.report = build_report(self)

    def _write_report(self) -> None:
        write_json(self.out / "report.json", self.report)
