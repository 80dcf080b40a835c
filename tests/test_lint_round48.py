"""gobrrr lint, issue 29's round on heldout47 and heldout48 (SEDD, HRNet-pose, minimind, torch-ac; Diffusion-Models,
semseg, open_flamingo, Popular-RL-Algorithms) and two findings of this session's GPU run: each firing test beside
the neighbour that must stay quiet."""
from __future__ import annotations

from tests.lintcase import project_rules as _lint


def _rules_at(found: set[tuple[str, int, str]], name: str) -> dict[int, str]:
    return {line: rule for file, line, rule in found if file == name}


def test_one_element_written_from_a_python_number_is_a_blocking_copy(tmp_path):
    """`rewards[i] = 0.5` into a 1-d CUDA tensor copies a CPU scalar into the element, blocking (an H100 under
    torch's sync debug mode: `t[i] = 1.5`, `m[1, 2] = 0.5` and `b[i] = True` sync; `m[1] = 0`, `t[2:5] = 7` and
    `t[i] += 0.5` do not). minimind's agent trainer writes each completion's reward this way."""
    found = _rules_at(_lint(tmp_path, {"train.py": """
        import torch

        def rewards_of(completions, device="cuda"):
            rewards = torch.zeros(len(completions), device=device)
            grid = torch.zeros(4, 8, device=device)
            for idx, text in enumerate(completions):
                reward = 0.5 if text else -0.5
                rewards[idx] = max(min(reward, 3.0), -3.0)
                rewards[idx] += 0.5
                grid[1] = 0
                grid[1, idx] = 0.25
                rewards[1:3] = 7
            return rewards

        def train(model, loader, opt):
            for x, texts in loader:
                r = rewards_of(texts)
                loss = model(x.cuda(non_blocking=True)).mean() * r.sum()
                loss.backward()
                opt.step()
        """}), "train.py")
    assert found.get(9) == "GB010" and found.get(12) == "GB010", found
    assert not {10, 11, 13} & set(found), found


_CATEGORICAL_LOOP = """
    import argparse
    import torch

    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--compile", {switch})
        args = p.parse_args()
        model = torch.nn.Linear(4, 2).cuda()
        if args.compile:
            model = torch.compile(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x = torch.randn(8, 4, device="cuda")
            d = torch.distributions.Categorical(logits=model(x))
            loss = -d.log_prob(d.sample()).mean()
            loss.backward()
            opt.step()
    """


def test_a_process_that_compiles_validates_no_distribution(tmp_path):
    """torch.compile's first call turns distribution argument validation off for the whole process
    (torch/_dynamo/eval_frame.py, TorchPatcher.patch): on the H100, a Categorical that synced before a compiled
    test no longer did after it. So a project that compiles by default gets no GB013; one whose compile sits
    behind a flag that is off by default (`store_true`) still validates in its default run."""
    on = _lint(tmp_path / "on", {"train.py": _CATEGORICAL_LOOP.replace("{switch}", "default=True")})
    assert not {r for _, _, r in on} & {"GB013"}, on
    off = _rules_at(_lint(tmp_path / "off", {"train.py": _CATEGORICAL_LOOP.replace("{switch}", 'action="store_true"')}),
                    "train.py")
    assert off.get(15) == "GB013" and off.get(16) == "GB013", off


def test_a_module_compiled_outright_or_by_a_true_constant_turns_validation_off(tmp_path):
    """`model.compile()` and nanoGPT's `compile = True` ... `if compile:` both run by default."""
    body = """
        import torch
        {head}
        model = torch.nn.Linear(4, 2).cuda()
        {compile}
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            d = torch.distributions.Categorical(logits=model(torch.randn(8, 4, device="cuda")))
            loss = -d.log_prob(d.sample()).mean()
            loss.backward()
            opt.step()
        """
    cases = {"method": ("", "model.compile()"), "constant": ("compile = True", "if compile: model = torch.compile(model)"),
             "constant_off": ("compile = False", "if compile: model = torch.compile(model)")}
    found = {k: {r for _, _, r in _lint(tmp_path / k, {"t.py": body.replace("{head}", h).replace("{compile}", c)})}
             for k, (h, c) in cases.items()}
    assert "GB013" not in found["method"] and "GB013" not in found["constant"], found
    assert "GB013" in found["constant_off"], found


def test_noise_drawn_from_a_distribution_of_numbers_is_drawn_on_the_host(tmp_path):
    """`Normal(0, 1).sample(shape).cuda()` (Popular-RL-Algorithms' SAC, TD3 and DDPG policies): the noise is drawn
    on the host and copied up, blocking, per action and per update. A Normal of device tensors samples on the
    device (its std check is GB013's)."""
    found = _rules_at(_lint(tmp_path, {"sac.py": """
        import torch
        from torch.distributions import Normal

        class Policy(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(3, 2)

            def evaluate(self, state):
                mean = self.l(state)
                normal = Normal(0, 1)
                z = normal.sample(mean.shape)
                return torch.tanh(mean + z.cuda())

        def train(policy, loader, opt):
            for s in loader:
                loss = policy.evaluate(s.cuda(non_blocking=True)).sum()
                loss.backward()
                opt.step()
        """}), "sac.py")
    assert found.get(14) == "GB010", found


_RATED_SCRIPT = """
    import argparse
    import torch

    def train(model, loader, opt, args):
        for step, x in enumerate(loader):
            loss = model(x.cuda(non_blocking=True)).mean()
            loss.backward()
            opt.step()
            if step % args.log_interval == 0:
                print(loss.item())

    if __name__ == "__main__":
        p = argparse.ArgumentParser()
        p.add_argument("--log_interval", type=int, default=DEFAULT)
    """


def test_a_scripts_own_parser_decides_its_own_logging_rate(tmp_path):
    """minimind's RL trainers parse `--log_interval` with default 1 while its pretraining script says 100: the
    project-wide reading took the name as a rate, so the RL trainers' per-step `.item()` reads went unreported."""
    found = _lint(tmp_path, {"train_grpo.py": _RATED_SCRIPT.replace("DEFAULT", "1"),
                             "train_pretrain.py": _RATED_SCRIPT.replace("DEFAULT", "100")})
    assert ("train_grpo.py", 11, "GB002") in found, found
    assert not [f for f in found if f[0] == "train_pretrain.py" and f[1] == 11], found


def test_a_loop_over_video_frames_that_skips_some_runs_its_model_on_the_others(tmp_path):
    """HRNet's demos: `while vidcap.isOpened(): ret, frame = vidcap.read()` is a step per frame, and the body after
    `if count % skip != 0: continue` is each kept frame's work, not a log written every N frames."""
    found = _rules_at(_lint(tmp_path, {"demo.py": """
        import cv2
        import torch

        CTX = torch.device("cuda")

        def main(pose_model, path, skip):
            vidcap = cv2.VideoCapture(path)
            count = 0
            while vidcap.isOpened():
                ret, frame = vidcap.read()
                count += 1
                if count % skip != 0:
                    continue
                x = torch.from_numpy(frame).float().to(CTX)
                out = pose_model(x)
                pts = out.cpu().numpy()
                if count % 100 != 0:
                    continue
                print(out.sum().item())
        """}), "demo.py")
    assert found.get(15) == "GB001" and found.get(17) == "GB002", found
    assert 20 not in found, found


def test_items_taken_from_a_host_batch_are_stacked_on_the_host(tmp_path):
    """open_flamingo builds its MMC4 labels from `torch.stack([x[0] for x in batch[1]])`, a host tensor, in a
    per-sample Python loop before one upload: the loop's conditions are host ones, the upload is the copy."""
    found = _rules_at(_lint(tmp_path, {"train.py": """
        import torch

        def train(model, loader, opt):
            for images, pairs in loader:
                images = images.to("cuda", non_blocking=True)
                input_ids = torch.stack([x[0] for x in pairs])
                labels = input_ids.clone()
                for i in range(labels.shape[0]):
                    j = 0
                    while j < labels.shape[1] and labels[i][j] != 7:
                        labels[i][j] = -100
                        j += 1
                loss = model(images, labels.to("cuda")).mean()
                loss.backward()
                opt.step()
        """}), "train.py")
    assert 11 not in found and found.get(14) == "GB010", found


def test_a_token_id_from_a_tokenizer_is_an_int_index(tmp_path):
    """`tokenizer("<image>", add_special_tokens=False)["input_ids"][-1]` is a Python int: `mask[media_id]` selects a
    row on the device and copies nothing (open_flamingo masks the embedding gradient this way every step), where
    an index built on the host (`torch.arange(3)`) is copied up."""
    found = _rules_at(_lint(tmp_path, {"train.py": """
        import torch

        def train(model, tokenizer, loader, opt):
            media_id = tokenizer("<image>", add_special_tokens=False)["input_ids"][-1]
            for x in loader:
                loss = model(x.cuda(non_blocking=True)).mean()
                loss.backward()
                grad = model.weight.grad
                zero_mask = torch.zeros_like(grad)
                zero_mask[media_id] = torch.ones_like(zero_mask[media_id])
                first = zero_mask[torch.arange(3)]
                opt.step()
        """}), "train.py")
    assert 11 not in found and found.get(12) == "GB011", found


def test_not_of_a_tensor_in_an_assignment_syncs_where_it_is_evaluated(tmp_path):
    """`use_cached = self.cached and not locations.any()` calls bool() on the tensor at that line; the later
    `if not use_cached:` tests a Python bool (open_flamingo's language model, per generated token)."""
    found = _rules_at(_lint(tmp_path, {"lm.py": """
        import torch

        def train(model, loader, opt, cached):
            for x in loader:
                m = model(x.cuda(non_blocking=True))
                use_cached = cached and not (m > 0).any()
                if not use_cached:
                    m = m * 2
                loss = m.sum()
                loss.backward()
                opt.step()
        """}), "lm.py")
    assert found.get(7) == "GB007" and 8 not in found, found


def test_the_device_of_a_host_image_is_the_cpu(tmp_path):
    """BiSeNet's ToTensor: `dtype, device = im.dtype, im.device` of a tensor made by from_numpy, then
    `torch.as_tensor(mean, device=device)`: built on the CPU, no copy."""
    found = _lint(tmp_path, {"demo.py": """
        import cv2
        import numpy as np
        import torch

        def to_tensor(frame, mean):
            im = torch.from_numpy(frame.astype(np.float32))
            dtype, device = im.dtype, im.device
            m = torch.as_tensor(mean, dtype=dtype, device=device)
            return im.sub_(m)

        def main(net, path):
            cap = cv2.VideoCapture(path)
            while True:
                ret, frame = cap.read()
                out = net(to_tensor(frame, (0.5, 0.5, 0.5)).cuda())
        """})
    assert not [f for f in found if f[1] == 9], found
