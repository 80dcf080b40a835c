"""Files that survive a kill at any moment: write aside, fsync, rename, fsync the folder.

    save_checkpoint(state, step_dir / "trainer.pt")   # atomic: the old file or the new one, never half
    state = load_checkpoint(step_dir / "trainer.pt")  # torch.load(weights_only=True): no code runs
    write_text_atomic(out / "checkpoints" / "latest", "step-00000100\n")

The write, step by step, and what each step buys:
  1. `torch.save` into a temporary file *in the same folder* (a rename is only atomic within
     one filesystem); its name starts with "." and ends in ".tmp", so nothing mistakes it for
     a checkpoint;
  2. flush and `fsync` the file: its bytes are on the disk, not in the page cache;
  3. `os.replace` onto the final name: readers see the old checkpoint or the new one, never a
     mix (POSIX rename atomicity);
  4. `fsync` the folder: the rename itself is durable, so a power cut cannot bring back the
     old name pointing at nothing.
A kill between any two of these leaves the previous checkpoint in place and, at worst, a stale
temporary file, which the next save removes. A write error (disk full, quota, file-size limit,
I/O error) removes the temporary file and raises `CheckpointError`; the previous checkpoint is
untouched. torch.save reports a failed write as a RuntimeError from its zip writer ("unexpected
pos ..."), not as an OSError, so both are caught, and the hint comes from the folder's free space
and this process's file-size limit.

Loading refuses anything `weights_only=True` refuses (a pickle that would run code) and says the
file is not ours; it never suggests `weights_only=False` for a file gobrrr did not write.

What goes in a training checkpoint, and in which folder, is gobrrr.train.checkpoints' business; this
module only adds `rng_state()` / `set_rng_state()` for the generators every trainer needs, in a form
`weights_only=True` can load (tensors, numbers, strings, lists, tuples, dicts). Messages quote torch's
own text at most one line and about 200 characters long, cut between words (`clip`).
"""
from __future__ import annotations

import errno
import os
import pickle
import random
import resource
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

TMP_SUFFIX = ".tmp"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which file and what to do."""


def _tmp_prefix(path: Path) -> str:
    return f".{path.name}."


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # e.g. a platform without directory fds: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; atomicity does not depend on it
    finally:
        os.close(fd)


def stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Temporary files left next to `path` by saves that were killed mid-write."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    prefix = _tmp_prefix(path)
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(prefix) and p.name.endswith(TMP_SUFFIX))


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write `state` to `path` atomically (see the module docstring); return the path."""
    path = Path(path)
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"cannot create the checkpoint folder {folder}: {e.strerror}; "
                              "choose an --out folder you can write to") from e
    for stale in stale_temporaries(path):  # left by an earlier save that was killed mid-write
        stale.unlink(missing_ok=True)
    tmp = folder / f"{_tmp_prefix(path)}{os.getpid()}{TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) or (isinstance(e, RuntimeError) and _is_write_failure(e)):
            what = e.strerror if isinstance(e, OSError) and e.strerror else _first_line(e)
            raise CheckpointError(f"could not write checkpoint {path} ({what}); the previous checkpoint "
                                  f"(if any) is untouched; {write_hint(folder, e)}") from e
        raise
    _fsync_dir(folder)
    return path


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True` (tensors and plain containers only, no code runs)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; start without --resume, or point --out at the "
                              "folder of the run you want to continue")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        # torch's text suggests weights_only=False: never pass that on for a file we did not write (it runs code)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip() and "weights_only" not in ln]
        if isinstance(e, pickle.UnpicklingError) and any("GLOBAL" in ln for ln in lines):
            why = next(ln for ln in lines if "GLOBAL" in ln)
            raise CheckpointError(f"checkpoint {path} holds more than tensors and plain containers ({clip(why)}); "
                                  "gobrrr never writes such a file, so do not load it: restore your own copy "
                                  "or start the run afresh") from None
        why = clip(lines[0] if lines else type(e).__name__)
        raise CheckpointError(f"checkpoint {path} could not be read ({type(e).__name__}: {why}); it is damaged "
                              "or not a gobrrr checkpoint; restore a copy or start the run afresh") from None


def _is_write_failure(e: RuntimeError) -> bool:
    """torch.save's zip writer reports a failed write as a RuntimeError ("unexpected pos", "file write
    failed", "PytorchStreamWriter failed writing"); anything else (a CUDA error while copying a tensor
    out) is not a disk problem and keeps its own type."""
    text = str(e).lower()
    return any(s in text for s in ("inline_container", "unexpected pos", "write", "streamwriter"))


def clip(text: str, limit: int = 200) -> str:
    """`text` cut to about `limit` characters at a space (never inside a word), with "..." when cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[:cut if cut > limit // 2 else limit].rstrip(" ,;:") + "..."


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return clip(lines[0] if lines else type(e).__name__, 300)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace the small text file `path` atomically (write aside, fsync, rename, fsync the folder)."""
    path = Path(path)
    tmp = path.parent / f"{_tmp_prefix(path)}{os.getpid()}{TMP_SUFFIX}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_hint(folder: Path, e: BaseException) -> str:
    """What to do after a failed write, from the error's errno, the free space and `ulimit -f`."""
    code = e.errno if isinstance(e, OSError) else None
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if code in (errno.ENOSPC, errno.EDQUOT) or (free is not None and free < (64 << 20)):
        return "the disk is full; free space or point --out at a larger disk, then --resume"
    if code == errno.EFBIG or limit != resource.RLIM_INFINITY:
        return (f"this process may not write files over {limit} bytes (ulimit -f); raise the limit, "
                "then --resume")
    return "check the disk (full? failing?) and the folder's permissions, then --resume"


# ---------------------------------------------------------------- random number generators

def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The generators a training step may draw from: torch CPU, CUDA (of `device`), python, numpy."""
    py_version, py_internal, py_gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    state = {
        "torch": torch.get_rng_state(),
        "cuda": None,
        "python": [py_version, list(py_internal), py_gauss],
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                  "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
    }
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore what `rng_state` captured (the CUDA part only when `device` is a GPU and it was saved)."""
    torch.set_rng_state(state["torch"].cpu())  # generator states are CPU byte tensors, wherever they were loaded
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].cpu().numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
    if state.get("cuda") is not None and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
