"""The README's "Where things are" map names every package and top-level folder, and nothing that is gone."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _map_paths() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Where things are", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    return [m.group(1) for line in block.splitlines() if (m := re.match(r"(\S+)\s{2,}\S", line))]


def test_every_listed_path_exists():
    paths = _map_paths()
    assert len(paths) >= 15, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README map lists paths that are gone: {missing}"


def test_every_package_and_module_of_gobrrr_is_listed():
    listed = {p.rstrip("/") for p in _map_paths()}
    pkg = ROOT / "gobrrr"
    want = {f"gobrrr/{d.name}" for d in pkg.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))}
    want |= {f"gobrrr/{f.name}" for f in pkg.glob("*.py") if not f.name.startswith("_")}
    assert not want - listed, f"README map misses: {sorted(want - listed)}"


def _top_level_folders() -> set[str]:
    """Folders git tracks (a user's own untracked folder in the checkout is no part of the map); the tree
    itself where git is not at hand (an exported copy)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        return {line.split("/")[0] for line in out.stdout.splitlines() if "/" in line and not line.startswith(".")}
    return {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
            and p.name not in {"build", "dist-out", "gobrrr-doctor", "demo-out"} and not p.name.endswith(".egg-info")}


def test_every_top_level_folder_is_listed():
    listed = {p.rstrip("/").split("/")[0] for p in _map_paths()}
    tracked = _top_level_folders()
    assert not tracked - listed - {"gobrrr"}, f"README map misses folders: {sorted(tracked - listed)}"
