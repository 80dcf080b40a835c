"""What `gobrrr lint` reports: the rules GB001-GB014 as the user reads them, and one finding.

    RULES       rule -> (message, fix), each with {what} / {where} filled in where the rule fires
    SYNC_RULES  the rules whose finding is a host-device sync (a line marked `# sync: why` is exempt)
    TITLES      rule -> one line, for `gobrrr lint --help` and the text report
    Finding     where (path, line, column), which rule, the message and fix, whether it runs every step
                (`hot`), and the calls that made it hot (`chain`)

The rules themselves are applied by rules.Checker and its mixins (sync, moves, inside, env).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

RULES = {
    "GB001": ("tensor built on the host, then copied to the device: an extra host allocation and a "
              "blocking host-to-device copy",
              "create it on the device (device=... for torch.zeros/randn/arange/full...); for host data, build it "
              "pinned and copy with non_blocking=True, or keep the value on the device"),
    "GB002": ("{what} inside a loop makes the host wait for the GPU every iteration",
              "keep the value on the device (accumulate into a tensor) and read it once after the loop or every N steps"),
    "GB003": ("{what} a tensor inside a loop copies it to the host and waits for the GPU every iteration",
              "log a detached value every N steps (if step % N == 0) or after the loop"),
    "GB004": ("{what} inside a loop stalls the host until the GPU drains, every iteration",
              "order work with events: event.record() then stream.wait_event(event); poll with event.query()"),
    "GB005": ("non_blocking=True from pageable host memory is not asynchronous: CUDA stages the copy and "
              "the host waits", "pin the source: .pin_memory(), DataLoader(pin_memory=True) or gobrrr.Prefetcher; "
              "an op on a pinned tensor (.to(dtype), .float()) returns pageable memory: convert on the device"),
    "GB006": ("DataLoader without pin_memory=True whose batches go to CUDA: every copy is a slow, blocking "
              "copy from pageable memory",
              "pass pin_memory=True and copy with non_blocking=True, or wrap it in gobrrr.Prefetcher"),
    "GB007": ("a tensor used as a Python condition{where} waits for the GPU to decide the branch",
              "keep the decision on the device: torch.where(cond, a, b) or masking; check on the host every N steps"),
    "GB008": ("{what} inside a loop has a data-dependent output shape: the host waits for the GPU to learn the size",
              "use fixed-shape ops: torch.where(mask, x, 0), masked_fill, or nonzero_static / bincount with a known size"),
    "GB009": ("blocking host-to-device copy of per-step data (`{what}` without non_blocking=True): the host "
              "waits for the copy and the GPU for the host, each step",
              "DataLoader(pin_memory=True) and .to(device, non_blocking=True), or wrap the loader in "
              "gobrrr.Prefetcher(loader, device=device), which copies the next batch during this step"),
    "GB010": ("host data copied to the device inside the loop (`{what}`): a blocking copy from pageable "
              "memory that waits for the GPU to drain, every iteration",
              "build it on the device once, before the loop (a lookup table, a constant), or compute it on the "
              "device; for data that must come from the host, pin it and copy with non_blocking=True"),
    "GB011": ("a device tensor indexed by host indices (`{what}`): the index is copied to the device, "
              "blocking, every iteration",
              "make the indices on the device (torch.randperm(n, device=dev), torch.arange(..., device=dev)) "
              "or move them once before the loop"),
    "GB012": ("{what} every step: each rank waits for the slowest and for its GPU to drain",
              "drop it from the step (collectives already order the ranks); keep barriers for set-up, "
              "checkpoints and the end of the run"),
    "GB013": ("{what}: torch syncs inside the call, every iteration", "{fix}"),
    "GB014": ("a CPU environment stepped every iteration (`{what}(...)`): the action is read back to the host "
              "and the observation copied to the device each step{where}",
              "run the environment on the GPU (Isaac Lab, Brax/MJX, ManiSkill, a torch simulator) so actions and "
              "observations stay on the device, or step more environments per call (gym.vector, envpool) so "
              "each round trip carries more work"),
}
SYNC_RULES = {"GB002", "GB003", "GB004", "GB007", "GB008", "GB010", "GB011", "GB012", "GB013", "GB014"}
TITLES = {"GB001": "a tensor built on the host, then moved to the device", "GB002": ".item() / .cpu() / .tolist() / float(t)",
          "GB003": "printing or formatting a tensor", "GB004": "torch.cuda / stream / event synchronize()",
          "GB005": "non_blocking=True from pageable memory", "GB006": "a DataLoader without pin_memory feeding the GPU",
          "GB007": "a tensor as a Python condition (if, while, assert)",
          "GB008": "data-dependent shapes (nonzero, x[mask], unique)",
          "GB009": "a blocking .to(device) / .cuda() of every batch",
          "GB010": "host data copied to the device per step (torch.tensor(x, device=), host.to(dev))",
          "GB011": "a device tensor indexed by host indices (numpy, CPU arange, range, list)",
          "GB012": "a barrier every step (dist.barrier, wait_for_everyone)",
          "GB013": "a sync inside torch (distributions' validation, torch.normal's and Normal.sample's std check)",
          "GB014": "a CPU environment stepped per iteration (one finding per loop)"}


@dataclass
class Finding:
    path: str
    line: int
    col: int      # 1-based, like compilers and editors
    rule: str
    message: str
    fix: str
    hot: bool = True   # in a step loop or what it calls (shown by default); else shown with --all
    chain: list[str] = field(default_factory=list)   # the calls that make it hot: ['train.py:120', 'utils.py:44']
    covers: list[int] = field(default_factory=list)  # other lines this one finding stands for (GB014's round trip)
    covers_at: list[str] = field(default_factory=list)   # ... in the project's functions the loop calls: 'agent.py:60'

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        via = f" ({' -> '.join([*self.chain, 'here'])})" if self.chain else ""
        return f"{self.path}:{self.line}:{self.col}: {self.rule} {self.message}{via}" + \
            ("" if self.hot else " [not per-step]")


__all__ = ["RULES", "SYNC_RULES", "TITLES", "Finding"]
