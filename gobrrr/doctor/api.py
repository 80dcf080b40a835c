"""`gobrrr.doctor.profile`: the doctor from Python, around a step function or a block whose steps you mark."""
from __future__ import annotations

from gobrrr.doctor.config import DoctorConfig
from gobrrr.doctor.overhead import ProfilerSettings
from gobrrr.doctor.session import Session


def profile(fn=None, *, steps: int = 5, warmup: int = 3, out_dir: str = "gobrrr-doctor",
            window_s: float = 10.0, print_summary: bool = True, plain_steps: int = 5,
            settings: ProfilerSettings | None = None, line_steps: int = 3):
    """Profile a function called once per step, or (without `fn`) a block whose steps you mark.

        report = gobrrr.doctor.profile(train_step, steps=5)    # train_step() runs Session.steps_needed() times
        with gobrrr.doctor.profile(steps=5) as doc:            # or mark steps yourself
            for batch in loader: train_step(batch); gobrrr.doctor.step()
        doc.report["gpu"]["compute_idle_pct"], doc.report["overhead"]["ratio"]

    The figures come from `steps` steps without Python stacks, the lines from `line_steps` more with them
    (lines.py; 0: one window with stacks). In a process started by torchrun, each rank writes OUT/rank-N/ and
    rank 0 the merged report.
    """
    cfg = DoctorConfig(steps=steps, warmup=warmup, out_dir=out_dir, window_s=window_s,
                       print_summary=print_summary, plain_steps=plain_steps, line_steps=line_steps,
                       settings=settings if settings is not None else ProfilerSettings())
    if fn is None:
        return Session(cfg, auto_steps=True)
    session = Session(cfg, auto_steps=False)
    session.start()
    try:
        for _ in range(session.steps_needed()):  # the warmup, the figure steps, the line steps, the plain ones
            fn()
            session.step(manual=True)
    except BaseException as e:
        session.finish(exit_code=1, error=e)
        raise
    return session.finish(exit_code=0)
