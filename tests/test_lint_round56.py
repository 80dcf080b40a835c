"""gobrrr lint, issue 29's round 56 on heldout64-65's first sight (Firefly, retinanet-examples, pydreamer,
self-rewarding-lm-pytorch): each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, project_rules, rules


def test_a_tokenizer_or_config_loaded_with_from_pretrained_is_no_model():
    """Firefly's chat script loads its tokenizer in a helper (`tokenizer = AutoTokenizer.from_pretrained(path)`):
    every `from_pretrained` was taken for a model maker, so the name `tokenizer` became a module, the ids its
    `encode` returns device tensors, and the per-turn upload `build_prompt(...).to(model.device)` of the host
    tensor built from them went unreported. A config loaded the same way holds Python values: no condition on it
    is a sync."""
    src = textwrap.dedent("""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        def load_tokenizer(path):
            tokenizer = AutoTokenizer.from_pretrained(path, use_fast=False)
            return tokenizer

        def build_prompt(tokenizer, history):
            input_ids = []
            for message in history:
                input_ids += tokenizer.encode(message, add_special_tokens=False)
            return torch.tensor([input_ids], dtype=torch.long)

        def main(path):
            model = AutoModelForCausalLM.from_pretrained(path, device_map="auto")
            config = AutoConfig.from_pretrained(path)
            tokenizer = load_tokenizer(path)
            history = []
            while True:
                history.append(input("> "))
                input_ids = build_prompt(tokenizer, history).to(model.device)
                if config.use_cache:
                    input_ids = input_ids[:, -512:]
                outputs = model.generate(input_ids=input_ids, max_new_tokens=64)
                history.append(tokenizer.decode(outputs[0]))
        """)
    found = rules(src, "chat.py")
    assert (line_of(src, "build_prompt(tokenizer, history).to"), "GB010") in found, found
    assert not any(line == line_of(src, "if config.use_cache") for line, _ in found), found


def test_the_cpu_fallback_after_a_gpu_path_that_returns_is_not_device_code():
    """retinanet-examples' `decode` and `nms`: `if torch.cuda.is_available(): return decode_cuda(...)`, then a
    pure-torch fallback for machines without CUDA. The fallback's `.nonzero()` and `torch.tensor(..., device=)`
    were reported as per-step syncs (11 false findings at first sight); they never run where the GPU is. The same
    body without the guard is device code and keeps its finding."""
    src = textwrap.dedent("""
        import torch
        from ._C import decode as decode_cuda

        def decode(scores, threshold):
            if torch.cuda.is_available():
                return decode_cuda(scores.float(), threshold)
            keep = (scores >= threshold).nonzero().view(-1)
            return scores[keep]

        def decode_plain(scores, threshold):
            keep = (scores > threshold).nonzero().view(-1)
            return scores[keep]

        def evaluate(model, loader, device):
            model.eval()
            for images in loader:
                scores = model(images.to(device, non_blocking=True))
                decode(scores, 0.05)
                decode_plain(scores, 0.05)
        """)
    found = rules(src, "infer.py")
    fallback, plain = line_of(src, "(scores >= threshold)"), line_of(src, "(scores > threshold)")
    assert (plain, "GB008") in found and not any(line == fallback for line, _ in found), found


def test_a_lambda_mapped_over_a_batch_copies_each_of_its_tensors():
    """pydreamer: `obs = map_structure(batch, lambda x: x.to(device))` moves a pinned batch to the GPU without
    non_blocking every step; the lambda's parameter was unknown, so the blocking copy went unreported (and so did
    `tree_map(lambda x: x.to(device), batch)`). A lambda mapped over the model's outputs, already on the device,
    copies nothing."""
    src = textwrap.dedent("""
        import torch
        from torch.utils.data import DataLoader
        from torch.utils._pytree import tree_map

        def map_structure(data, f):
            if isinstance(data, dict):
                return {k: map_structure(v, f) for k, v in data.items()}
            return f(data)

        def train(model, opt, dataset, device):
            loader = DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)
            for batch in loader:
                obs = map_structure(batch, lambda x: x.to(device))
                out = model(obs)
                out = tree_map(lambda t: t.to(device), out)
                loss = out["loss"].mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """)
    found = rules(src)
    assert (line_of(src, "lambda x: x.to(device)"), "GB009") in found, found
    assert not any(line == line_of(src, "lambda t: t.to(device)") for line, _ in found), found


def test_a_script_that_names_no_device_keeps_its_policy_on_the_cpu(tmp_path):
    """pydreamer's generator.py runs its own program: it builds the world model, loads weights with
    `map_location='cpu'` and steps environments on the CPU; the `.item()` calls in its policy's `__call__` were kept
    as a per-step hook's findings because the project trains on the GPU elsewhere (3 false findings). A script
    that imports a module which picks CUDA still has its hook's reads reported."""
    policy = """
        import torch

        class NetworkPolicy:
            def __init__(self, model):
                self.model = model

            def __call__(self, obs):
                with torch.no_grad():
                    value = self.model(torch.from_numpy(obs))
                return value.argmax().item()

        def run(env, model, steps):
            policy = NetworkPolicy(model)
            obs = env.reset()
            for _ in range(steps):
                obs, reward, done, info = env.step(policy(obs))

        if __name__ == "__main__":
            run(make_env(), build_model(), 1000)
        """
    trainer = """
        import torch
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

        def train(model, opt, loader):
            model.to(device)
            for x in loader:
                loss = model(x.to(device, non_blocking=True)).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        """
    found = {(f, line) for f, line, _ in project_rules(tmp_path, {
        "generator.py": policy, "gpu_generator.py": "from train import device\n" + textwrap.dedent(policy),
        "train.py": trainer})}
    assert not any(f == "generator.py" for f, _ in found), found
    assert ("gpu_generator.py", 12) in found, found


def test_a_tokenizer_the_object_was_handed_makes_host_ids():
    """self-rewarding-lm-pytorch: `reward_prompt = self.tokenizer_encode(prompt_str).to(device)` per candidate
    response; the callable the trainer was handed was unknown, so the blocking upload of its host ids went
    unreported. An encoder module called the same way returns device tensors: its `.to(device)` copies nothing."""
    src = textwrap.dedent("""
        import torch

        class Trainer:
            def __init__(self, model, encoder, tokenizer_encode, device):
                self.model, self.encoder = model, encoder
                self.tokenizer_encode = tokenizer_encode
                self.device = device

            def judge(self, responses):
                rewards = []
                for text in responses:
                    prompt = self.tokenizer_encode(text).to(self.device)
                    feats = self.encoder(prompt).to(self.device)
                    rewards.append(self.model(feats).mean())
                return torch.stack(rewards)

            def train(self, batches, opt):
                for batch in batches:
                    loss = self.judge(batch).sum()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        """)
    found = rules(src, "trainer.py")
    assert (line_of(src, "self.tokenizer_encode(text).to"), "GB010") in found, found
    assert not any(line == line_of(src, "self.encoder(prompt).to") for line, _ in found), found


def test_a_sampler_picked_from_a_table_of_samplers_learns_its_arguments():
    """point-e: `sample_fn = {"heun": sample_heun, "dpm": sample_dpm}[sampler]`, then `for obj in sample_fn(denoiser,
    x_T, sigmas)`: the call named no def, so the samplers' loops never learnt that `sigmas` is a device schedule, and
    `if sigmas[i + 1] == 0:` (a read per denoising step) went unreported. A sampler handed a host schedule stays quiet."""
    src = textwrap.dedent("""
        import torch as th

        def sample_heun(denoiser, x, sigmas):
            for i in range(len(sigmas) - 1):
                denoised = denoiser(x, sigmas[i])
                yield {"x": x}
                if sigmas[i + 1] == 0:
                    x = denoised
                else:
                    x = x + (denoised - x) * sigmas[i + 1]

        def sample_euler(denoiser, x, sigmas):
            for i in range(len(sigmas) - 1):
                x = denoiser(x, sigmas[i])
                yield {"x": x}

        def karras_sample(model, shape, steps, device, sampler="heun", on_host=False):
            sigmas = th.linspace(1, 0, steps, device="cpu" if on_host else device)
            sample_fn = {"heun": sample_heun, "euler": sample_euler}[sampler]
            for obj in sample_fn(model, th.randn(*shape, device=device), sigmas):
                yield obj
        """)
    found = rules(src, "k_diffusion.py")
    assert (line_of(src, "if sigmas[i + 1] == 0"), "GB007") in found, found
    quiet = src.replace('device="cpu" if on_host else device', 'device="cpu"')
    assert not any(line == line_of(quiet, "if sigmas[i + 1] == 0") for line, _ in rules(quiet, "k_diffusion.py"))


def test_a_trainers_prepare_inputs_runs_once_per_optimizer_step():
    """trl's on-policy distillation trainer overrides `_prepare_inputs`, which transformers' Trainer calls for every
    micro-batch, and refills its buffer under `if self._buffer_step % buffer_steps == 0` with `buffer_steps =
    self.args.gradient_accumulation_steps`: once per optimizer step, which is a step. Its per-slice uploads were
    unreported; a branch every `logging_steps` stays rare."""
    src = textwrap.dedent("""
        import torch
        from transformers import Trainer

        class DistillTrainer(Trainer):
            def _prepare_inputs(self, batch):
                buffer_steps = self.args.gradient_accumulation_steps
                if self._buffer_step % buffer_steps == 0:
                    self._fill(batch)
                if self.state.global_step % self.args.logging_steps == 0:
                    self._log(batch)
                self._buffer_step += 1
                return self._buffered

            def _fill(self, batch):
                device = self.accelerator.device
                lengths = [len(p) for p in batch["prompts"]]
                self._buffered = torch.tensor(lengths, device=device)

            def _log(self, batch):
                self.extra = torch.tensor([len(batch["prompts"])], device=self.accelerator.device)
        """)
    found = rules(src, "distill.py")
    assert (line_of(src, "torch.tensor(lengths, device=device)"), "GB010") in found, found
    assert not any(line == line_of(src, "self.extra = ") for line, _ in found), found


def test_a_chat_loop_that_streams_generate_in_a_thread_runs_the_model():
    """minimind's web demo: each tool-call round tokenizes the new prompt, copies it up and starts
    `Thread(target=model.generate, kwargs=...)`; with the tokenizer no longer taken for a model, the loop had no
    model call left and its per-round upload went unreported. A loop that only formats text stays quiet."""
    src = textwrap.dedent("""
        from threading import Thread
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer

        device = "cuda" if torch.cuda.is_available() else "cpu"

        def chat(path, rounds):
            model = AutoModelForCausalLM.from_pretrained(path).to(device)
            tokenizer = AutoTokenizer.from_pretrained(path)
            text = ""
            for _ in range(rounds):
                inputs = tokenizer(text, return_tensors="pt").to(device)
                streamer = TextIteratorStreamer(tokenizer)
                Thread(target=model.generate, kwargs={"input_ids": inputs.input_ids, "streamer": streamer}).start()
                text = "".join(streamer)
            for _ in range(rounds):
                ids = tokenizer(text, return_tensors="pt").to(device)
                text = text.strip()
        """)
    found = rules(src, "web_demo.py")
    assert (line_of(src, 'inputs = tokenizer(text, return_tensors="pt").to(device)'), "GB009") in found, found
    assert not any(line == line_of(src, "ids = tokenizer(text") for line, _ in found), found


def test_a_remainder_of_sizes_pads_a_shape_it_is_no_rate():
    """Time-Series-Library's TimesNet pads each period that does not divide the window:
    `if (self.seq_len + self.pred_len) % period != 0: padding = torch.zeros([...]).to(x.device)`, built on the host
    and copied per period per step. A remainder was always read as a rate limit (`step % every == 0`), so the
    branch was taken for a rare one; a branch on a step counter's remainder stays rare."""
    src = textwrap.dedent("""
        import torch
        from torch import nn

        class TimesBlock(nn.Module):
            def __init__(self, seq_len, pred_len, k):
                super().__init__()
                self.seq_len, self.pred_len, self.k = seq_len, pred_len, k
                self.steps = 0

            def forward(self, x, periods):
                out = x
                for i in range(self.k):
                    period = periods[i]
                    if (self.seq_len + self.pred_len) % period != 0:
                        length = ((self.seq_len + self.pred_len) // period + 1) * period
                        pad = torch.zeros([x.shape[0], length - self.seq_len - self.pred_len, x.shape[2]]).to(x.device)
                        out = torch.cat([out, pad], dim=1)
                self.steps += 1
                if self.steps % 100 == 0:
                    self.marker = torch.zeros(1).to(x.device)
                return out
        """)
    found = rules(src, "TimesNet.py")
    assert (line_of(src, "pad = torch.zeros("), "GB001") in found, found
    assert not any(line == line_of(src, "self.marker = ") for line, _ in found), found


def test_an_episode_loop_around_the_env_loop_is_not_a_step_because_reset_starts_it(tmp_path):
    """rl_algorithms: an Atari wrapper's `reset` steps its env (FIRE to start), so every `self.env.reset()` was taken
    for an environment step and the episode loop around the real env loop became a step loop: the episode's log
    line, `print("... %f" % total_loss)` of numpy losses, was reported as a per-step format (10 false findings at
    first sight). The env loop inside keeps its round trip."""
    wrappers = """
        class FireResetEnv:
            def __init__(self, env):
                self.env = env

            def reset(self):
                self.env.reset()
                obs, reward, done, info = self.env.step(1)
                return obs
        """
    agent = """
        import numpy as np
        import torch

        class Agent:
            def __init__(self, env, actor, learner, memory, device):
                self.env, self.actor, self.learner, self.memory, self.device = env, actor, learner, memory, device

            def select_action(self, state):
                return self.actor(torch.as_tensor(state, device=self.device)).detach().cpu().numpy()

            def write_log(self, log_value):
                i, loss = log_value
                total_loss = loss.sum()
                print("episode %d total loss %f" % (i, total_loss))

            def train(self, episodes):
                for i_episode in range(episodes):
                    state = self.env.reset()
                    done, losses = False, []
                    while not done:
                        action = self.select_action(state)
                        state, reward, done, _ = self.env.step(action)
                        losses.append(self.learner.update_model(self.memory.sample()))
                    log_value = (i_episode, np.vstack(losses).mean(axis=0))
                    self.write_log(log_value)
        """
    found = {(f, line, rule) for f, line, rule in project_rules(tmp_path, {"wrappers.py": wrappers, "agent.py": agent})}
    assert not any(rule == "GB003" for _, _, rule in found), found
    assert any(f == "agent.py" and rule == "GB014" for f, _, rule in found), found


def test_a_move_loop_that_steps_each_environment_in_an_inner_loop_is_the_step():
    """EfficientZero's self-play: `while not dones.all(): obs = torch.from_numpy(stack).to(device); ...
    for i in range(env_nums): obs, reward, done, info = envs[i].step(actions[i])`. The move loop stepped no
    environment at its own level, so its per-move upload went unreported (it was found before only because an
    Atari wrapper's `reset` was taken for a step). A loop whose inner loop only resets the environments is no step."""
    src = textwrap.dedent("""
        import numpy as np
        import torch

        def self_play(model, envs, env_nums, device):
            obs = [env.reset() for env in envs]
            dones = np.zeros(env_nums, dtype=bool)
            while not dones.all():
                stack = torch.from_numpy(np.array(obs)).to(device).float()
                actions = model(stack).argmax(-1).cpu().numpy()
                for i in range(env_nums):
                    obs[i], reward, dones[i], info = envs[i].step(actions[i])
            for episode in range(3):
                fresh = torch.from_numpy(np.array(obs)).to(device).float()
                for i in range(env_nums):
                    obs[i] = envs[i].reset()
        """)
    found = rules(src, "selfplay_worker.py")
    assert (line_of(src, "stack = torch.from_numpy"), "GB001") in found, found
    assert not any(line == line_of(src, "fresh = torch.from_numpy") for line, _ in found), found


def test_a_method_that_loads_a_tokenizer_makes_no_host_ids():
    """The tokenizer rule of this round, first written as any `self.<...>_tokenizer(...)`, took sd-scripts'
    `self._load_tokenizer(CLIPTokenizer, path)` for a tokenizer call: the tokenizer object became host data, its
    `eos_token_id` a host tensor, and `ids_chunk[-1] = tokenizer.eos_token_id` a copy. Loading one is not
    tokenizing; `self.tokenizer(text)` still makes host ids."""
    src = textwrap.dedent("""
        import torch
        from transformers import CLIPTokenizer

        class Strategy:
            def __init__(self, path, device):
                self.tokenizer = self._load_tokenizer(CLIPTokenizer, path)
                self.device = device

            def _load_tokenizer(self, cls, path):
                return cls.from_pretrained(path)

            def tokenize(self, texts, model):
                out = []
                for text in texts:
                    ids = self.tokenizer(text, return_tensors="pt").input_ids
                    ids[0, -1] = self.tokenizer.eos_token_id
                    out.append(model(ids.to(self.device)))
                return out
        """)
    found = rules(src, "strategy.py")
    assert (line_of(src, "model(ids.to(self.device))"), "GB009") in found, found
    assert not any(line == line_of(src, "ids[0, -1] = ") for line, _ in found), found
