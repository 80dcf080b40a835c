"""One checkpoint folder layout for every parallel layout: atomic, resumable bit for bit, reshardable.

    ckpt = Checkpointer(out, rank)
    state = ckpt.trainer_state(cfg)              # the checkpoint --resume continues, or None (step 0)
    start = ckpt.load(built, state, data, cfg)   # model, optimizer and RNG states in place; every rank
    ckpt.save(built, step, cfg, data)            # every rank; atomic

    DIR/checkpoints/
      latest                  "step-00000012": readers find a checkpoint through this file only
      step-00000012/
        manifest.json         what is here: the format, the step, the layout that wrote it
        trainer.pt            the trainer's state: step, RNG states, data position, config (torch.save)
        .metadata, *.distcp   the records (torch.distributed.checkpoint): "model/<name>", "optim/<name>/<key>"
      .tmp-step-00000016/     a save in progress, or killed (the next save removes it)

The records are the same for every layout of gobrrr.train.layout: each parameter and Adam moment in
the plain model's shape, each rank writing only its own pieces (gobrrr.parallel.tp.checkpoint,
gobrrr.parallel.zero.checkpoint). So a checkpoint written by one layout loads into any other: DCP's
planner reads each rank exactly the elements it owns, whatever world size, ZeRO stage or tp degree
wrote them. The trainer's state needs the same global batch (gobrrr.train.config.check_resume).

Save (every rank), phase by phase:
  1. each rank checks its own weights are finite (ZeRO: its master shards; # sync: once per
     checkpoint) and rank 0 makes the folder and removes a stale .tmp-step-N; every rank learns both
     answers (gobrrr.comm.agree: one all-reduce). Nothing non-finite is ever written;
  2. dcp.save of the layout's records into .tmp-step-N: every rank writes its own pieces, a
     replicated tensor is written once (DCP's own collectives: a gather of plans and of results);
  3. rank 0 writes trainer.pt and manifest.json into it, renames it to step-N (atomic within one
     filesystem), points `latest` at it (write aside, fsync, rename: gobrrr.train.checkpoint_io) and
     removes the older step folders; every rank learns whether all of that worked (one all-reduce).
A kill at any moment leaves `latest` naming a whole checkpoint: the new one once its rename is done,
the previous one before. A failed write (a full disk) stops every rank with one message, and the
previous checkpoint is untouched.

Load (--resume): `latest`, the manifest's format, trainer.pt (every rank reads the folder: it must
be shared, as torchrun over several nodes needs anyway), then the records the layout asks for,
checked against the checkpoint's metadata first (a missing record or another shape is one line),
then dcp.load. A damaged file (a truncated .distcp) is one line on every rank, not a traceback per
rank. ShardedTensor's deprecation warnings are silenced (gobrrr.parallel.tp.checkpoint.quiet).

Run folders of gobrrr 0.1: checkpoint.pt (a ddp run) is read when resuming without --zero and --tp;
the run's next checkpoint goes to checkpoints/ and checkpoint.pt is removed then. zero_checkpoints/
and tp_latest.pt are refused in one line that says how to go on.

`read(path)` gives a checkpoint to one process as plain tensors, whatever layout wrote it;
`export(path, file)` streams a checkpoint's model records into one plain torch.save file, tensor by
tensor (each read by DCP into a memory-mapped temporary file, so the process holds about one tensor).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from gobrrr.comm.agree import first_error, mark
from gobrrr.parallel.tp.checkpoint import CheckpointFitError, quiet
from gobrrr.train import checks
from gobrrr.train.checkpoint_io import (
    CheckpointError,
    clip,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    write_hint,
    write_text_atomic,
)
from gobrrr.train.checks import TrainError
from gobrrr.train.config import FORMAT
from gobrrr.train.layout import Built, layout_of

CHECKPOINTS, LATEST, MANIFEST, TRAINER = "checkpoints", "latest", "manifest.json", "trainer.pt"
FOLDER_FORMAT = "gobrrr-checkpoint-v2"
LEGACY = "checkpoint.pt"                                 # gobrrr 0.1's ddp checkpoint: read
REFUSED = {"zero_checkpoints": "--zero", "tp_latest.pt": "--tp"}  # gobrrr 0.1's sharded ones: refused


def _cause(e: BaseException) -> tuple[BaseException, str]:
    """The error under DCP's wrapper (the lowest failing rank's) and one clipped line of it."""
    rank = ""
    if isinstance(e, CheckpointException) and e.failures:
        r, (e, _) = min(e.failures.items(), key=lambda kv: kv[0])
        rank = f"rank {r}: "
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return e, f"{rank}{type(e).__name__}" + (f": {clip(lines[0])}" if lines else "")


class Checkpointer:
    """DIR/checkpoints for one run (module docstring); every method that touches records is called on every rank."""

    def __init__(self, out: str | os.PathLike, rank):
        self.out = Path(out)
        self.root = self.out / CHECKPOINTS
        self.main, self.device, self.world = rank.is_main, rank.device, rank.world_size
        self.path: Path | None = None       # the checkpoint being resumed
        self.legacy: dict | None = None     # checkpoint.pt's whole state, when that is what resumes

    def latest(self) -> Path | None:
        """The folder `latest` names, or None when the run has none yet."""
        try:
            name = (self.root / LATEST).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise mark(CheckpointError(f"cannot read {self.root / LATEST}: {e.strerror}; check the disk")) from None
        if not name or not (self.root / name).is_dir():
            raise mark(CheckpointError(f"{self.root / LATEST} names {name!r}, which is not there: the folder was "
                                       "edited or damaged; restore a copy or start the run afresh"))
        return self.root / name

    # ---------------------------------------------------------------- resume

    def trainer_state(self, cfg) -> dict[str, Any] | None:
        """The trainer's state of the checkpoint --resume continues (None: a fresh run); refuses a folder that
        holds a run when --resume is not given, and gobrrr 0.1's sharded checkpoints. Every rank looks, and all
        agree on the answer before any rank writes into the folder (one all-reduce)."""
        state, error = None, None
        try:
            state = self._look(cfg)
        except (TrainError, CheckpointError) as e:
            error = e
        if (error := first_error(error, device=self.device)) is not None:
            raise error
        return state

    def _look(self, cfg) -> dict[str, Any] | None:
        found = self.latest()
        if found is None:
            for name, flag in REFUSED.items():
                if (self.out / name).exists():
                    raise TrainError(f"{self.out} holds a {flag} run written by gobrrr 0.1 ({name}), whose checkpoints "
                                     "this version does not read; finish it with gobrrr 0.1, or start this run in "
                                     "another --out")
        what = found.relative_to(self.out) if found is not None else LEGACY if (self.out / LEGACY).is_file() else None
        if what is None:
            if (self.out / "metrics.jsonl").exists() and not cfg.resume:
                raise TrainError(f"{self.out} already has metrics.jsonl from another run; choose a new --out "
                                 "(or --resume)")
            return None
        if not cfg.resume:
            raise TrainError(f"{self.out} already holds a run ({what}); pass --resume to continue it or choose a "
                             "new --out")
        try:
            if found is None:
                self.legacy = load_checkpoint(self.out / LEGACY)
                return self.legacy
            self._check_manifest(found)
            self.path = found
            return load_checkpoint(found / TRAINER)
        except CheckpointError as e:
            raise mark(e) from None  # every rank read the same file (and agrees in trainer_state)

    def _check_manifest(self, folder: Path) -> None:
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint {folder} has no readable {MANIFEST} ({type(e).__name__}); it is damaged "
                                  "or incomplete; restore a copy or start the run afresh") from None
        if manifest.get("format") != FOLDER_FORMAT:
            raise CheckpointError(f"checkpoint {folder} is in format {manifest.get('format')!r}, not {FOLDER_FORMAT!r};"
                                  " resume it with the gobrrr that wrote it, or start the run afresh")

    def load(self, built: Built, state: dict[str, Any] | None, data, cfg) -> int:
        """Put the checkpoint's model, optimizer and RNG states in place (every rank); return the step to start at."""
        if state is None:
            return 0
        if self.legacy is not None:
            if built.load_whole is None:
                raise TrainError(f"{self.out} holds a run in gobrrr 0.1's layout ({LEGACY}), which loads only without "
                                 f"--zero and --tp; resume it so once: its next checkpoint goes to {CHECKPOINTS}/, "
                                 "which every layout resumes")
            if (problem := checks.misfit(self.out / LEGACY, state, built.raw, built.opt)) is not None:
                raise TrainError(problem)
            built.load_whole(state["model"], state["optimizer"])
        else:
            self._load_records(built)
        set_rng_state(state["rng"], self.device)
        start = state["step"]
        try:
            position = data.check_state(state["data"])
        except ValueError as e:
            raise TrainError(str(e)) from None
        if position != start * cfg.grad_accum:
            raise TrainError(f"checkpoint data position {position} is not step {start} x --grad-accum "
                             f"{cfg.grad_accum}; the checkpoint is inconsistent, start afresh")
        return start

    def _load_records(self, built: Built) -> None:
        path = self.path
        damaged = "it is damaged or incomplete; restore a copy or start the run afresh"
        try:
            saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        except Exception as e:  # the same file on every rank: the same error
            raise mark(CheckpointError(f"checkpoint {path} could not be read ({_cause(e)[1]}); {damaged}")) from None
        try:
            records, after = built.records_to_load(saved)
        except CheckpointFitError as e:
            raise TrainError(f"checkpoint {path}: {e}") from None
        if (problem := checks.records_misfit(path, saved, records)) is not None:
            raise TrainError(problem)
        error = None
        try:
            with quiet():
                dcp.load(records, checkpoint_id=str(path), no_dist=self.world == 1)
        except (Exception, CheckpointException) as e:
            error = CheckpointError(f"checkpoint {path} could not be read ({_cause(e)[1]}); {damaged}")
        if (error := first_error(error, device=self.device)) is not None:
            raise error
        after()

    # ---------------------------------------------------------------- save

    def save(self, built: Built, step: int, cfg, data) -> Path:
        """Write checkpoint `step` atomically (module docstring); every rank calls it. Returns its folder."""
        tmp, final = self.root / f".tmp-step-{step:08d}", self.root / f"step-{step:08d}"
        error = checks.nonfinite_weights(built.weights(), step, cfg)  # never checkpoint NaN/inf
        if error is None and self.main:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(tmp, ignore_errors=True)  # left by a save that was killed
            except OSError as e:
                error = CheckpointError(f"cannot create {self.root}: {e.strerror}; {write_hint(self.out, e)}")
        if (error := first_error(error, device=self.device)) is not None:
            raise error
        state = {"format": FORMAT, "step": step, "rng": rng_state(self.device),
                 "data": data.state_dict(step * cfg.grad_accum), "config": asdict(cfg), "world_size": built.dp_size}
        manifest = {"format": FOLDER_FORMAT, "step": step, "layout": layout_of(cfg.tp, cfg.zero).name,
                    "world_size": self.world, "dp": built.dp_size, "tp": cfg.tp, "zero": cfg.zero,
                    "records": "model/<name>, optim/<name>/<key> in the plain model's shapes (DCP)",
                    "trainer": TRAINER}
        try:
            with quiet():  # one process: no collectives at all
                dcp.save(built.records(), checkpoint_id=str(tmp), no_dist=self.world == 1)
            if self.main:
                self._publish(tmp, final, state, manifest)
        except (Exception, CheckpointException) as e:
            inner, why = _cause(e)
            error = e if isinstance(e, CheckpointError) else CheckpointError(
                f"could not write checkpoint {final} ({why}); the previous checkpoint (if any) is untouched; "
                f"{write_hint(self.root, inner)}")
        if (error := first_error(error, device=self.device)) is not None:
            raise error
        return final

    def _publish(self, tmp: Path, final: Path, state: dict, manifest: dict) -> None:
        """Rank 0, after every rank's records are on disk: trainer.pt, manifest, rename, `latest`, tidy."""
        save_checkpoint(state, tmp / TRAINER)
        write_text_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        if final.exists():  # a folder a kill left between its rename and `latest`: never the one `latest` names
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_text_atomic(self.root / LATEST, final.name + "\n")  # the switch
        for old in self.root.iterdir():
            if old.name != final.name and old.name.startswith(("step-", ".tmp-step-")):
                shutil.rmtree(old, ignore_errors=True)
        (self.out / LEGACY).unlink(missing_ok=True)  # a run of gobrrr 0.1 now lives in checkpoints/


def step_folder(path: str | os.PathLike) -> Path:
    """A checkpoint folder from a run folder (its latest), a checkpoints/ folder, or a step folder itself."""
    path = Path(path)
    for root in (path / CHECKPOINTS, path):
        if (root / LATEST).is_file():
            return root / (root / LATEST).read_text().strip()
    return path


def export(path: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    """Stream a checkpoint's model records (`path`: a run folder, or a step folder) into one plain torch.save file
    of {parameter name: tensor}, tensor by tensor."""
    folder = step_folder(path)
    meta = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    out_file = Path(out_file)
    scratch = Path(tempfile.mkdtemp(prefix=".export-", dir=out_file.parent))
    try:
        tensors = {}
        for i, (k, m) in enumerate(meta.items()):
            if not k.startswith("model/") or not hasattr(m, "size"):
                continue
            backing = scratch / f"{i}.bin"
            t = torch.from_file(str(backing), shared=True, size=int(torch.Size(m.size).numel()),
                                dtype=m.properties.dtype).view(m.size)  # memory-mapped, not resident
            with quiet():
                dcp.load({k: t}, checkpoint_id=str(folder), no_dist=True)  # DCP reads only this tensor's pieces
            tensors[k[len("model/"):]] = t
        save_checkpoint(tensors, out_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_file


def read(path: str | os.PathLike) -> dict[str, Any]:
    """One process, no group: a checkpoint (`path`: a run folder, or a step folder) as {"trainer": the trainer's
    state, "manifest": ..., "model": {name: tensor}, "optim": {name: {key: tensor}}}, tensors in the plain
    model's shapes, on the CPU, whatever layout wrote them."""
    folder = step_folder(path)
    meta = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if hasattr(m, "size")}
    with quiet():
        dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        if k.startswith("optim/"):
            name, key = k[len("optim/"):].rsplit("/", 1)
            optim.setdefault(name, {})[key] = v
    return {"trainer": load_checkpoint(folder / TRAINER), "manifest": json.loads((folder / MANIFEST).read_text()),
            "model": {k[len("model/"):]: v for k, v in state.items() if k.startswith("model/")}, "optim": optim}
