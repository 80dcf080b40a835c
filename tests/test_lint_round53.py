"""gobrrr lint, issue 29's round 53 on heldout54-57's first sight (stylegan2-ada-pytorch, attention-is-all-you-need,
ddpm-torch, accelerate's examples, Deep-RL-Hands-On): each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gobrrr.lint.check import lint_source
from tests.lintcase import project_rules as _lint

ROOT = Path(__file__).resolve().parents[1]

_STEP = """
    import torch

    def train(model, loader, opt):
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True)).sum()
            loss.backward()
            opt.step()
            print(loss.item())
    """


def test_a_file_with_a_byte_order_mark_or_a_coding_line_is_read_as_python_reads_it(tmp_path):
    """stylegan2-ada-pytorch: 19 of its 35 files start with a UTF-8 byte-order mark, which Python accepts; the lint
    read them as plain UTF-8 text and refused each one (`invalid non-printable character U+FEFF`), so the training
    loop was never read (1 of 20 per-step lines at first sight). A `# -*- coding: latin-1 -*-` file is read in its
    declared encoding too; a file that is not Python still gets one error line."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "bom.py").write_bytes("\ufeff".encode() + textwrap.dedent(_STEP).encode())
    (root / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + textwrap.dedent(_STEP).encode())
    (root / "broken.py").write_text("def f(:\n")
    run = subprocess.run([sys.executable, "-m", "gobrrr", "lint", str(root)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "bom.py:9:" in run.stdout and "latin.py:11:" in run.stdout, run.stdout + run.stderr
    assert run.stderr.count("cannot check this file") == 1 and "broken.py" in run.stderr, run.stderr


def test_output_cut_short_by_its_reader_ends_quietly(tmp_path):
    """`gobrrr lint . | head` closed the pipe under the lint's last lines and Python printed a BrokenPipeError
    traceback; the run now ends quietly (exit 1, as a closed pipe ends other tools)."""
    root = tmp_path / "project"
    root.mkdir()
    reads = "".join(f"        print(loss.item() + {i})\n" for i in range(60))   # more than a pipe's 64 KiB in all
    for i in range(20):
        (root / f"t{i}.py").write_text(textwrap.dedent(_STEP) + reads)
    cmd = f"{sys.executable} -m gobrrr lint {root} | head -1"
    run = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout.count("\n") == 1 and "GB00" in run.stdout, run.stdout
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr


def test_a_class_another_file_moves_to_the_device_runs_there(tmp_path):
    """attention-is-all-you-need: the beam search lives in `Translator.translate_sentence`, in a module file that
    never names a device; the script builds `Translator(model, ...).to(device)`. The search's per-step `.item()`
    was taken for CPU code. A class of a device-less file that no file moves stays on the CPU."""
    translator = """
        import torch
        from torch import nn

        class {name}(nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def translate_sentence(self, src):
                seq = src
                for step in range(20):
                    out = self.model(seq)
                    if (out.argmax(-1) == 2).sum().item() == 1:
                        break
                    seq = torch.cat([seq, out.argmax(-1)[:, -1:]], 1)
                return seq
        """
    script = """
        import torch
        from translator import Translator
        from scorer import Scorer

        def main(model, test_loader):
            device = torch.device("cuda")
            translator = Translator(model).to(device)
            scorer = Scorer(model)
            for ex in test_loader:
                translator.translate_sentence(torch.LongTensor([ex]).to(device))
            scorer.translate_sentence(torch.LongTensor([[1]]))
        """
    found = {(f, line) for f, line, rule in _lint(tmp_path, {"translator.py": translator.format(name="Translator"),
                                                           "scorer.py": translator.format(name="Scorer"),
                                                           "translate.py": script})}
    assert ("translator.py", 14) in found and not any(f == "scorer.py" for f, _ in found), found
    assert ("translate.py", 11) in found, found   # the sentence copied up per iteration of the loop around the search


def test_a_loop_over_a_loader_wrapped_in_a_with_block_takes_batches():
    """ddpm-torch: `with tqdm(self.trainloader) as t: for i, x in enumerate(t):` - the loop over the progress bar
    was not taken for a loop over batches, so its blocking copy of a pinned batch (`x.to(self.device)`, no
    non_blocking) went unreported; the same loop with `non_blocking=True` stays quiet."""
    src = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader
        from tqdm import tqdm

        class Trainer:
            def __init__(self, model, ds, device):
                self.model = model.to(device)
                self.trainloader = DataLoader(ds, batch_size=8, pin_memory=True)
                self.device = device
                self.opt = torch.optim.Adam(model.parameters())

            def step(self, x):
                loss = self.model(x).mean()
                loss.backward()
                self.opt.step()

            def train(self):
                for e in range(10):
                    with tqdm(self.trainloader) as t:
                        for i, x in enumerate(t):
                            self.step(x.to(self.device))
                            self.step(x.to(self.device, non_blocking=True))
        """)
    found = [(f.line, f.rule) for f in lint_source(src, "train.py") if f.hot]
    assert found == [(22, "GB009")], found


def test_accelerate_hands_back_prepared_loaders_and_gathered_tensors():
    """accelerate's examples: a loader resumed with `accelerator.skip_first_batches(loader, n)` still yields device
    batches (three false GB009 on `batch.to(accelerator.device)`), and `accelerator.gather_for_metrics((preds,
    labels))` hands back the ranks' device tensors, so `print(f"{predictions}")` of them syncs every eval batch."""
    src = textwrap.dedent("""
        import torch
        from accelerate import Accelerator

        def main(model, opt, train_dl, eval_dl, resume_step):
            accelerator = Accelerator()
            model, opt, train_dl, eval_dl = accelerator.prepare(model, opt, train_dl, eval_dl)
            active = accelerator.skip_first_batches(train_dl, resume_step)
            for batch in active:
                batch.to(accelerator.device)
                loss = model(**batch).loss
                accelerator.backward(loss)
                opt.step()
            for batch in eval_dl:
                with torch.no_grad():
                    out = model(**batch)
                predictions, references = accelerator.gather_for_metrics((out.logits.argmax(-1), batch["labels"]))
                print(f"{predictions}")
        """)
    found = [(f.line, f.rule) for f in lint_source(src, "nlp.py") if f.hot]
    assert found == [(18, "GB003")], found


def test_a_step_function_handed_to_an_ignite_engine_is_a_per_step_hook(tmp_path):
    """Deep-RL-Hands-On: each chapter's `process_batch(engine, batch)` is handed to ignite's `Engine(process_batch)`,
    which runs it per batch; its loss helper's uploads and the `loss.item()` it returns were missed (130 lines at
    first sight). A def of the same shape that nothing hands to an Engine stays quiet, and so does the step function
    of a script that names no device (it trains on the CPU)."""
    found = {line for f, line, rule in _lint(tmp_path, {"dqn.py": """
        import torch
        from ignite.engine import Engine

        def main(net, opt, batches, device):
            def process_batch(engine, batch):
                opt.zero_grad()
                states = torch.tensor(batch).to(device)
                loss = net(states).mean()
                loss.backward()
                opt.step()
                return {"loss": loss.item()}

            def unused(engine, batch):
                return {"loss": net(torch.tensor(batch).to(device)).mean().item()}

            engine = Engine(process_batch)
            engine.run(batches)
        """})}
    assert {8, 12} <= found and not found & {15}, found
    cpu = _lint(tmp_path / "cpu", {"cartpole.py": """
        import torch
        from ignite.engine import Engine

        if __name__ == "__main__":
            net = torch.nn.Linear(4, 2)
            opt = torch.optim.Adam(net.parameters())

            def process_batch(engine, batch):
                loss = net(torch.tensor(batch)).mean()
                loss.backward()
                opt.step()
                return {"loss": loss.item()}

            Engine(process_batch).run([[0.0] * 4] * 10)
        """})
    assert cpu == [], cpu   # Chapter21's CartPole and MountainCar scripts: a script that names no device, on the CPU


def test_an_env_stepped_through_a_helper_function_does_not_stop_the_lint():
    """Deep-RL-Hands-On's wob play script steps its env through `step_env(env, action)`, a function; the env rule
    read `call.func.value` of it and the whole file failed (AttributeError). Its loop is checked like any other."""
    src = textwrap.dedent("""
        import torch

        def step_env(env, action):
            return env.step([action])

        def play(env, net):
            obs = env.reset()
            while True:
                action = net(torch.tensor([obs]).cuda()).argmax().item()
                obs, reward, done, info = step_env(env, action)
                if done:
                    break
        """)
    assert sorted((f.line, f.rule) for f in lint_source(src, "play.py") if f.hot) == [(10, "GB001"), (10, "GB002")]


def test_a_script_that_names_no_device_runs_on_the_gpu_only_through_files_it_imports(tmp_path):
    """Deep-RL-Hands-On's CartPole scripts never name a device, but their `optimizer.step()` and `.clear()` calls
    matched by name a KFAC optimizer and an MCTS class elsewhere in the book, whose files do, and each whole script
    was taken for GPU code (24 false findings). A script that names no device runs on the GPU through the files it
    imports (TD3's main.py and its TD3.py): those calls still count."""
    kfac = """
        import torch

        class KFACOptimizer(torch.optim.Optimizer):
            def step(self):
                for p in self.params:
                    p.data.add_(torch.ones(1).cuda())
        """
    script = """
        import torch

        if __name__ == "__main__":
            net = torch.nn.Linear(4, 2)
            optimizer = torch.optim.Adam(net.parameters())
            for batch in range(100):
                loss = net(torch.randn(8, 4)).sum()
                loss.backward()
                optimizer.step()
                print(loss.item())
        """
    assert [x for x in _lint(tmp_path / "a", {"kfac.py": kfac, "cartpole.py": script}) if x[0] == "cartpole.py"] == []
    policy = """
        import torch

        class Policy:
            def __init__(self):
                self.net = torch.nn.Linear(4, 2).to("cuda")

            def act(self, state):
                return self.net(torch.FloatTensor(state).to("cuda")).cpu().numpy()
        """
    main = """
        import numpy as np
        import policy as P

        if __name__ == "__main__":
            agent = P.Policy()
            state = np.zeros(4)
            for t in range(100):
                action = agent.act(np.array(state))
        """
    found = {(f, line) for f, line, _ in _lint(tmp_path / "b", {"policy.py": policy, "main.py": main})}
    assert ("policy.py", 9) in found, found


def test_pinned_host_data_copied_without_non_blocking_waits():
    """stylegan2-ada-pytorch draws the generator's labels on the host each iteration and copies them with
    `torch.from_numpy(np.stack(c)).pin_memory().to(device)`: pinned, but without non_blocking=True the copy still
    makes the host wait for it (and for the stream before it). With non_blocking=True it is quiet."""
    src = textwrap.dedent("""
        import numpy as np
        import torch

        def train(model, opt, n, device):
            for i in range(n):
                c = torch.from_numpy(np.stack([np.zeros(3)] * 4)).pin_memory().to(device)
                d = torch.from_numpy(np.stack([np.zeros(3)] * 4)).pin_memory().to(device, non_blocking=True)
                loss = model(c + d).sum()
                loss.backward()
                opt.step()
        """)
    found = [(f.line, f.rule, f.fix) for f in lint_source(src, "loop.py") if f.hot]
    assert [x[:2] for x in found] == [(7, "GB009")] and "pinned already" in found[0][2], found
