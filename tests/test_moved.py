"""0.1 import paths resolve to the 0.2 modules for one release, each with a DeprecationWarning naming the new one."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gobrrr
from gobrrr import _moved


def test_every_old_path_is_the_new_module():
    """All in one fresh interpreter (no old name imported yet), so each import warns once, by its own name."""
    code = ("import warnings, importlib, json\n"
            "from gobrrr._moved import MOVED\n"
            "out = {}\n"
            "for old, new in MOVED.items():\n"
            "    if new is None:\n"
            "        continue\n"
            "    with warnings.catch_warnings(record=True) as ws:\n"
            "        warnings.simplefilter('always')\n"
            "        m = importlib.import_module('gobrrr.' + old)\n"
            "    out[old] = [m is importlib.import_module('gobrrr.' + new), [str(w.message) for w in ws]]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    got = json.loads(proc.stdout)
    for old, new in _moved.MOVED.items():
        if new is None:
            continue
        same, warned = got[old]
        assert same, old
        assert any(f"gobrrr.{old} moved to gobrrr.{new}" in w for w in warned), (old, warned)


def test_the_public_names_stay():
    with pytest.warns(DeprecationWarning):
        from gobrrr.device.prefetch import Prefetcher
    assert Prefetcher is gobrrr.Prefetcher
    assert gobrrr.dist is gobrrr.comm and gobrrr.dist.comm is importlib.import_module("gobrrr.comm.collectives")
    for name in ("ddp", "zero", "tp", "make_mesh"):
        assert callable(getattr(gobrrr.parallel, name))


def test_no_folder_is_named_dist_or_device():
    root = Path(gobrrr.__file__).resolve().parent
    assert not [p for p in root.rglob("*") if p.is_dir() and p.name in ("dist", "device")]
