"""What a doctor run records: `DoctorConfig` (the command's options as one dataclass)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gobrrr.doctor.overhead import ProfilerSettings


@dataclass
class DoctorConfig:
    steps: int = 5              # steps recorded (in the figures)
    lead_in: int = 1            # recorded steps before them, left out of the figures: the profiler starting up
    line_steps: int = 3         # steps recorded with Python stacks after them, for the lines (0: stacks in the figure steps)
    warmup: int = 3             # steps run before recording starts (the last one warms the profiler up)
    out_dir: str = "gobrrr-doctor"
    window_s: float = 10.0      # time window when the script never steps
    draw_steps: int = 3         # steps drawn in timeline.png
    print_summary: bool = True
    source_roots: list[str] = field(default_factory=list)
    plain_steps: int = 5        # steps timed without the profiler after the recording (0: none)
    settings: ProfilerSettings = field(default_factory=ProfilerSettings)
    user_paths: list[str] = field(default_factory=list)  # files that count as the user's inside a library
    rank_wait_s: float = 120.0  # rank 0 waits this long for the other ranks' reports

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {self.steps}; pass a positive number of steps")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be 0 or more, got {self.warmup}; pass 0 to record from the start")
        if self.plain_steps < 0:
            raise ValueError(f"--plain-steps must be 0 or more, got {self.plain_steps}; pass 0 to skip them")
        if self.line_steps < 0:
            raise ValueError(f"--line-steps must be 0 or more, got {self.line_steps}; pass 0 to record the stacks "
                             "in the figure steps")
        if self.lead_in < 0:
            raise ValueError(f"lead_in must be 0 or more, got {self.lead_in}")
