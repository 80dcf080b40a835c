"""`gobrrr doctor` under torchrun: which rank this is, where it writes, and rank 0's merged report.

    torchrun --nproc-per-node 4 -m gobrrr doctor --out d train.py      # d/rank-0/ ... d/rank-3/, d/report.json

Every rank runs the script under its own doctor session, finds the same step boundaries (the same
program steps its optimizer the same number of times) and so records the same steps into
OUT/rank-N/ (report.json, trace.json, timeline.png, comm.json: its collectives). Nothing goes through
the script's process group: the doctor never issues a collective, so it cannot reorder or block the
script's. The ranks meet in the file system instead (one host, or a folder every node sees):

1. each rank writes its files atomically (a temporary file, then a rename) when its window closes;
2. rank 0, after its own, waits up to `rank_wait_s` for every rank's report of the same run (the torchrun
   run id and rendezvous endpoint must match: a folder reused by an earlier run is not read), then writes
   OUT/report.json (its own report plus a `ranks` section: merge.py) and OUT/timeline.png (a lane group
   per rank: plot_ranks.py), and prints the one summary; the other ranks print nothing;
3. at the end every rank writes its exit code into its report; rank 0 waits a little for them and puts
   all of them into OUT/report.json (`exit_codes`; `exit_code` is the first non-zero, else 0). A rank that
   ends with a non-zero code waits (up to FAILED_WAIT_S) for that merged report to hold its code before it
   leaves: torchrun stops every other rank as soon as one fails, and rank 0 may still be drawing.

A rank that never reports (it died, or steps differently) is named as missing after the wait; the merge
covers the others.
"""
from __future__ import annotations

import copy
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

EXIT_WAIT_S = 15.0  # at the end, how long rank 0 waits for the other ranks' exit codes
FAILED_WAIT_S = 60.0  # how long a failing rank waits for rank 0 to record its exit code before leaving


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    run_key: str        # the same on every rank of one torchrun launch
    hostname: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def out_dir(self, base: Path) -> Path:
        return Path(base) / f"rank-{self.rank}"

    def to_dict(self) -> dict:
        return asdict(self)


def rank_from_env(env=None) -> RankInfo | None:
    """The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK) as a RankInfo; None for one process."""
    env = os.environ if env is None else env
    try:
        world, rank = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        return None
    if world <= 1 or not 0 <= rank < world:
        return None
    key = ":".join(env.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                            "TORCHELASTIC_RESTART_COUNT", "WORLD_SIZE"))
    return RankInfo(rank, world, local, key, socket.gethostname())


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(base: Path, me: RankInfo, timeout_s: float, *, need_exit: bool = False) -> dict[int, tuple[dict, dict]]:
    """rank -> (report, comm data) for every rank of this run that reported within `timeout_s`."""
    got: dict[int, tuple[dict, dict]] = {}
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        for r in range(me.world_size):
            if r in got:
                continue
            d = me.out_dir(base).parent / f"rank-{r}"
            report, comm = _read(d / "report.json"), _read(d / "comm.json")
            if not report or comm is None or (report.get("rank") or {}).get("run_key") != me.run_key:
                continue
            if need_exit and report.get("exit_code") is None:
                continue
            got[r] = (report, comm.get("comm") or {})
        if len(got) == me.world_size or time.monotonic() >= deadline:
            return got
        time.sleep(0.1)


def wait_recorded(base: Path, me: RankInfo, timeout_s: float = FAILED_WAIT_S) -> bool:
    """A rank other than 0 that is about to fail: wait until rank 0's merged report of this run holds this
    rank's exit code (record_exit wrote it), so that torchrun, stopping the others when this rank exits
    non-zero, cannot cut rank 0's merge short. True if it did within `timeout_s`."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        merged = _read(Path(base) / "report.json") or {}
        if (merged.get("rank") or {}).get("run_key") == me.run_key \
                and (merged.get("exit_codes") or {}).get(str(me.rank)) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def merge_window(base: Path, me: RankInfo, own: dict, cfg) -> dict:
    """Rank 0: wait for the other ranks' reports of this window, write and return the merged report."""
    from gobrrr.doctor.files import write_json
    from gobrrr.doctor.merge import layout, waits

    base = Path(base)
    got = collect(base, me, cfg.rank_wait_s)
    own_comm = _read(me.out_dir(base) / "comm.json") or {}
    got[me.rank] = (own, own_comm.get("comm") or {})
    merged = copy.deepcopy(own)
    comms = {r: c for r, (_, c) in sorted(got.items()) if c}
    w = waits(comms) if len(comms) >= 2 else {"per_rank": {}, "straggler": None, "clock_offsets_us": {},
                                              "point_wait": {}}
    missing = [r for r in range(me.world_size) if r not in got]
    per_rank = []
    for r, (rep, c) in sorted(got.items()):
        over, gpu = rep.get("overhead") or {}, rep.get("gpu") or {}
        row = {"rank": r, "dir": str(me.out_dir(base).parent / f"rank-{r}"),
               "recorded_ms": over.get("recorded_ms"), "plain_ms": over.get("plain_ms"),
               "ratio": over.get("ratio"), "compute_idle_pct": gpu.get("compute_idle_pct"),
               "comm_ms_per_step": c.get("comm_ms_per_step"), "exposed_ms_per_step": c.get("exposed_ms_per_step"),
               "kinds": c.get("kinds", {}), "exit_code": rep.get("exit_code")}
        row.update(w["per_rank"].get(r, {}))
        med = row["recorded_ms"]
        if med and row.get("wait_total_ms_per_step") is not None:
            row["wait_pct"] = round(100.0 * row["wait_total_ms_per_step"] / med, 2)
        per_rank.append(row)
    merged["ranks"] = {"world_size": me.world_size, "reported": sorted(got), "missing": missing,
                       "per_rank": per_rank, "straggler": w["straggler"],
                       "layout": layout(own_comm.get("comm") or {}, w["point_wait"].get(me.rank)),
                       "clock_offsets_us": w["clock_offsets_us"]}
    if missing:
        merged["notes"].append(f"rank(s) {', '.join(map(str, missing))} wrote no report within {cfg.rank_wait_s:g} s "
                               "(a rank died, or it steps differently): the merge covers the others")
    st = w["straggler"]
    if st is not None:
        merged["advice"].insert(0, straggler_advice(st))
    merged["files"] = {"report": str(base / "report.json"),
                       "timeline": str(base / "timeline.png"), "ranks": [row["dir"] for row in per_rank]}
    try:
        from gobrrr.doctor.plot_ranks import plot_ranks

        title = f"gobrrr doctor: {Path(own.get('script') or 'profile').name}, {me.world_size} ranks"
        plot_ranks(comms, base / "timeline.png", title=title, straggler=st, offsets=w["clock_offsets_us"])
    except Exception as e:  # a drawing failure must not lose the figures
        merged["files"]["timeline"] = None
        merged["notes"].append(f"the merged timeline.png was not drawn: {type(e).__name__}: {e}")
    write_json(base / "report.json", merged)
    return merged


def straggler_advice(st: dict) -> dict:
    """The straggler as the merged report's first recommendation: its line, and what it costs the others."""
    waited = ", ".join(f"rank {r} {ms:.1f}" for r, ms in sorted(st["others_wait_ms_per_step"].items()))
    where = st["site"] or "(no line of its own stood out: its GPU work or the data it got?)"
    return {"change": f"rank {st['rank']} arrives late at {st['at']}: make its step match the others' (move "
                      "rank-specific work such as logging, evaluation or checkpoints off the step, balance its "
                      "data, or overlap it)",
            "site": st["site"], "code": st["code"],
            "why": f"rank {st['rank']} arrived last at {st['late_at']} collective(s) "
                   f"({', '.join(f'{k} x{v}' for k, v in st['kinds'].items())}), up to {st.get('max_late_ms', 0):.1f} ms "
                   f"late; {where} took "
                   f"{st['excess_ms_per_step'] or 0:.1f} ms/step more than on the others; the others waited "
                   f"(ms/step): {waited}",
            "saved_ms": max(st["others_wait_ms_per_step"].values(), default=0.0), "source": "ranks", "rules": []}


def record_exit(base: Path, me: RankInfo, own: dict, cfg, merged: dict | None) -> dict:
    """Rank 0 at the end: every rank's exit code into the merged report (after a short wait for them)."""
    from gobrrr.doctor.files import write_json

    base = Path(base)
    if merged is None:
        merged = _read(base / "report.json") or copy.deepcopy(own)
    got = collect(base, me, min(EXIT_WAIT_S, cfg.rank_wait_s), need_exit=True)
    codes = {r: rep.get("exit_code") for r, (rep, _) in sorted(got.items())}
    codes[me.rank] = own.get("exit_code")
    codes = {str(r): codes.get(r) for r in range(me.world_size)}
    merged["exit_codes"] = codes
    nonzero = [c for c in codes.values() if c not in (0, None)]
    merged["exit_code"] = nonzero[0] if nonzero else (0 if None not in codes.values() else None)
    merged["wall_s"] = own.get("wall_s")
    for row in (merged.get("ranks") or {}).get("per_rank", []):
        row["exit_code"] = codes.get(str(row["rank"]))
    unknown = [r for r, c in codes.items() if c is None]
    if unknown:
        merged["notes"].append(f"no exit code from rank(s) {', '.join(unknown)} within {EXIT_WAIT_S:g} s of rank 0's")
    write_json(base / "report.json", merged)
    return merged
