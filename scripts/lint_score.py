"""Score `gobrrr lint` against hand-judged public training repositories (tests/data/lint_judged).

Each judged repository is a JSON file: the repository, the exact commit, its set (dev or heldout), the
paths to lint, and the judged lines. A judged line has a verdict:

    step   a host-device sync that runs every step of a step loop (train, eval, sampling, decoding,
           environment), or per element / mini-batch inside one: counts toward recall
    rare   a real sync on a rare path (log interval, end of epoch, outer loop, an option no caller
           enables): a finding there is correct, but missing it costs nothing
    false  a line a finding pointed at that is not a per-step sync: a false positive

A finding matches a judged line when it has the same path and its line lies in [line, end_line], or when
it sits on one of the line's `also` locations (the call site of a one-line helper such as
`samples.to(device)` for NestedTensor.to). Findings are counted once per (path, line).

Schedule, per repository:
    1. find the checkout: REPOS/<name> (or build it from a mirror: git archive of the recorded commit)
    2. run `python -m gobrrr lint --format json <lint_paths>` there (default options), timed
    3. match the findings to the judged lines; findings on lines nobody judged are listed as UNJUDGED
       so a person can read them and add a verdict to the JSON
Precision = (step + rare hits) / judged findings; recall = step lines found / step lines, over the lines
whose sync is written in the project's code (visibility "user"); syncs hidden inside a third-party
library call (accelerate's loader copy, ema_pytorch's update, torchvision's NMS) are reported apart.

Usage:
    python scripts/lint_score.py --repos /tmp/lintrepos                 # checkouts already there
    python scripts/lint_score.py --repos /tmp/lintrepos --mirror /work/.mirror   # build missing ones
    python scripts/lint_score.py --repos DIR --set heldout --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
DATA = HERE / "tests" / "data" / "lint_judged"
VERDICTS = ("step", "rare", "false")
_TEXT_FINDING = re.compile(r"^(?P<path>[^\s:][^:]*):(?P<line>\d+)(?::\d+)?:\s*(?P<rule>GB\d+)?")


# ----------------------------------------------------------------------------- matching and arithmetic

def _norm(path: str) -> str:
    path = path.replace("\\", "/")
    while path.startswith("./"):
        path = path[2:]
    return os.path.normpath(path).replace("\\", "/")


def _loc(text: str) -> tuple[str, int]:
    path, line = text.rsplit(":", 1)
    return _norm(path), int(line)


def load_judgement(path: Path) -> dict:
    """One judged repository; raises ValueError with the file and the field when it is malformed."""
    doc = json.loads(Path(path).read_text())
    for key in ("name", "repo", "commit", "set", "lint_paths", "lines"):
        if key not in doc:
            raise ValueError(f"{path}: missing '{key}'")
    for i, e in enumerate(doc["lines"]):
        if e.get("verdict") not in VERDICTS:
            raise ValueError(f"{path}: lines[{i}] has verdict {e.get('verdict')!r}, expected one of {VERDICTS}")
        if int(e.get("end_line", e["line"])) < int(e["line"]):
            raise ValueError(f"{path}: lines[{i}] ends before it starts")
    doc.setdefault("url", f"https://github.com/{doc['repo']}")
    return doc


def _index(judgement: dict) -> tuple[dict, dict]:
    """(own, also): (path, line) -> judged entries covering that line by span, or naming it in `also`."""
    own: dict[tuple[str, int], list[dict]] = {}
    also: dict[tuple[str, int], list[dict]] = {}
    for e in judgement["lines"]:
        path = _norm(e["path"])
        for n in range(int(e["line"]), int(e.get("end_line", e["line"])) + 1):
            own.setdefault((path, n), []).append(e)
        for a in e.get("also", []):
            also.setdefault(_loc(a), []).append(e)
    return own, also


def _verdict_of(entries: list[dict]) -> str:
    kinds = {e["verdict"] for e in entries}
    return "step" if "step" in kinds else "rare" if "rare" in kinds else "false"


@dataclass
class RepoScore:
    name: str
    set: str
    findings: int = 0                  # raw findings (several rules on a line count several times)
    lines: int = 0                     # distinct (path, line) findings
    step: int = 0                      # finding lines on per-step syncs
    rare: int = 0                      # finding lines on real but rare syncs
    false: int = 0                     # finding lines judged not to be per-step syncs
    unjudged: list = field(default_factory=list)   # "path:line rule" nobody has judged yet
    false_lines: list = field(default_factory=list)
    step_total: int = 0                # judged per-step lines whose sync is in the project's code
    step_found: int = 0
    avoidable_total: int = 0
    avoidable_found: int = 0
    library_total: int = 0             # per-step syncs inside a third-party call made by the line
    library_found: int = 0
    missed: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def judged(self) -> int:
        return self.step + self.rare + self.false

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(precision=ratio(self.step + self.rare, self.judged), recall=ratio(self.step_found, self.step_total),
                 recall_avoidable=ratio(self.avoidable_found, self.avoidable_total),
                 recall_library=ratio(self.library_found, self.library_total))
        return d


def ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def score_repo(judgement: dict, findings: list[dict]) -> RepoScore:
    """Match findings ({path, line, rule?}) to the judged lines of one repository."""
    own, also = _index(judgement)
    s = RepoScore(judgement["name"], judgement["set"], findings=len(findings))
    rules: dict[tuple[str, int], list[str]] = {}
    for f in findings:
        rules.setdefault((_norm(f["path"]), int(f["line"])), []).append(str(f.get("rule", "")))
    s.lines = len(rules)
    hit: set[int] = set()
    for f in findings:  # a finding that stands for other lines (GB014: a CPU env's round trip, once), of its file
        covered = [(f["path"], int(c)) for c in f.get("covers") or []]   # and of the functions its loop calls
        covered += [(p, int(c)) for p, c in (a.rsplit(":", 1) for a in f.get("covers_at") or [])]
        for path, c in covered:
            hit.update(id(e) for e in own.get((_norm(path), c)) or also.get((_norm(path), c)) or []
                       if e["verdict"] == "step")
    for key, rs in sorted(rules.items()):
        entries = own.get(key) or also.get(key)
        if not entries:
            s.unjudged.append(f"{key[0]}:{key[1]} {','.join(sorted(set(rs)))}".strip())
            continue
        verdict = _verdict_of(entries)
        setattr(s, verdict, getattr(s, verdict) + 1)
        if verdict == "false":
            s.false_lines.append(f"{key[0]}:{key[1]} {','.join(sorted(set(rs)))}".strip())
        hit.update(id(e) for e in entries if e["verdict"] == "step")
    for e in judgement["lines"]:
        if e["verdict"] != "step":
            continue
        found = id(e) in hit
        if e.get("visibility", "user") == "library":
            s.library_total += 1
            s.library_found += found
            continue
        s.step_total += 1
        s.step_found += found
        if e.get("avoidable", True):
            s.avoidable_total += 1
            s.avoidable_found += found
        if not found:
            s.missed.append(f"{_norm(e['path'])}:{e['line']} {e.get('category', '')}".strip())
    return s


def aggregate(scores: list[RepoScore]) -> dict:
    """Micro-averaged totals of several repositories (one set, or all)."""
    t = {k: sum(getattr(s, k) for s in scores) for k in
         ("findings", "lines", "step", "rare", "false", "step_total", "step_found", "avoidable_total",
          "avoidable_found", "library_total", "library_found", "seconds")}
    t["unjudged"] = sum(len(s.unjudged) for s in scores)
    judged = t["step"] + t["rare"] + t["false"]
    t["precision"] = ratio(t["step"] + t["rare"], judged)
    t["recall"] = ratio(t["step_found"], t["step_total"])
    t["recall_avoidable"] = ratio(t["avoidable_found"], t["avoidable_total"])
    t["recall_library"] = ratio(t["library_found"], t["library_total"])
    return t


def parse_text(output: str) -> list[dict]:
    """Findings from the text format, one `path:line[:col]: RULE ...` per line (fallback when JSON is absent)."""
    out = []
    for raw in output.splitlines():
        m = _TEXT_FINDING.match(raw.strip())
        if m and not raw.startswith((" ", "\t")):
            out.append({"path": m["path"], "line": int(m["line"]), "rule": m["rule"] or ""})
    return out


# ----------------------------------------------------------------------------- checkouts and lint runs

def checkout(judgement: dict, repos: Path, mirror: Path | None) -> Path:
    """REPOS/<name>; built from MIRROR/<owner>+<repo>/repo (bare, or a clone's .git) at the recorded commit
    when it is missing."""
    where = repos / judgement["name"]
    if where.is_dir():
        return where
    if mirror is None:
        raise FileNotFoundError(f"{where} is missing: check out {judgement['url']} at {judgement['commit']} "
                                f"there, or pass --mirror")
    git_dir = mirror / judgement["repo"].replace("/", "+") / "repo"
    if (git_dir / ".git").is_dir():
        git_dir = git_dir / ".git"   # a working clone rather than a bare mirror
    if not git_dir.is_dir():
        raise FileNotFoundError(f"no mirror of {judgement['repo']} at {git_dir}: fetch it first")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "src.tar"
        paths = [p for p in judgement["lint_paths"] if p != "."]
        subprocess.run(["git", "--git-dir", str(git_dir), "archive", "-o", str(tar), judgement["commit"], *paths],
                       check=True)
        where.mkdir(parents=True)
        with tarfile.open(tar) as t:
            t.extractall(where, filter="data")
    return where


def run_lint(where: Path, lint_paths: list[str], everything: bool = False,
             python: str = sys.executable) -> tuple[list[dict], float]:
    """(findings, seconds) of one default `gobrrr lint` run in `where`, with this tree's gobrrr first on the path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [python, "-m", "gobrrr", "lint", "--format", "json", *(["--all"] if everything else []), *lint_paths]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, check=False, cwd=where, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    try:
        findings = json.loads(p.stdout)
    except json.JSONDecodeError:
        findings = None if p.returncode not in (0, 1) else parse_text(p.stdout)
    if p.returncode not in (0, 1) and not (p.returncode == 2 and isinstance(findings, list)):
        raise RuntimeError(f"gobrrr lint exited {p.returncode} in {where}: {p.stderr.strip()[-400:]}")
    if p.returncode == 2:   # some files could not be checked (the lint says which): score what was
        print(f"lint_score: {where.name}: {p.stderr.strip()[-400:]}", file=sys.stderr)
    return findings, seconds


# ----------------------------------------------------------------------------- report

def _pct(x: float | None) -> str:
    return "  -  " if x is None else f"{100 * x:4.0f}%"


def report(scores: list[RepoScore], out=sys.stdout) -> dict:
    head = f"{'repo':30s} {'set':8s} {'find':>5s} {'step':>5s} {'rare':>5s} {'false':>5s} {'unj':>4s} " \
           f"{'prec':>6s} {'recall':>11s} {'avoid.':>11s} {'library':>9s} {'time':>7s}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for s in scores:
        d = s.as_dict()
        print(f"{s.name:30s} {s.set:8s} {s.lines:5d} {s.step:5d} {s.rare:5d} {s.false:5d} {len(s.unjudged):4d} "
              f"{_pct(d['precision']):>6s} {s.step_found:3d}/{s.step_total:<3d}{_pct(d['recall']):>5s} "
              f"{s.avoidable_found:3d}/{s.avoidable_total:<3d}{_pct(d['recall_avoidable']):>5s} "
              f"{s.library_found:3d}/{s.library_total:<3d}  {s.seconds:6.2f}s", file=out)
    totals = {}
    for name in sorted({s.set for s in scores}) + ["all"]:
        group = [s for s in scores if name in ("all", s.set)]
        t = totals[name] = aggregate(group)
        print(f"{'SET ' + name:30s} {'':8s} {t['lines']:5d} {t['step']:5d} {t['rare']:5d} {t['false']:5d} "
              f"{t['unjudged']:4d} {_pct(t['precision']):>6s} {t['step_found']:3d}/{t['step_total']:<3d}"
              f"{_pct(t['recall']):>5s} {t['avoidable_found']:3d}/{t['avoidable_total']:<3d}"
              f"{_pct(t['recall_avoidable']):>5s} {t['library_found']:3d}/{t['library_total']:<3d}  "
              f"{t['seconds']:6.2f}s", file=out)
    for s in scores:
        for kind, rows in (("UNJUDGED (read it, add a verdict)", s.unjudged), ("FALSE", s.false_lines)):
            for r in rows:
                print(f"{kind}: {s.name}/{r}", file=out)
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repos", type=Path, required=True, help="folder with one checkout per judged repo, by name")
    ap.add_argument("--mirror", type=Path, help="folder of bare mirrors (<owner>+<repo>/repo) to build missing checkouts")
    ap.add_argument("--data", type=Path, default=DATA, help="folder of judged JSON files")
    ap.add_argument("--set", default="all", help="score one set (dev, dev2, dev3, heldout, heldout2, heldout3, ...) or all")
    ap.add_argument("--all-loops", action="store_true", help="pass --all to the lint (not the scored default)")
    ap.add_argument("--missed", action="store_true", help="also list the per-step lines no finding reached")
    ap.add_argument("--json", type=Path, help="write per-repo and per-set numbers here")
    args = ap.parse_args(argv)
    try:
        judgements = [load_judgement(p) for p in sorted(args.data.glob("*.json"))]
    except (ValueError, json.JSONDecodeError) as e:
        print(f"lint_score: {e}", file=sys.stderr)
        return 2
    judgements = [j for j in judgements if args.set in ("all", j["set"])]
    if not judgements:
        print(f"lint_score: no judged repositories in {args.data} for set {args.set}", file=sys.stderr)
        return 2
    scores = []
    for j in judgements:
        try:
            where = checkout(j, args.repos, args.mirror)
            findings, seconds = run_lint(where, j["lint_paths"], everything=args.all_loops)
        except (FileNotFoundError, RuntimeError, subprocess.CalledProcessError) as e:
            print(f"lint_score: {j['name']}: {e}", file=sys.stderr)
            return 2
        s = score_repo(j, findings)
        s.seconds = seconds
        scores.append(s)
    totals = report(scores)
    if args.missed:
        for s in scores:
            for m in s.missed:
                print(f"MISSED: {s.name}/{m}")
    if args.json:
        args.json.write_text(json.dumps({"repos": [s.as_dict() for s in scores], "sets": totals}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
