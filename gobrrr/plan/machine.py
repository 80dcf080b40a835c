"""The machine a plan runs on: peak FLOP/s, HBM and link bandwidths, MFU, each with where it came from.

Measured figures win over defaults. `machine(...)` reads the latest records of this GPU model
(the `device` field contains --gpu, e.g. "H200") from bench/results/*.jsonl and $GOBRRR_BENCH_RESULTS
(both), or only from --records DIR:

  comm.jsonl  (`gobrrr bench comm`, world size >= 2): per op, the bus bandwidth of the largest size
              measured, and the smallest size's time per call as the latency. A record whose world
              size fits on one host (`gpus` >= world size) describes NVLink inside a node; one larger
              than its host describes the network between nodes. World size 1 records say nothing
              about links (their busbw is 0) and are skipped.
  p2p.jsonl   (`gobrrr bench p2p`): with 2+ GPUs and peer access, the slowest pair's copy bandwidth
              stands in for the intra-node bus bandwidth when there is no comm record; with one GPU,
              its device-to-device read+write bandwidth is the HBM bandwidth the optimizer step uses.
  train.jsonl (`gobrrr bench train`): the "gobrrr" row's MFU (gobrrr train's step), for the same model,
              at the planned micro-batch when measured (else the largest); else
  ddp.jsonl   (`gobrrr bench ddp`): the "plain" row's MFU (an eager loop), for the same model.

Defaults (named in the table when used): NVLink 4 (H100/H200 SXM) 360 GB/s all-reduce bus bandwidth,
80% of its 450 GB/s per direction, the range nccl-tests reports on 8-GPU NVSwitch hosts;
InfiniBand NDR 400 Gb/s per GPU, 40 GB/s bus bandwidth (80% of 50 GB/s); latency 20 us per
collective inside a node, 40 us across nodes; MFU 40% (dense transformer training with a tuned
stack; the eager 124m measures about 32% on an H200).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# THE table of GPUs (train's MFU, plan's machines and the benches' MFU all read it), from the vendors'
# datasheets: name -> (dense bf16 tensor-core peak FLOP/s without 2:4 sparsity, HBM bytes/s, memory GB,
# GPU-to-GPU GB/s per direction: NVLink, or PCIe where the part has none). The first name contained in
# torch.cuda.get_device_name() wins, so "H100 PCIe" comes before "H100" (SXM).
GPUS = {
    "H200": (989e12, 4.8e12, 141, 450),
    "H100 PCIe": (756e12, 2.0e12, 80, 64),
    "H100": (989e12, 3.35e12, 80, 450),
    "A100": (312e12, 2.0e12, 80, 300),
    "L40S": (362e12, 0.864e12, 48, 32),
    "A10G": (70e12, 0.6e12, 24, 32),
}
DEFAULT_MFU = 0.40
NET_GBS = 40.0            # InfiniBand NDR, bus bandwidth per GPU
LINK_EFFICIENCY = 0.80    # achieved bus bandwidth / per-direction link peak
HBM_EFFICIENCY = 0.85     # achieved streaming bandwidth / datasheet
REPO_RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


@dataclass(frozen=True)
class Link:
    busbw_Bps: float   # bytes/s of bus bandwidth (nccl-tests' busbw)
    latency_s: float   # fixed cost per collective
    source: str


@dataclass(frozen=True)
class Machine:
    gpu: str
    mem_bytes: float
    gpus_per_node: int
    peak_flops: float
    hbm_Bps: float
    mfu: float
    intra: Link
    inter: Link
    sources: dict[str, str] = field(default_factory=dict)  # peak, hbm, mfu -> where from


def results_dirs(records: str | os.PathLike | None = None) -> list[Path]:
    if records:
        return [Path(records)]
    env = os.environ.get("GOBRRR_BENCH_RESULTS")  # where benchmarks write now (e.g. $OUT); the repo's too
    repo = REPO_RESULTS
    return [Path(env), repo] if env and Path(env).resolve() != repo.resolve() else [repo]


def read_records(name: str, gpu: str, dirs: list[Path]) -> list[dict]:
    """Records of `name`.jsonl whose device names `gpu`, oldest first (malformed lines skipped)."""
    out = []
    for d in dirs:
        path = d / f"{name}.jsonl"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and gpu.lower() in str(rec.get("device", "")).lower():
                out.append(rec)
    return sorted(out, key=lambda r: str(r.get("time", "")))


def comm_link(records: list[dict], inter: bool) -> Link | None:
    """The latest multi-rank comm record of that kind (intra- or inter-node) as a Link, or None."""
    for rec in reversed(records):
        n = int(rec.get("world_size") or 1)
        if n < 2 or (n > int(rec.get("gpus") or n)) != inter:
            continue
        rows = [r for r in rec.get("rows", []) if r.get("op") == "all_reduce" and r.get("busbw")]
        if not rows:
            rows = [r for r in rec.get("rows", []) if r.get("busbw")]
        if not rows:
            continue
        big = max(rows, key=lambda r: r["size"])
        small = min(rows, key=lambda r: r["size"])
        where = "between nodes" if inter else "in a node"
        return Link(big["busbw"] * 1e9, small["time_us"] * 1e-6,
                    f"bench comm {rec.get('time', '?')[:10]}, {n} ranks {where}: {big['op']} busbw "
                    f"{big['busbw']:.0f} GB/s at {big['size'] / 2**20:.0f} MiB")
    return None


def measured_mfu(gpu: str, dirs: list[Path], model: str | None, micro_batch: int | None,
                 prefer: tuple[str, ...] = ("train", "ddp")) -> tuple[float, str] | None:
    """(MFU, its source) from the latest record of the same model, in the order of `prefer`:
    `bench train`'s "gobrrr" row (gobrrr train's own step; the row at this micro-batch, else the
    largest), or `bench ddp`'s "plain" row (an eager loop). None when no record fits."""
    if not model:
        return None
    wanted = {"train": "gobrrr", "ddp": "plain"}
    for bench in prefer:
        for rec in reversed(read_records(bench, gpu, dirs)):
            if rec.get("config", {}).get("model") != model:
                continue
            rows = [r for r in rec.get("rows", []) if r.get("variant") == wanted[bench] and r.get("mfu")]
            if not rows:
                continue
            row = next((r for r in rows if r.get("B") == micro_batch), max(rows, key=lambda r: r.get("B") or 0))
            b = row.get("B") or rec["config"].get("batch_size")
            return row["mfu"], f"bench {bench} {rec.get('time', '?')[:10]}: {model} {wanted[bench]} step, batch {b}, " \
                               f"{row['mfu']:.1%}"
    return None


def gpu_key(name: str) -> str | None:
    """The GPUS row for a device name ("NVIDIA H200", "h100"), or None."""
    return next((k for k in GPUS if k.lower() in name.lower()), None)


def env_peak_flops() -> float | None:
    """GOBRRR_PEAK_FLOPS (FLOP/s, e.g. 2.25e15), which overrides the table's peak everywhere; None when unset."""
    env = os.environ.get("GOBRRR_PEAK_FLOPS")
    if not env:
        return None
    try:
        value = float(env)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"GOBRRR_PEAK_FLOPS={env!r} is not a positive number of FLOP/s; set it like 2.25e15, or unset it")
    return value


def peak_flops(device) -> tuple[float | None, str]:
    """(dense bf16 peak FLOP/s, where it comes from) of a torch device; (None, why) when unknown (e.g. a CPU).
    GOBRRR_PEAK_FLOPS overrides, for a GPU the table does not know."""
    env = env_peak_flops()
    if env is not None:
        return env, "GOBRRR_PEAK_FLOPS"
    if getattr(device, "type", device) != "cuda":
        return None, "no peak for a CPU"
    import torch

    name = torch.cuda.get_device_name(device)
    key = gpu_key(name)
    if key is None:
        return None, f"no peak known for {name}; set GOBRRR_PEAK_FLOPS"
    return GPUS[key][0], f"{key} dense bf16"


def machine(gpu: str = "H200", mem_gb: float | None = None, gpus_per_node: int = 8, mfu: float | None = None,
            model: str | None = None, records: str | os.PathLike | None = None, micro_batch: int | None = None,
            prefer: tuple[str, ...] = ("train", "ddp")) -> Machine:
    """The Machine for --gpu, with measured records where they exist (module docstring)."""
    if gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    key = gpu_key(gpu)
    if key is None:
        raise ValueError(f"unknown GPU {gpu!r}; choose the closest of {', '.join(GPUS)} "
                         "(--gpu-mem sets its memory, GOBRRR_PEAK_FLOPS its peak FLOP/s)")
    peak, hbm, mem, nvlink = GPUS[key]
    dirs = results_dirs(records)
    sources = {"peak": f"{key} dense bf16 datasheet {peak / 1e12:.0f} TFLOP/s"}
    env = env_peak_flops()
    if env is not None:
        peak, sources["peak"] = env, f"GOBRRR_PEAK_FLOPS {env / 1e12:.0f} TFLOP/s"

    p2p = read_records("p2p", key, dirs)
    hbm_Bps, sources["hbm"] = hbm * HBM_EFFICIENCY, f"default: {HBM_EFFICIENCY:.0%} of {hbm / 1e12:.2f} TB/s datasheet"
    for rec in reversed(p2p):
        fig = rec.get("figures", {})
        if fig.get("d2d_read_write_GBs"):
            hbm_Bps = fig["d2d_read_write_GBs"] * 1e9
            sources["hbm"] = f"bench p2p {rec.get('time', '?')[:10]}: d2d read+write {hbm_Bps / 1e12:.2f} TB/s"
            break

    comms = read_records("comm", key, dirs)
    intra = comm_link(comms, inter=False)
    if intra is None:
        pairs = [r for rec in reversed(p2p) if (rec.get("figures", {}).get("gpus") or 0) >= 2
                 for r in [rec] if any(x.get("peer_access") == "yes" for x in rec.get("rows", []))]
        if pairs:
            rec = pairs[0]
            gbs = min(x["GBs"] for x in rec["rows"] if x.get("peer_access") == "yes")
            intra = Link(gbs * 1e9, 20e-6, f"bench p2p {rec.get('time', '?')[:10]}: slowest peer pair {gbs:.0f} GB/s")
        else:
            intra = Link(nvlink * LINK_EFFICIENCY * 1e9, 20e-6,
                         f"default NVLink: {LINK_EFFICIENCY:.0%} of {nvlink} GB/s per direction")
    inter = comm_link(comms, inter=True) or Link(NET_GBS * 1e9, 40e-6,
                                                 f"default InfiniBand NDR 400 Gb/s per GPU: {NET_GBS:.0f} GB/s")

    if mfu is not None:
        if not 0 < mfu <= 1:
            raise ValueError(f"--mfu {mfu} must be in (0, 1]")
        sources["mfu"] = f"--mfu {mfu:.0%}"
    else:
        found = measured_mfu(key, dirs, model, micro_batch, prefer)
        mfu, sources["mfu"] = found if found else (DEFAULT_MFU, f"default {DEFAULT_MFU:.0%}")
    return Machine(gpu=key, mem_bytes=(mem_gb if mem_gb is not None else mem) * 1e9, gpus_per_node=gpus_per_node,
                   peak_flops=peak, hbm_Bps=hbm_Bps, mfu=mfu, intra=intra, inter=inter, sources=sources)
