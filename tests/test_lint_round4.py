"""gobrrr lint, issue 29's fourth round: shapes met while reading the dev3 repositories (a diffusion
sampler library, single-file RL scripts, a detector's label assignment, an LLM fine-tuning loop),
each from a minimal example in the default run. The false positives they showed, which must stay
quiet, are in test_lint_round4_quiet.py."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.check import lint_paths, lint_source

HEAD = "import torch\nimport numpy as np\nimport torch.nn as nn\nimport torch.nn.functional as F\nDEVICE = 'cuda'\n"


def round_trip(body: str) -> set[int]:
    """The lines a snippet's GB014 names in the functions its env loop calls (`covers_at`)."""
    out = lint_source(HEAD + textwrap.dedent(body), "train.py")
    return {int(a.rsplit(":", 1)[1]) - HEAD.count("\n") for f in out if f.rule == "GB014" for a in f.covers_at}


def default(body: str, **kw) -> list[tuple[str, int]]:
    """(rule, line) of the default run on a snippet; line 1 is the snippet's first line."""
    out = lint_source(HEAD + textwrap.dedent(body), "train.py", **kw)
    return sorted((f.rule, f.line - HEAD.count("\n")) for f in out)



# -- what a parameter holds
def test_a_forward_parameter_defaulting_to_none_is_still_a_tensor():
    body = """
    class Head(nn.Module):
        def forward(self, x, labels=None):
            n = (labels.sum(dim=2) > 0).sum(dim=1)
            for i in range(x.shape[0]):
                k = int(n[i])
            return x
    """
    assert ("GB002", 6) in default(body)   # `labels=None` is a tensor or nothing, not a number


# -- branches a call never takes
def test_a_branch_on_a_parameter_the_call_leaves_at_its_default_is_skipped():
    body = """
    class Head(nn.Module):
        def forward(self, x):
            return self.assign(x).sum()

        def assign(self, x, mode="gpu", mask=None):
            if mode == "cpu":
                x = x.cpu()
            if mask is not None and x.any():
                x = x[mask]
            return x.sum().item()
    """
    assert default(body) == [("GB002", 11)]   # only the line that runs on this call


def test_a_branch_the_call_takes_is_walked():
    body = """
    class Head(nn.Module):
        def forward(self, x):
            return self.assign(x, "cpu")

        def assign(self, x, mode="gpu"):
            if mode == "cpu":
                x = x.cpu()
            return x
    """
    assert ("GB002", 8) in default(body)


# -- data-dependent shapes
def test_a_tensor_assigned_through_a_boolean_mask_syncs_a_scalar_does_not():
    body = """
    def train(model, loader, opt):
        for x in loader:
            out = model(x)
            fg = out > 0
            inside = out.sum(0) > 1
            fg[fg.clone()] = inside
            out[fg] = 0.0
            out.mean().backward()
            opt.step()
    """
    assert default(body) == [("GB008", 7)]   # index_put_ with a tensor value takes the nonzero path


def test_a_device_scalar_handed_over_as_a_count_or_size():
    body = """
    class Assigner(nn.Module):
        def forward(self, cost, ious):
            ks = torch.clamp(ious.sum(1).int(), min=1)
            n = (ious > 0).sum()
            for g in range(cost.shape[0]):
                _, pos = torch.topk(cost[g], k=ks[g], largest=False)
            for j in range(n):
                pass
            buf = ks.new_zeros((n, 4))
            return cost.view(-1, cost.shape[1])
    """
    assert default(body) == [("GB002", 7), ("GB002", 8), ("GB002", 10)]


# -- rare branches
def test_an_option_named_like_logging_runs_every_step_once_it_is_on():
    body = """
    def train(model, loader, opt, cfg, tb_writer=None):
        for x in loader:
            loss = model(x).mean()
            if cfg.save_metrics:
                step_losses.append(loss.detach().float().item())
            if tb_writer is not None:
                print(float(loss))
            if cfg.save_model:
                torch.save(model.state_dict(), f"{loss.item()}.pt")
            if step % cfg.log_every == 0:
                print(loss.item())
            loss.backward()
            opt.step()
    """
    assert default(body) == [("GB002", 6), ("GB002", 8)]   # the save and the rate-limited print stay rare


def test_a_tracker_logging_a_dict_of_tensors_every_step():
    body = """
    def train(model, loader, opt, wandb_run, accelerator):
        for x in loader:
            loss = model(x).mean()
            wandb_run.log({"train/loss": loss.detach().float(), "step": 1})
            accelerator.log({"loss": loss}, step=1)
            model.log("loss", loss)
            loss.backward()
            opt.step()
    """
    assert default(body) == [("GB003", 5), ("GB003", 6)]


def test_masked_writes_that_take_the_nonzero_path():
    body = """
    def train(model, loader, opt):
        for x in loader:
            m = model(x)
            multiple = m.sum(0) > 1
            m[:, multiple] *= 0
            m[m.argmin(0), multiple] = 1
            m[multiple] = 0
            m[multiple, :] = 0
            m.mean().backward()
            opt.step()
    """
    assert default(body) == [("GB008", 6), ("GB008", 7)]   # the last two are masked_fill: no sync


def test_empty_cache_and_a_device_named_by_an_f_string_in_the_step():
    body = """
    def train(model, loader, opt, rank):
        for batch in loader:
            for key in batch.keys():
                batch[key] = batch[key].to(torch.device(f"xpu:{rank}"))
            loss = model(**batch).loss
            torch.cuda.empty_cache()
            loss.backward()
            opt.step()
    """
    assert default(body) == [("GB004", 7), ("GB009", 5)]


def test_masks_appended_per_image_then_concatenated_are_a_mask():
    body = """
    def train(model, loader, opt):
        for x in loader:
            out = model(x)
            fg_masks = []
            for i in range(out.shape[0]):
                fg_masks.append(out[i] > 0)
            fg = torch.cat(fg_masks, 0)
            loss = out.view(-1)[fg].sum()
            loss.backward()
            opt.step()
    """
    assert default(body) == [("GB008", 9)]


# -- syncs inside torch that a line causes
def test_a_registered_buffer_is_a_tensor_and_normal_sample_checks_its_std():
    body = """
    from torch.distributions import Normal

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("action_scale", torch.ones(3))

        def act(self, x):
            mean, std = self(x)
            probs = Normal(mean, std, validate_args=False)
            return probs.sample(), probs.rsample()

    def rollout(actor, env, obs):
        for step in range(100):
            a = actor(obs) + torch.normal(0, actor.action_scale * 0.1)
            a2, _ = actor.act(obs)
            obs, r, done, info = env.step(a)
    """
    assert default(body) == [("GB013", 12), ("GB013", 16)]   # rsample() checks nothing


def test_a_sampler_loop_over_a_wrapped_zip_of_device_steps():
    body = """
    def sample(net, latents, S_min, S_max):
        x = latents
        t_steps = torch.linspace(1, 0, 18, device=latents.device)
        for i, (t_cur, t_next) in tqdm.tqdm(list(enumerate(zip(t_steps[:-1], t_steps[1:]))), unit='step'):
            gamma = 0.1 if S_min <= t_cur <= S_max else 0
            x = net(x, t_cur + gamma)
        return x
    """
    assert ("GB007", 6) in default(body)


def test_if_x_is_none_with_no_x_passed_runs_on_every_such_call():
    body = """
    from torch.distributions import Normal
    class Agent(nn.Module):
        def get_action_and_value(self, x, action=None):
            mean = self.actor(x)
            probs = Normal(mean, mean.exp(), validate_args=False)
            if action is None:
                action = probs.sample()
            return action

    def rollout(agent, env, obs):
        for step in range(100):
            action = agent.get_action_and_value(obs)
            obs, r, done, info = env.step(action)
    """
    assert default(body) == [("GB013", 8)]


def test_a_helper_mapped_over_sampled_arrays_and_the_return_its_call_takes():
    body = """
    class Buffer:
        def __init__(self, device):
            self.device = device
            self.obs = np.zeros((1000, 4))

        def to_torch(self, array, copy=True):
            if copy:
                return torch.tensor(array, device=self.device)
            return torch.as_tensor(array, device=self.device)

        def sample(self, n):
            idx = np.random.randint(0, 1000, size=n)
            return tuple(map(self.to_torch, (self.obs[idx], self.obs[idx])))

    def train(model, opt):
        rb = Buffer(DEVICE)
        for step in range(1000):
            obs, nxt = rb.sample(32)
            model(obs).mean().backward()
            opt.step()
    """
    assert default(body) == [("GB010", 9)]   # line 10 never runs with copy=True


# -- host data moved per call
def test_grids_built_on_the_host_then_typed_like_a_device_tensor():
    body = """
    def meshgrid(*tensors):
        return torch.meshgrid(*tensors, indexing="ij")

    class Head(nn.Module):
        def forward(self, xin):
            out = self.conv(xin[0])
            strides = torch.zeros(1, out.shape[1]).fill_(8).type_as(xin[0])
            return self.decode(out, dtype=xin[0].type())

        def decode(self, out, dtype):
            grids = []
            for h, w in self.hw:
                yv, xv = meshgrid([torch.arange(h), torch.arange(w)])
                grids.append(torch.stack((xv, yv), 2).view(1, -1, 2))
            grids = torch.cat(grids, dim=1).type(dtype)
            return out + grids
    """
    assert default(body) == [("GB001", 8), ("GB010", 16)]


# -- across files
def test_a_helper_reached_through_a_star_import_of_a_package(tmp_path):
    pkg = tmp_path / "det" / "utils"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .boxes import *\n")
    (pkg / "boxes.py").write_text(HEAD + textwrap.dedent("""
        def postprocess(prediction, conf_thre=0.7):
            out = []
            for image_pred in prediction:
                keep = (image_pred[:, 4] >= conf_thre).squeeze()
                out.append(image_pred[keep])
            return out
        """))
    (tmp_path / "det" / "evaluate.py").write_text(HEAD + textwrap.dedent("""
        from det.utils import postprocess
        def evaluate(model, loader):
            for imgs, ids in loader:
                outputs = postprocess(model(imgs.to(DEVICE, non_blocking=True)))
        """))
    found = {(Path(f.path).name, f.line - HEAD.count("\n"), f.rule) for f in lint_paths([tmp_path])}
    assert ("boxes.py", 6, "GB008") in found


def test_objects_built_from_a_config_are_found_by_their_class_or_keywords():
    body = """
    class AugmentPipe:
        def __call__(self, images):
            margin = images.flatten(1).max(dim=1).values.ceil().to(torch.int32)
            m0, m1 = margin[0], margin[1]
            return F.pad(images, pad=[m0, m1, m0, m1])

    class EDMLoss:
        def __call__(self, net, images, labels=None, augment_pipe=None):
            y = augment_pipe(images)
            return (net(y) - y) ** 2

    def train(ddp, it, opt, loss_fn, augment_pipe):
        while True:
            images, labels = next(it)
            loss = loss_fn(net=ddp, images=images, labels=labels, augment_pipe=augment_pipe)
            loss.sum().backward()
            opt.step()
    """
    assert default(body) == [("GB002", 6)]   # F.pad reads each 0-d device int of the padding


def test_a_delayed_update_made_up_in_a_loop_is_training_not_a_rare_branch():
    body = """
    def train(actor, qf, q_opt, actor_opt, rb, args):
        for global_step in range(args.total):
            data = rb.sample(256)
            q_loss = qf(data).mean()
            q_opt.zero_grad()
            q_loss.backward()
            q_opt.step()
            if global_step % args.policy_frequency == 0:
                for _ in range(args.policy_frequency):
                    actor_loss = -qf(actor(data)).mean()
                    actor_opt.zero_grad()
                    actor_loss.backward()
                    actor_opt.step()
                    alpha = actor_loss.exp().item()
            if global_step % 100 == 0:
                print(q_loss.item())
    """
    assert default(body) == [("GB002", 15)]


def test_a_library_sampler_learns_its_arguments_from_the_script_that_calls_it(tmp_path):
    (tmp_path / "sampling.py").write_text(HEAD + textwrap.dedent("""
        def sample_euler(model, x, sigmas, s_tmin=0.0, s_tmax=float('inf')):
            for i in range(len(sigmas) - 1):
                gamma = 0.1 if s_tmin <= sigmas[i] <= s_tmax else 0.0
                denoised = model(x, sigmas[i] * (gamma + 1))
                x = x + (sigmas[i + 1] - sigmas[i]) * denoised
            return x
        """))
    (tmp_path / "generate.py").write_text(HEAD + textwrap.dedent("""
        import sampling
        def main(model, n_batches):
            sigmas = torch.linspace(80, 0, 19, device=DEVICE)
            for b in range(n_batches):
                x = torch.randn(4, 3, 32, 32, device=DEVICE) * sigmas[0]
                sampling.sample_euler(model, x, sigmas)
        """))
    found = {(Path(f.path).name, f.line - HEAD.count("\n"), f.rule) for f in lint_paths([tmp_path])}
    assert ("sampling.py", 4, "GB007") in found   # sigmas is a device tensor: each step's condition syncs


def test_a_sampler_called_through_a_package_alias_and_its_schedule_helper(tmp_path):
    pkg = tmp_path / "kdiff"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import sampling\n")
    (pkg / "sampling.py").write_text(HEAD + textwrap.dedent("""
        def get_sigmas(n, device="cpu"):
            return torch.cat([torch.linspace(80, 0.1, n), torch.zeros(1)]).to(device)

        def sample_euler(model, x, sigmas):
            for i in range(len(sigmas) - 1):
                denoised = model(x, sigmas[i])
                if sigmas[i + 1] > 0:
                    x = x + (sigmas[i + 1] - sigmas[i]) * denoised
            return x
        """))
    (tmp_path / "sample.py").write_text(HEAD + textwrap.dedent("""
        import kdiff as K
        def main(model, n):
            sigmas = K.sampling.get_sigmas(50, device=DEVICE)
            for b in range(n):
                x = torch.randn(4, 3, 32, 32, device=DEVICE) * sigmas[0]
                K.sampling.sample_euler(model, x, sigmas)
        """))
    found = {(Path(f.path).name, f.line - HEAD.count("\n"), f.rule) for f in lint_paths([tmp_path])}
    assert ("sampling.py", 8, "GB007") in found


def test_a_normal_kept_on_self_is_sampled_every_rollout_step():
    body = """
    from torch.distributions import Normal
    class ActorCritic(nn.Module):
        def update_distribution(self, obs):
            mean = self.actor(obs)
            self.distribution = Normal(mean, mean * 0.0 + self.std, validate_args=False)

        def act(self, obs):
            self.update_distribution(obs)
            return self.distribution.sample()

    def rollout(policy, env, obs):
        for step in range(24):
            actions = policy.act(obs)
            obs, rewards, dones, infos = env.step(actions)
    """
    assert ("GB013", 10) in default(body)


def test_what_a_transform_makes_of_a_numpy_image_is_copied_from_the_host():
    body = """
    from PIL import Image
    def demo(model, transforms, paths, device):
        for path in paths:
            image = np.array(Image.open(path).convert("RGB"))
            images = transforms(image)[0].unsqueeze(0)
            result = model(images.to(device))[0]
    """
    assert default(body) == [("GB010", 7)]


def test_device_scalars_as_slice_bounds():
    body = """
    class PostProcess(nn.Module):
        def forward(self, outputs):
            masks = outputs["pred_masks"]
            sizes = (masks > 0).sum(-1)
            out = []
            for i in range(masks.shape[0]):
                h, w = sizes[i, 0], sizes[i, 1]
                out.append(masks[i, :h, :w])
                out.append(masks[i, :4])
            return out
    """
    assert default(body) == [("GB002", 9)]


def test_a_hook_is_walked_again_when_a_call_types_parameters_its_names_did_not():
    body = """
    class PostProcess(nn.Module):
        def forward(self, results, max_target_sizes):
            for r, t in zip(results, max_target_sizes):
                h, w = t[0], t[1]
                r["masks"] = r["masks"][:, :h, :w]
            return results

    def evaluate(model, loader):
        post = PostProcess()
        for samples, targets in loader:
            outputs = model(samples.to(DEVICE, non_blocking=True))
            sizes = torch.stack([t["size"] for t in targets], dim=0).to(DEVICE, non_blocking=True)
            post(outputs, sizes)
    """
    assert ("GB002", 6) in default(body)


def test_a_one_element_tensor_as_an_index():
    body = """
    def train(model, loader, opt):
        for x, labels in loader:
            scores = model(x)
            best = scores.argmax()
            scores[best] = 1
            top = scores[scores.sum(0).argmax()]
            row = scores[scores.argmax(dim=1)]
            labels = labels + top.sum()
            F.cross_entropy(scores, labels).backward()
            opt.step()
    """
    assert default(body) == [("GB002", 6), ("GB002", 7)]   # argmax(dim=1) is a vector: no .item()


def test_ops_that_answer_on_the_host_or_size_their_output_by_the_data():
    body = """
    def train(model, loader, opt, prev):
        for x in loader:
            out = model(x)
            cls = out.argmax(1)
            counts = torch.bincount(cls)
            same = torch.equal(out, prev)
            close = out.allclose(prev)
            rep = out.repeat_interleave(counts.clamp(max=3))
            rep2 = out.repeat_interleave(2)
            host = torch.bincount(torch.tensor([1, 2]))
            out.mean().backward()
            opt.step()
    """
    assert default(body) == [("GB002", 7), ("GB002", 8), ("GB008", 6), ("GB008", 9)]


def test_the_builtin_max_of_device_tensors_compares_on_the_host():
    body = """
    def train(model, loader, opt):
        for x in loader:
            q1, q2 = model(x)
            target = max(q1.mean(), q2.mean())
            floor = max(q1.mean(), 0.0)
            both = torch.max(q1, q2)
            n = max(len(x), 1)
            (target + floor + both.mean() * n).backward()
            opt.step()
    """
    assert default(body) == [("GB002", 5), ("GB002", 6)]


def test_a_branch_one_call_skips_and_another_takes_is_walked():
    body = """
    from torch.distributions import Normal
    class Agent(nn.Module):
        def get_action_and_value(self, x, action=None):
            mean = self.actor(x)
            if action is None:
                action = mean.detach()
            else:
                z = torch.FloatTensor(mean.shape).uniform_(-0.5, 0.5).to(DEVICE)
                mean = mean + z
            return action, mean

    def train(agent, env, obs, opt, b_obs, b_actions):
        for step in range(100):
            action, _ = agent.get_action_and_value(obs)
            obs, r, done, info = env.step(action)
        for epoch in range(4):
            _, mean = agent.get_action_and_value(b_obs, b_actions)
            mean.sum().backward()
            opt.step()
    """
    assert ("GB001", 9) in default(body)   # the update's call passes an action: the else way runs there


def test_samples_of_a_distribution_of_device_tensors_are_device_tensors():
    body = """
    from torch.distributions import Categorical
    class Agent(nn.Module):
        def act(self, obs):
            probs = Categorical(logits=self.actor(obs), validate_args=False)
            action = probs.sample()
            return action, probs.log_prob(action)

    def rollout(envs, obs):
        agent = Agent().to(DEVICE)
        for step in range(16):
            action, logp = agent.act(obs)
            obs, reward, done, info = envs.step(action)
            for i, d in enumerate(done):
                if d:
                    print(i)
    """
    assert default(body) == [("GB007", 15)]   # a GPU simulator's done flags, read one by one


def test_objects_made_by_one_tuple_assignment_are_followed_into_their_methods():
    body = """
    class Actor(nn.Module):
        def act(self, obs):
            return self.net(obs).argmax().item()
    class Critic(nn.Module):
        def act(self, obs):   # the same method name: only the tuple's pairing says which class `actor` is
            return self.net(obs)
    def rollout(env, obs):
        actor, critic = Actor(), Critic()
        for step in range(24):
            obs = torch.as_tensor(obs, device=DEVICE)
            action = actor.act(obs)
            obs, reward, done, info = env.step(action)
    """
    assert 4 in round_trip(body)   # .item() in Actor.act, reached through `actor` of the tuple: the env's round trip
