"""gobrrr lint: every rule with positive and negative cases, suppression, JSON, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gobrrr.lint.check import RULES, Finding, lint_paths, lint_source, main

# DEVICE names a device: a file that never does is taken as CPU-only and not checked
HEADER = ("import torch\nimport numpy as np\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader\n"
          "DEVICE = 'cuda'\n")


def findings(body: str, select=None, everything=True) -> list[tuple[str, int]]:
    """(rule, line) pairs for a snippet; line 1 is the snippet's first line (after the imports).
    The rule cases are toy loops that do not step, so they ask for every finding (`--all`);
    what runs every step is tested on the corpus in test_lint_corpus.py."""
    offset = HEADER.count("\n")
    out = lint_source(HEADER + textwrap.dedent(body), "snippet.py", select, everything)
    return [(f.rule, f.line - offset) for f in out]


# one (rule, snippet that must be flagged at line 3 or the marked line, snippet that must not) per case
POSITIVE = {
    "GB001": [
        ("x = torch.randn(3, 4).to('cuda')", 1),
        ("x = torch.zeros(8).cuda()", 1),
        ("def f(dev):\n    return torch.arange(10).to(device=dev)", 2),
    ],
    "GB002": [
        ("for b in range(3):\n    x = torch.ones(2, device='cuda')\n    v = x.sum().item()", 3),
        ("def f(xs):\n    for x in xs:\n        x.cpu()", 3),
        ("def f(loss: torch.Tensor):\n    while True:\n        s = float(loss)", 3),
        ("def f(y: torch.Tensor):\n    for _ in range(3):\n        y = y * 2\n        y.tolist()", 4),
        ("def f(t):\n    return [v.item() for v in t]", 2),
        ("def f(x):\n    for _ in range(2):\n        a = x.numpy(force=True)", 3),
    ],
    "GB003": [
        ("class M:\n    def f(self, x):\n        x = x.cuda()\n        for _ in range(3):\n"
         "            out = self.net(x)\n            print(out)", 6),
        ("x = torch.randn(3, device='cuda')\nfor i in range(3):\n    print(x)", 3),
        ("def f(loss: torch.Tensor):\n    for i in range(9):\n        msg = f'loss {loss:.3f}'", 3),
        ("x = torch.randn(3, device='cuda')\nfor i in range(3):\n    s = 'x=%s' % x", 3),
        ("x = torch.randn(3, device='cuda')\nfor i in range(3):\n    s = 'x={}'.format(x)", 3),
        ("def f(writer, x: torch.Tensor):\n    for i in range(3):\n        writer.add_scalar('x', x.sum(), i)", 3),
        ("import wandb\ndef f(loss: torch.Tensor):\n    for i in range(3):\n        wandb.log({'loss': loss})", 4),
    ],
    "GB004": [
        ("for i in range(3):\n    torch.cuda.synchronize()", 2),
        ("s = torch.cuda.Stream()\nwhile True:\n    s.synchronize()", 3),
        ("from torch.cuda import synchronize\nfor i in range(3):\n    synchronize()", 3),
    ],
    "GB005": [
        ("x = torch.randn(64)\ny = x.to('cuda', non_blocking=True)", 2),
        ("def f(ds):\n    for x, y in DataLoader(ds):\n        x = x.cuda(non_blocking=True)", 3),
        ("h = torch.empty(4)\nd = torch.empty(4, device='cuda')\nd.copy_(h, non_blocking=True)", 3),
    ],
    "GB006": [
        ("def f(ds, dev):\n    dl = DataLoader(ds, batch_size=8)\n    for x, y in dl:\n        x = x.to(dev)", 2),
        ("def f(ds):\n    for batch in DataLoader(ds, pin_memory=False):\n        x, y = batch\n        x.cuda()", 2),
    ],
    "GB007": [
        ("x = torch.randn(3, device='cuda')\nfor i in range(3):\n    if x.sum() > 0:\n        pass", 3),
        ("def f(t: torch.Tensor):\n    while t:\n        break", 2),
        ("def f(x):\n    for i in range(3):\n        y = x.sum()\n        if y:\n            pass", 4),
        ("x = torch.ones(2, device='cuda')\nfor i in range(3):\n    z = 1 if (x > 0).any() else 2", 3),
    ],
    "GB009": [
        ("def f(model, loader, dev):\n    for x, y in loader:\n        x = x.to(dev)\n        model(x).backward()", 3),
        ("def f(ds):\n    for batch in DataLoader(ds, pin_memory=True):\n        b = {k: v.cuda() for k, v in batch.items()}",
         3),
        ("def f(loader):\n    for i, data in enumerate(loader):\n        a, b = data[0].to(DEVICE), data[1].to(DEVICE)", 3),
    ],
    "GB008": [
        ("def f(x):\n    for i in range(3):\n        idx = torch.nonzero(x)", 3),
        ("x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[x > 0]", 3),
        ("def f(x):\n    for i in range(3):\n        u = x.unique()", 3),
        ("def f(x, m):\n    for i in range(3):\n        s = torch.masked_select(x, m)", 3),
        ("x = torch.randn(9, device='cuda')\nm = torch.isnan(x)\nfor i in range(3):\n    y = x[:, m]", 4),
    ],
    "GB010": [
        ("def f(model, xs, lr):\n    for x in xs:\n        w = torch.tensor([lr], device='cuda')\n"
         "        model(x * w).backward()", 3),
        ("def f(model, xs):\n    for x in xs:\n        t = torch.as_tensor(np.ones(3), device=DEVICE)\n"
         "        model(x + t).backward()", 3),
        ("def f(model, xs, step):\n    for x in xs:\n        s = torch.full((), step)\n        s = s.to(DEVICE)\n"
         "        model(x * s).backward()", 4),
    ],
    "GB011": [
        ("def f(b_obs, inds):\n    x = b_obs.to(DEVICE)\n    idx = np.arange(8)\n    for i in range(3):\n"
         "        y = x[idx[:4]]", 5),
        ("x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[torch.randperm(9)]", 3),
        ("x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[:, [-1]]", 3),
        ("x = torch.randn(9, device='cuda')\nfor i in range(3):\n    x[range(3)] = 0", 3),
    ],
    "GB012": [
        ("import torch.distributed as dist\ndef f(model, xs):\n    for x in xs:\n        model(x).backward()\n"
         "        dist.barrier()", 5),
        ("def f(accelerator, model, xs):\n    for x in xs:\n        accelerator.backward(model(x))\n"
         "        accelerator.wait_for_everyone()", 4),
    ],
    "GB013": [
        ("from torch.distributions import Categorical\ndef f(policy, obs):\n    for o in obs:\n"
         "        logits = policy(o)\n        d = Categorical(logits=logits)", 5),
        ("def f(std: torch.Tensor):\n    for i in range(3):\n        n = torch.normal(0.0, std)", 3),
    ],
    "GB014": [
        ("def f(agent, envs, obs):\n    for step in range(99):\n        action = agent(obs)\n"
         "        obs, r, term, trunc, info = envs.step(action.cpu().numpy())\n"
         "        obs = torch.tensor(obs).to(DEVICE)", 4),
    ],
}

NEGATIVE = {
    "GB001": [
        "x = torch.randn(3, 4, device='cuda')",
        "x = torch.randn(3, 4).to(torch.float16)",          # a dtype change, not a move
        "a = np.zeros(3)\nx = torch.from_numpy(a).cuda()",   # host data must move once
        "x = torch.randn(3).to('cpu')",
    ],
    "GB002": [
        "x = torch.ones(2, device='cuda')\nv = x.sum().item()",          # set-up code, not a loop
        "x = torch.ones(2, device='cuda')\nfor v in x.tolist():\n    pass",  # the iterable runs once
        "for step in range(10):\n    n = float(step)\n    k = int(len('ab'))",  # Python numbers
        "arr = np.zeros(3)\nfor i in range(3):\n    arr.tolist()",        # numpy, not a tensor
        "def f(loss, step: int):\n    for i in range(3):\n        if step % 100 == 0:\n            print(loss.item())",
        "h = torch.zeros(3)\nfor i in range(3):\n    h.item()",          # a host tensor does not sync
        "def f(x):\n    for _ in range(3):\n        x.numpy()",         # .numpy() of a CUDA tensor raises
        "def f(arr):\n    for _ in range(3):\n        arr.tolist()",      # unknown: as likely numpy
        "x = torch.ones(2, device='cuda')\nfor i in range(3):\n    v = x.sum().item()  # sync: logged every step on purpose",
    ],
    "GB003": [
        "x = torch.randn(3, device='cuda')\nprint(x)",
        "for i in range(3):\n    print(i, f'{i:04d}')",
        "x = torch.randn(3, device='cuda')\nfor i in range(3):\n    print(x.shape, x.dtype, x.device)",
        "def f(writer, sched):\n    for i in range(3):\n        writer.add_scalar('lr', sched.get_last_lr()[0], i)",
    ],
    "GB004": [
        "torch.cuda.synchronize()",
        "for i in range(3):\n    e = torch.cuda.Event()\n    e.record()\n    ok = e.query()",
    ],
    "GB005": [
        "x = torch.randn(64).pin_memory()\ny = x.to('cuda', non_blocking=True)",
        "x = torch.empty(64, pin_memory=True)\ny = x.view(8, 8).to('cuda', non_blocking=True)",
        "def f(ds):\n    for x, y in DataLoader(ds, pin_memory=True):\n        x = x.cuda(non_blocking=True)",
        "x = torch.randn(4, device='cuda')\ny = x.to('cpu', non_blocking=True)",  # D2H into pinned memory
        "def f(x):\n    return x.to('cuda', non_blocking=True)",   # unknown source: not provably pageable
    ],
    "GB006": [
        "def f(ds, dev):\n    dl = DataLoader(ds, pin_memory=True)\n    for x, y in dl:\n        x = x.to(dev)",
        "def f(ds):\n    dl = DataLoader(ds)\n    for x, y in dl:\n        x = x.float()",    # stays on the host
        "import gobrrr\ndef f(ds):\n    dl = DataLoader(ds)\n    for x, y in gobrrr.Prefetcher(dl):\n        x.sum()",
        "def f(ds):\n    dl = DataLoader(ds)\n    for x, y in dl:\n        x = x.to(torch.float16)",
    ],
    "GB007": [
        "def f(x):\n    for i in range(3):\n        if x is None:\n            pass",
        "x = torch.ones(3, device='cuda')\nfor i in range(3):\n    if x.shape[0] > 1 and x.ndim == 1:\n        pass",
        "x = torch.ones(3, device='cuda')\nif x.sum() > 0:\n    pass",           # once, outside a loop
        "for i in range(3):\n    if i > 1:\n        pass",
    ],
    "GB009": [
        "def f(model, loader, dev):\n    for x, y in loader:\n        x = x.to(dev, non_blocking=True)\n        model(x)",
        "def f(model, loader, dev):\n    model = model.to(dev)\n    for x in loader:\n        model(x)",   # a module
        "import gobrrr\ndef f(dl):\n    for x, y in gobrrr.Prefetcher(dl, device='cuda'):\n        x = x.to('cuda')",
        "def f(loader):\n    for x, y in loader:\n        x = x.to(torch.float16)",             # a dtype, not a copy
    ],
    "GB008": [
        "x = torch.randn(9, device='cuda')\nidx = torch.nonzero(x)",
        "x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = torch.where(x > 0, x, 0)",
        "x = torch.randn(9, device='cuda')\nfor i in range(3):\n    x[x > 0] = 0",     # masked store, no sync
        "arr = np.arange(5)\nfor i in range(3):\n    u = np.unique(arr)",
        "x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[1:3]",
    ],
    "GB010": [
        "t = torch.tensor([1.0, 2.0], device='cuda')",                       # once, outside a loop
        "def f(xs):\n    for x in xs:\n        t = torch.as_tensor(x.sum(), device=DEVICE)",   # already there
    ],
    "GB011": [
        "x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[i]",     # a Python int
        "x = torch.randn(9, device='cuda')\ni = torch.arange(3, device='cuda')\nfor _ in range(3):\n    y = x[i]",
        "h = torch.randn(9)\nfor i in range(3):\n    y = h[np.arange(3)]",   # a host tensor
        "x = torch.randn(9, device='cuda')\nfor i in range(3):\n    y = x[:, -1:]",
    ],
    "GB012": [
        "import torch.distributed as dist\ndist.barrier()",                  # set-up
        "import torch.distributed as dist\ndef f(model, xs):\n    for x in xs:\n        model(x).backward()\n"
        "        if x % 1000 == 0:\n            dist.barrier()",            # checkpoint steps only
    ],
    "GB013": [
        "from torch.distributions import Categorical\ndef f(policy, obs):\n    for o in obs:\n"
        "        d = Categorical(logits=policy(o), validate_args=False)",
        "from torch.distributions import Normal, Distribution\nDistribution.set_default_validate_args(False)\n"
        "def f(policy, obs):\n    for o in obs:\n        d = Normal(policy(o), 1.0)",
        "def f(m: torch.Tensor):\n    for i in range(3):\n        n = torch.normal(m, 0.5)",   # a float std
    ],
    "GB014": [
        "def f(agent, envs, obs):\n    for step in range(99):\n        action = agent(obs)\n"
        "        obs, r, done, info = envs.step(action)\n        if done.any():\n            pass",   # GPU sim
    ],
}


@pytest.mark.parametrize("rule,body,line", [(r, b, n) for r, cases in POSITIVE.items() for b, n in cases])
def test_rule_flags(rule, body, line):
    assert (rule, line) in findings(body), findings(body)


@pytest.mark.parametrize("rule,body", [(r, b) for r, cases in NEGATIVE.items() for b in cases])
def test_rule_stays_quiet(rule, body):
    assert [f for f in findings(body) if f[0] == rule] == []


def test_every_rule_has_cases_and_text():
    assert set(POSITIVE) == set(NEGATIVE) == set(RULES) == {f"GB{i:03d}" for i in range(1, 15)}
    for message, fix in RULES.values():
        assert message and fix


def test_a_realistic_loop():
    body = """
    def train(model, ds, device):
        loader = DataLoader(ds, batch_size=32)
        total = 0.0
        for step, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y.to(device))
            total += loss.item()
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.3f}")
        return total / (step + 1)
    """
    got = findings(body, everything=False)  # the loop steps (model forward): every finding is per-step
    # GB009: y.to(device) is a blocking copy of each batch (added with the rule)
    assert sorted(got) == [("GB002", 8), ("GB005", 6), ("GB006", 3), ("GB009", 7)], got


def test_suppression():
    body = ("x = torch.ones(2, device='cuda')\nfor i in range(3):\n"
            "    a = x.sum().item()  # gobrrr: ignore[GB002]\n"
            "    b = x.sum().item()  # gobrrr: ignore[GB004]\n"
            "    c = x.sum().item()  # gobrrr: ignore\n"
            "    d = x.sum().item()  # gobrrr: ignore[GB003, GB002]\n"
            "    e = '# gobrrr: ignore[GB002]' + str(x.sum().item())\n")
    assert findings(body) == [("GB002", 4), ("GB002", 7)]


def test_select():
    body = "for i in range(3):\n    torch.cuda.synchronize()\n    x = torch.randn(3).cuda()"
    assert findings(body, select="GB001") == [("GB001", 3)]
    assert findings(body, select=["gb004"]) == [("GB004", 2)]
    with pytest.raises(ValueError, match="unknown rule"):
        findings(body, select="GB999")


def test_finding_fields():
    (f,) = lint_source("import torch\nfor i in range(2):\n    torch.cuda.synchronize()\n    model(i).backward()\n", "a.py")
    assert isinstance(f, Finding)
    assert f.to_dict() == {"path": "a.py", "line": 3, "col": 5, "rule": "GB004", "message": f.message, "fix": f.fix,
                           "hot": True, "chain": [], "covers": [], "covers_at": []}   # hot: in a step loop (shown by default)
    assert "stalls the host" in f.message and "event" in f.fix


BAD = "import torch\nfor i in range(3):\n    torch.cuda.synchronize()\n    model(i).backward()\n"  # a step loop


def test_cli_exit_codes_and_json(tmp_path, capsys):
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nx = torch.zeros(3, device='cuda')\n")
    bad = tmp_path / "pkg" / "bad.py"
    bad.parent.mkdir()
    bad.write_text(BAD)
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")

    assert main([str(clean)]) == 0
    assert "clean" in capsys.readouterr().out
    assert main([str(tmp_path / "pkg")]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:3:5: GB004" in out and "fix:" in out

    assert main([str(tmp_path / "pkg"), "--format", "json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list) and len(data) == 1
    assert set(data[0]) == {"path", "line", "col", "rule", "message", "fix", "hot", "chain", "covers",
                            "covers_at"}
    assert (data[0]["path"], data[0]["line"], data[0]["rule"]) == (str(bad), 3, "GB004")
    assert main([str(clean), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []

    assert main([str(broken), str(bad)]) == 2          # unparsable: reported, others still checked
    cap = capsys.readouterr()
    assert "broken.py:1: cannot check this file: SyntaxError" in cap.err and "GB004" in cap.out
    assert main([str(tmp_path / "missing.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([str(bad), "--select", "GB042"]) == 2
    assert "unknown rule" in capsys.readouterr().err
    assert main(["--format", "xml", str(bad)]) == 2
    assert main([]) == 2
    assert main([str(bad), "--select", "GB001"]) == 0


def test_lint_paths_errors(tmp_path):
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "skip.py").write_text(BAD)
    with pytest.raises(ValueError, match="broken.py"):
        lint_paths([tmp_path])
    errors: list[str] = []
    got = lint_paths([tmp_path], errors=errors)
    assert [f.rule for f in got] == ["GB004"] and len(errors) == 1


def test_cli_entry_point(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    out = subprocess.run([sys.executable, "-m", "gobrrr", "lint", str(bad), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)[0]["rule"] == "GB004"
    # a file that cannot be parsed is reported before the summary line, and the summary never says clean
    both = subprocess.run([sys.executable, "-m", "gobrrr", "lint", str(tmp_path)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    lines = both.stdout.splitlines()
    assert both.returncode == 2
    error = next(i for i, line in enumerate(lines) if "broken.py" in line)
    assert error < len(lines) - 1 and lines[-1].startswith("gobrrr lint: 1 finding") and "clean" not in lines[-1]


def test_cli_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    assert main([str(bad), "--select", ""]) == 2                      # no rule selected is a mistake
    err = capsys.readouterr().err
    assert err.startswith("gobrrr lint: error: --select names no rule") and err.count("gobrrr lint") == 1
    assert main([str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("gobrrr lint:") == 1 and "no such file or directory" in err   # no doubled prefix
    loop_a, loop_b = tmp_path / "a.py", tmp_path / "b.py"
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    dangling = tmp_path / "gone.py"
    os.symlink(tmp_path / "nowhere.py", dangling)
    assert main([str(loop_a), str(dangling), str(bad)]) == 2
    cap = capsys.readouterr()
    assert "symbolic link loop" in cap.err and "broken symbolic link" in cap.err and "GB004" in cap.out
    os.unlink(loop_a), os.unlink(loop_b), os.unlink(dangling)


def test_cli_fifo_and_deep_expression(tmp_path, capsys):
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)                                                   # opening it would block forever
    deep = tmp_path / "deep.py"
    deep.write_text("x = " + " + ".join(["1"] * 20000) + "\n")
    (tmp_path / "bad.py").write_text(BAD)
    assert main([str(tmp_path)]) == 2                                 # the FIFO is skipped in a walk
    cap = capsys.readouterr()
    assert "deep.py:0: cannot check this file: an expression too deeply nested" in cap.err
    assert "pipe.py" not in cap.err and "GB004" in cap.out           # the other files are still checked
    assert main([str(fifo)]) == 2                                     # named: said, not opened
    assert "not a regular file" in capsys.readouterr().err


def test_fix_printed_once_per_rule_and_exclude(tmp_path, capsys):
    src = "import torch\nfor i in range(3):\n    torch.cuda.synchronize()\n    torch.cuda.synchronize()\n" \
          "    model(i).backward()\n"
    (tmp_path / "a.py").write_text(src)
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "b.py").write_text(src)
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.count(": GB004") == 4 and out.count(RULES["GB004"][1]) == 1
    assert main([str(tmp_path), "--exclude", "gen", "--exclude", "nothing*"]) == 1
    assert capsys.readouterr().out.count(": GB004") == 2
    assert main([str(tmp_path), "--exclude", "*.py"]) == 2          # nothing left to check is not "clean"
    assert "nothing to check: every Python file was excluded" in capsys.readouterr().err


def test_cpu_only_files_said_and_included_on_request(tmp_path, capsys):
    """Issue 30: a file that never names a device is skipped, and the summary says so, why, and how to
    include it; a folder without Python files is an error, not "clean"."""
    cpu = tmp_path / "cpu.py"
    cpu.write_text("def train(model, loader, opt):\n    total = 0.0\n    for x, y in loader:\n"
                   "        loss = model(x, y)\n        loss.backward()\n        opt.step()\n"
                   "        total += loss.item()\n")
    assert main([str(cpu)]) == 0
    out = capsys.readouterr().out.strip()
    assert out == ("gobrrr lint: clean (1 file); 1 of them never names a device and was skipped as CPU-only code, "
                   "where loops sync nothing (cpu.py; --assume-gpu checks it)")
    assert main([str(cpu), "--assume-gpu"]) == 1
    assert "cpu.py:7:18: GB002" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no code here")
    assert main([str(empty)]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "no Python files (*.py) below this folder" in cap.err
    assert "clean" not in cap.out
    (tmp_path / "gpu.py").write_text("import torch\nx = torch.zeros(3, device='cuda')\n")
    assert main([str(tmp_path / "gpu.py")]) == 0
    assert capsys.readouterr().out.strip() == "gobrrr lint: clean (1 file)"
