"""scripts/lint_score.py: matching findings to judged lines, and the precision/recall arithmetic.

Built on a small made-up judgement (CI has no network, so the real repositories are never fetched here);
the real judgements are only checked for being well-formed.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lint_score", ROOT / "scripts" / "lint_score.py")
lint_score = importlib.util.module_from_spec(_spec)
sys.modules["lint_score"] = lint_score
_spec.loader.exec_module(lint_score)


def line(path, n, verdict="step", end=None, also=(), avoidable=True, visibility="user"):
    return {"path": path, "line": n, "end_line": end or n, "verdict": verdict, "also": list(also),
            "avoidable": avoidable, "visibility": visibility, "category": "item"}


JUDGED = {
    "name": "toy", "repo": "someone/toy", "commit": "0" * 40, "set": "dev", "lint_paths": ["."],
    "lines": [
        line("train.py", 10),                                   # found directly
        line("train.py", 20, end=22),                           # found on the statement's last line
        line("util.py", 5, also=["train.py:30"]),               # found through its call site
        line("util.py", 9, avoidable=False),                    # missed, not avoidable
        line("train.py", 40),                                   # missed
        line("lib.py", 3, visibility="library"),                # library sync, found: not in the main recall
        line("train.py", 50, verdict="rare"),                   # rare: correct finding, not in recall
        line("train.py", 60, verdict="false"),                  # judged false positive
    ],
}


def f(path, n, rule="GB002"):
    return {"path": path, "line": n, "rule": rule}


def test_score_repo_counts_each_case_once():
    findings = [f("train.py", 10), f("./train.py", 10, "GB007"),   # two rules, one line
                f("train.py", 22), f("train.py", 30), f("lib.py", 3), f("train.py", 50),
                f("train.py", 60), f("train.py", 70)]                # 70: nobody judged it
    s = lint_score.score_repo(JUDGED, findings)
    assert (s.findings, s.lines) == (8, 7)
    assert (s.step, s.rare, s.false) == (4, 1, 1)
    assert s.unjudged == ["train.py:70 GB002"] and s.false_lines == ["train.py:60 GB002"]
    assert (s.step_found, s.step_total) == (3, 5)
    assert (s.avoidable_found, s.avoidable_total) == (3, 4)
    assert (s.library_found, s.library_total) == (1, 1)
    assert sorted(s.missed) == ["train.py:40 item", "util.py:9 item"]
    d = s.as_dict()
    assert d["precision"] == pytest.approx(5 / 6)          # unjudged findings are left out until judged
    assert d["recall"] == pytest.approx(3 / 5)
    assert d["recall_avoidable"] == pytest.approx(3 / 4)


def test_no_findings_gives_no_precision_and_zero_recall():
    s = lint_score.score_repo(JUDGED, [])
    assert s.as_dict()["precision"] is None
    assert s.as_dict()["recall"] == 0.0 and len(s.missed) == 5


def test_aggregate_is_micro_averaged_over_repos():
    a = lint_score.score_repo(JUDGED, [f("train.py", 10), f("train.py", 60)])     # 1 step, 1 false
    b = lint_score.score_repo(dict(JUDGED, name="toy2"), [f("train.py", 10), f("train.py", 22),
                                                          f("util.py", 5)])       # 3 step
    a.seconds, b.seconds = 1.5, 0.5
    t = lint_score.aggregate([a, b])
    assert (t["step"], t["false"], t["lines"]) == (4, 1, 5)
    assert t["precision"] == pytest.approx(4 / 5)
    assert (t["step_found"], t["step_total"]) == (4, 10)
    assert t["recall"] == pytest.approx(0.4) and t["seconds"] == pytest.approx(2.0)


def test_parse_text_reads_one_finding_per_line():
    out = ("a/train.py:12:5: GB002 `.item()` inside a loop\n"
           "train.py:40: GB009 blocking copy (in a function called from ...)\n"
           "how to fix:\n  GB002: keep the value on the device\n"
           "gobrrr lint: 2 findings in 3 files\n")
    assert lint_score.parse_text(out) == [{"path": "a/train.py", "line": 12, "rule": "GB002"},
                                          {"path": "train.py", "line": 40, "rule": "GB009"}]


def test_load_judgement_rejects_an_unknown_verdict(tmp_path):
    bad = dict(JUDGED, lines=[dict(line("a.py", 1), verdict="maybe")])
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        lint_score.load_judgement(p)


def test_real_judgements_are_well_formed():
    files = sorted((ROOT / "tests" / "data" / "lint_judged").glob("*.json"))
    docs = [lint_score.load_judgement(p) for p in files]
    assert len(docs) >= 16
    sets = sorted({d["set"] for d in docs})
    assert {"dev", "dev2", "heldout", "heldout2"} <= set(sets)
    for name in sets:   # every set holds repositories of at least two domains, named as such
        assert re.fullmatch(r"(dev|heldout)\d*", name), name
        assert len({d["domain"] for d in docs if d["set"] == name}) >= 2, name
    # the four families (vision perception, generation, language models, control), the two that
    # heldout54-57 added (speech, time series), 3D reconstruction, graphs and recommendation (heldout126-133), and
    # tabular learning (heldout137)
    assert {d["domain"] for d in docs} == {"3d", "detection", "diffusion", "graph", "llm-finetune", "recsys", "rl", "speech",
                                          "tabular", "time-series"}
    for d in docs:
        assert len(d["commit"]) == 40 and d["url"].startswith("https://github.com/")
        if d.get("negative_control"):   # a project that never uses the GPU (minimalRL), or whose own code syncs
            #                             nothing per step (open-r1: its loops run inside trl; tabular-dl-num-embeddings
            #                             keeps its data on the GPU): no line per step, rare or false ones at most
            assert not any(e["verdict"] == "step" for e in d["lines"]), d["name"]
        else:
            assert sum(e["verdict"] == "step" for e in d["lines"]) >= 1, d["name"]   # pytorch-stable-diffusion: one
        assert len({(e["path"], e["line"]) for e in d["lines"]}) == len(d["lines"]), d["name"]


def test_missing_checkout_is_one_clear_error(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "toy.json").write_text(json.dumps(JUDGED))
    rc = lint_score.main(["--repos", str(tmp_path / "none"), "--data", str(data)])
    err = capsys.readouterr().err
    assert rc == 2 and "toy:" in err and "check out" in err and "Traceback" not in err


def test_a_finding_that_covers_other_lines_finds_them_without_counting_them():
    """GB014 stands for a CPU environment's round trip: one finding at env.step covers its copies' lines."""
    judged = {**JUDGED, "lines": [line("train.py", 40), line("train.py", 41), line("train.py", 45, verdict="rare")]}
    s = lint_score.score_repo(judged, [{"path": "train.py", "line": 45, "rule": "GB014", "covers": [40, 41]}])
    assert (s.step_found, s.step_total) == (2, 2)
    assert (s.rare, s.step, s.false) == (1, 0, 0)   # precision counts the one finding, not the lines it covers


def test_a_round_trip_in_the_policys_file_is_found_by_the_env_steps_finding():
    """GB014's `covers_at` names lines in the functions its loop calls (`agent.py:24`, the policy's `.item()`)."""
    judged = {**JUDGED, "lines": [line("agent.py", 24), line("main.py", 12, verdict="rare")]}
    s = lint_score.score_repo(judged, [{"path": "main.py", "line": 12, "rule": "GB014", "covers_at": ["agent.py:24"]}])
    assert (s.step_found, s.step_total, s.rare) == (1, 1, 1)
    assert lint_score.score_repo(judged, [{"path": "main.py", "line": 12, "rule": "GB014"}]).step_found == 0


def test_a_checkout_is_built_from_a_bare_mirror_or_a_clone(tmp_path):
    """`--mirror` folders hold bare mirrors (<owner>+<repo>/repo) or, for some repositories, a working
    clone (<owner>+<repo>/repo/.git): both give the lint paths at the recorded commit."""
    import subprocess
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('step')\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", str(src)], check=True)
    subprocess.run([*git, "-C", str(src), "add", "train.py"], check=True)
    subprocess.run([*git, "-C", str(src), "commit", "-qm", "one"], check=True)
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    for kind in ("bare", "clone"):
        mirror = tmp_path / f"mirror-{kind}" / "owner+proj"
        if kind == "bare":
            subprocess.run(["git", "clone", "-q", "--bare", str(src), str(mirror / "repo")], check=True)
        else:
            subprocess.run(["git", "clone", "-q", str(src), str(mirror / "repo")], check=True)
        judged = {**JUDGED, "name": f"proj-{kind}", "repo": "owner/proj", "commit": commit, "lint_paths": ["train.py"]}
        where = lint_score.checkout(judged, tmp_path / "repos", mirror.parent)
        assert (where / "train.py").read_text() == "print('step')\n"


def test_a_lint_run_that_could_not_check_some_files_is_scored_on_the_rest(tmp_path, capsys):
    """`gobrrr lint` exits 2 when a file cannot be read, after checking the others: their findings are scored and
    the refusal is printed, instead of losing the whole repository."""
    (tmp_path / "ok.py").write_text("import torch\nfor x in loader:\n    model(x.cuda()).backward()\n    opt.step()\n"
                                    "    print(loss.item())\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    findings, _ = lint_score.run_lint(tmp_path, ["."])
    assert any(f["rule"] == "GB002" for f in findings) and "broken.py" in capsys.readouterr().err
