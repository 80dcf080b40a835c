"""gobrrr.doctor: `gobrrr doctor script.py` runs a script under the profiler and shows where the GPU waits.

Open session.py first (the recording state machine; api.py has `profile()`, config.py the options), then build.py (a recording
to report.json) and timeline.py (a trace to figures: idle time and its causes). Beside them:
trace.py and sources.py (reading the trace and its Python stacks), host.py (host gaps and who
caused them), compiled.py and compile_watch.py (torch.compile'd code), advice.py (fixes by line,
merged with the lint), overhead.py (what the profiler costs), lines.py (lines from steps
recorded with stacks, carried onto the figure steps), quiet.py (its stderr noise),
report.py (the printed summary), plot.py (timeline.png), cli.py (the command). Under torchrun:
ranks.py (per-rank folders, rank 0's merge), collectives.py (one rank's collectives), merge.py
(waits, the straggler, the layout's promise), plot_ranks.py (the merged timeline). The doctor
observes only: nothing here changes how the user's code runs.
"""
from gobrrr.doctor.api import profile
from gobrrr.doctor.cli import demo_doctor, main, run_script
from gobrrr.doctor.config import DoctorConfig
from gobrrr.doctor.session import Session, active_session, step

__all__ = ["profile", "step", "active_session", "Session", "DoctorConfig", "run_script", "main", "demo_doctor"]
