"""gobrrr lint, issue 29's fifth round: shapes met in the misses of the heldout3 and heldout4 sets
(which this round tuned on; heldout5 is the set it was measured on), each from a minimal example in the
default run, with the false-positive shape that came with it kept quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_source
from tests.test_lint_round4 import HEAD, default


def test_an_object_handed_in_as_a_parameter_runs_the_class_it_is_named_after():
    """`replay_buffer.sample(n)` in an agent's update: `sample` is too common a name to pin by itself,
    but `replay_buffer` names the project's ReplayBuffer (and its subclasses)."""
    body = """
    class ReplayBuffer:
        def __init__(self, n, device):
            self.obs = np.zeros((n, 4), dtype=np.float32)
            self.device = device

        def sample(self, k):
            idx = np.random.randint(0, len(self.obs), size=k)
            return torch.as_tensor(self.obs[idx], device=self.device)

    class PrioritizedReplayBuffer(ReplayBuffer):
        def sample(self, k):
            w = self.weights()
            return torch.tensor(w).to(self.device)

    class Agent:
        def update(self, replay_buffer, model, opt):
            obs = replay_buffer.sample(256)
            loss = model(obs).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    def train(agent, buffer, model, opt):
        for step in range(1000):
            agent.update(buffer, model, opt)
    """
    found = default(body)
    assert ("GB010", 9) in found, found       # the base class's sample: numpy rows copied to the device
    assert any(line == 14 for _, line in found), found   # a subclass's sample is followed too


def test_a_name_too_vague_to_name_a_class_is_not_pinned():
    """`self.model.sample()` or `trainer.step()` say nothing of their class: not pinned to a Sampler class."""
    body = """
    class DiffusionModel:
        def sample(self, n):
            return torch.randn(n).cuda().item()

    def train(model, batches):
        for x in batches:
            y = model.sample(4)
    """
    assert not [f for f in default(body) if f[1] == 4]


def test_a_numpy_attribute_compared_with_an_unknown_is_a_numpy_mask():
    """`(self._loss_counts == self.history_per_term).all()` with `_loss_counts = np.zeros(n)`: a numpy
    bool, no sync, when a helper's return is read as a condition in a step."""
    body = """
    class Resampler:
        def __init__(self, n, history):
            self.history = history
            self._counts = np.zeros([n], dtype=np.int64)

        def _warm(self):
            return (self._counts == self.history).all()

        def weights(self):
            if not self._warm():
                return np.ones([4])
            return np.sqrt(self._counts)

    def train(model, batches, sampler):
        for x in batches:
            w = sampler.weights()
            loss = model(x.cuda(non_blocking=True)).mean()
            loss.backward()
    """
    assert not [f for f in default(body) if f[0] == "GB007"], default(body)


def test_a_callback_named_like_a_looping_def_does_not_make_the_eval_loop_an_outer_loop():
    """`callbacks.run("on_val_batch_start")` inside a validation loop: the project's `def run` holds that
    loop, but a method `run` of some other object is not it (a module's `val.run(...)` would be)."""
    body = """
    def run(model, dataloader, callbacks, device):
        for im, targets in dataloader:
            callbacks.run("on_val_batch_start")
            targets = targets.to(device)
            preds = model(im)
            for si, pred in enumerate(preds):
                labels = targets[targets[:, 0] == si, 1:]
    """
    assert ("GB008", 8) in default(body), default(body)


def test_a_mask_expanded_to_the_data_is_still_a_mask():
    """SSD's loss: `pos_idx = pos.unsqueeze(2).expand_as(loc_data)`, then `loc_data[pos_idx]`: a boolean
    mask broadcast by expand_as (or repeat) still selects a data-dependent number of rows."""
    body = """
    def train(net, loader, optimizer):
        for images, targets in loader:
            loc_data = net(images.cuda(non_blocking=True))
            pos = torch.zeros(4, 8732, device="cuda") > 0
            pos_idx = pos.unsqueeze(2).expand_as(loc_data)
            loss = loc_data[pos_idx].sum()
            loss.backward()
            optimizer.step()
    """
    assert ("GB008", 7) in default(body), default(body)


def test_a_schedule_made_by_a_helper_before_the_sampling_loop_is_on_the_device():
    """`sigmas = self.sample_schedule(n)` before the loop, `if sigmas[i + 1] == 0:` inside it: what the
    helper returns (a CUDA linspace) is learnt in the set-up of a def that holds a step loop; an object
    a builder returns there (`transforms = build_transforms(cfg)`) is not taken for a model."""
    body = """
    class Sampler:
        def sample(self, model, n):
            sigmas = self.sample_schedule(n)
            images = torch.randn(4, device="cuda")
            for i in range(len(sigmas) - 1):
                denoised = model(images, sigmas[i])
                if sigmas[i + 1] == 0:
                    images = denoised

        def sample_schedule(self, n):
            return torch.linspace(0, 1, n, device="cuda")

    class Compose:
        def __call__(self, image):
            return torch.from_numpy(image)

    def build_transforms():
        return Compose()

    def demo(model, paths, device):
        transforms = build_transforms()
        for path in paths:
            image = np.load(path)
            result = model(transforms(image).to(device))
    """
    found = default(body)
    assert ("GB007", 8) in found and ("GB010", 25) in found, found


def test_a_log_space_parameter_in_a_condition_does_not_make_the_branch_a_logging_branch():
    """SAC's `if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:` runs every
    gradient step: `log_ent_coef` is a log-space parameter, not a logging switch (`step % self.log_interval` still is one)."""
    body = """
    class SAC:
        def train(self, gradient_steps, batch):
            for step in range(gradient_steps):
                log_prob = self.actor(batch)
                if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                    loss = -(self.log_ent_coef * log_prob.detach()).mean()
                    self.losses.append(loss.item())
                else:
                    loss = None
                if loss is not None:
                    loss.backward()
                    self.ent_coef_optimizer.step()
                if step % self.log_interval == 0:
                    self.images.append(log_prob.cpu())
    """
    found = default(body)
    assert ("GB002", 8) in found and ("GB002", 15) not in found, found


def test_a_parameter_annotated_with_an_aliased_tensor_type_is_a_tensor():
    """`import torch as th` and `def proba_distribution(self, action_logits: th.Tensor)`: the parameter is a
    tensor even when the file also names a layer `action_logits = nn.Linear(...)`, so the Categorical built
    from it is validated, and its log_prob() (walked before the constructor's caller) syncs every step."""
    body = """
    import torch as th
    from torch.distributions import Categorical

    class Dist:
        def log_prob(self, actions):
            return self.distribution.log_prob(actions)

        def net(self, latent_dim):
            action_logits = nn.Linear(latent_dim, 4)
            return action_logits

        def proba_distribution(self, action_logits: th.Tensor):
            self.distribution = Categorical(logits=action_logits)
            return self

    def train(policy, dist, loader, opt):
        for obs, actions in loader:
            loss = -dist.log_prob(actions).mean()
            dist.proba_distribution(policy(obs.cuda(non_blocking=True)))
            loss.backward()
            opt.step()
    """
    found = default(body)
    assert ("GB013", 7) in found and ("GB013", 14) in found, found


def test_a_cuda_buffer_indexed_by_batch_sampler_index_lists_copies_them_every_minibatch():
    """PPO's minibatches: `for indices in BatchSampler(SubsetRandomSampler(range(n)), mb, drop_last=True)`
    yields Python lists of ints; `cuda_buffer[indices]` copies each list to the device, blocking."""
    body = """
    from torch.utils.data.sampler import BatchSampler, SubsetRandomSampler

    class Storage:
        def __init__(self, n, device):
            self.obs = torch.zeros(n, 4, device=device)

        def feed_forward_generator(self, mb):
            sampler = BatchSampler(SubsetRandomSampler(range(100)), mb, drop_last=True)
            for indices in sampler:
                obs_batch = self.obs.view(-1, 4)[indices]
                yield obs_batch

    class PPO:
        def update(self, rollouts):
            for epoch in range(4):
                data_generator = rollouts.feed_forward_generator(8)
                for obs in data_generator:
                    loss = self.actor_critic(obs).mean()
                    loss.backward()
                    self.optimizer.step()
    """
    assert ("GB011", 11) in default(body), default(body)


def test_a_functools_partial_runs_the_function_it_binds():
    """score_sde's sampler: `predictor_update_fn = functools.partial(shared_predictor_update_fn, sde=sde)`
    in the def around the sampling loop; `predictor_fn(x, t, model=model)` runs the bound function."""
    body = """
    import functools

    def shared_update_fn(x, t, sde, model):
        return model(x, t) * sde.scale.item()

    def get_sampler(sde):
        predictor_fn = functools.partial(shared_update_fn, sde=sde)

        def sampler(model, x):
            for i in range(1000):
                t = torch.full((4,), i, device=x.device)
                x = predictor_fn(x, t, model=model)
            return x
        return sampler
    """
    assert ("GB002", 5) in default(body), default(body)


def test_a_host_table_of_another_class_copied_each_sampling_step_and_the_predictor_siblings():
    """score_sde: `self.discrete_betas = torch.linspace(...)` (a host tensor) in the SDE class, and in a
    predictor chosen by name, `sde.discrete_betas.to(t.device)[timestep]` every sampling step. The predictor
    object is a NonePredictor in one branch and `predictor(...)` of a parameter in the other: the other
    Predictor subclasses (named like `predictor_obj`) are followed too."""
    body = """
    class VPSDE:
        def __init__(self, n):
            self.discrete_betas = torch.linspace(0.1, 20, n)

    class Predictor:
        def update_fn(self, x, t):
            raise NotImplementedError

    class NonePredictor(Predictor):
        def update_fn(self, x, t):
            return x

    class AncestralPredictor(Predictor):
        def __init__(self, sde):
            self.sde = sde

        def update_fn(self, x, t):
            sde = self.sde
            beta = sde.discrete_betas.to(t.device)[t.long()]
            return x * beta

    def shared_predictor_update_fn(x, t, sde, predictor):
        if predictor is None:
            predictor_obj = NonePredictor()
        else:
            predictor_obj = predictor(sde)
        return predictor_obj.update_fn(x, t)

    def sample(model, sde, predictor, x):
        for i in range(1000):
            t = torch.full((4,), i, device=x.device)
            x = model(shared_predictor_update_fn(x, t, sde, predictor))
        return x
    """
    assert ("GB010", 20) in default(body), default(body)


def test_a_known_buffer_class_is_not_joined_by_unrelated_classes_of_a_similar_name():
    """rl_games: `self.replay_buffer = VectorizedReplayBuffer(...)`; the project's PrioritizedReplayBuffer
    (another hierarchy) ends in the same name, but its sample() is not what runs."""
    body = """
    class ReplayBuffer:
        def sample(self, n):
            return n

    class PrioritizedReplayBuffer(ReplayBuffer):
        def sample(self, n):
            total = torch.ones(4, device="cuda").sum()
            assert 0 <= n <= total
            return n

    class VectorizedReplayBuffer:
        def __init__(self, device):
            self.obs = torch.zeros(100, 4, device=device)

        def sample(self, n):
            idx = torch.randint(0, 100, (n,), device=self.obs.device)
            return self.obs[idx]

    class Agent:
        def __init__(self, device):
            self.replay_buffer = VectorizedReplayBuffer(device)

        def train(self, model, opt):
            for step in range(1000):
                obs = self.replay_buffer.sample(256)
                loss = model(obs).mean()
                loss.backward()
                opt.step()
    """
    assert not [f for f in default(body) if f[1] == 9], default(body)


def test_a_logging_interval_whose_config_default_is_one_logs_every_step():
    """`if completed_steps % args.logging_steps == 0:` is rare unless the project's config says
    `logging_steps: int = 1` (a dataclass field) or `add_argument("--log-every", default=1)`; another
    number anywhere keeps it rare, and a default of None says nothing. An option named by a non-literal
    (`add_argument(FLAG, ...)`) is read by the string flags it has and never breaks the run."""
    body = """
    import argparse
    from dataclasses import dataclass, field

    @dataclass
    class LoggingConfig:
        logging_steps: int = 1
        report: int | None = None

    FLAG = "--x"
    parser = argparse.ArgumentParser()
    parser.add_argument(FLAG, type=int, default=1)
    parser.add_argument("--z", FLAG, default=1)
    parser.add_argument("-l", "--log-every", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=500)

    def train(model, loader, opt, args):
        for step, batch in enumerate(loader):
            loss = model(batch.cuda(non_blocking=True)).mean()
            loss.backward()
            opt.step()
            if step % args.logging_steps == 0:
                print(loss.item())
            if step % args.log_every == 0:
                print(loss.item() * 2)
            if step % args.save_every == 0:
                print(loss.item() * 3)
    """
    found = default(body)
    assert ("GB002", 23) in found and ("GB002", 25) in found and ("GB002", 27) not in found, found


def test_a_step_function_made_by_a_factory_and_its_closure_tables():
    """score_sde: `train_step_fn = losses.get_step_fn(sde)` before the loop runs the `step_fn` the factory
    returns; its loss (chosen per branch) reads `smld_sigma_array`, a host table of the factory around it,
    and copies it to the device every step; `self.alphas = 1. - self.discrete_betas` is a host table too."""
    body = """
    class VPSDE:
        def __init__(self, n):
            self.discrete_betas = torch.linspace(0.1, 20, n)
            self.alphas = 1. - self.discrete_betas

    def get_smld_loss_fn(vesde):
        smld_sigma_array = torch.flip(vesde.discrete_betas, dims=(0,))

        def loss_fn(model, batch):
            labels = torch.randint(0, 10, (batch.shape[0],), device=batch.device)
            sigmas = smld_sigma_array.to(batch.device)[labels]
            return model(batch * sigmas).mean()
        return loss_fn

    def get_ddpm_loss_fn(vpsde):
        def loss_fn(model, batch):
            a = vpsde.alphas.to(batch.device)
            return model(batch * a[0]).mean()
        return loss_fn

    def get_step_fn(sde, smld):
        if smld:
            loss_fn = get_smld_loss_fn(sde)
        else:
            loss_fn = get_ddpm_loss_fn(sde)

        def step_fn(state, batch):
            loss = loss_fn(state["model"], batch)
            loss.backward()
            state["optimizer"].step()
            return loss
        return step_fn

    def train(state, sde, loader):
        train_step_fn = get_step_fn(sde, True)
        for batch in loader:
            loss = train_step_fn(state, batch.cuda(non_blocking=True))
    """
    found = default(body)
    assert ("GB010", 12) in found and ("GB010", 18) in found, found


def test_a_train_module_s_train_batch_is_a_per_step_hook():
    """OLMo-core's Trainer calls `TrainModule.train_batch(batch)` once per step, and each callback's
    `post_step()`: their bodies are per-step code though no loop of the project calls them."""
    body = """
    class DPOTrainModule(TrainModule):
        def train_batch(self, batch, dry_run=False):
            loss = self.model(batch["input_ids"]).mean()
            loss.backward()
            self.record_metric("loss", loss.item())

    class PerfCallback(Callback):
        def post_step(self):
            self.seqs += int(self.trainer.metrics["seqs"])
    """
    found = default(body)
    assert ("GB002", 6) in found, found


def test_a_name_rebound_to_a_wrapper_of_itself_does_not_recurse():
    """Megatron: `forward_step = wrap(forward_step)` or `fn = functools.partial(fn, ...)`: resolving what
    the name runs must not follow its own assignment forever."""
    body = """
    import functools

    def wrap(fn):
        def inner(*a):
            return fn(*a)
        return inner

    def train(model, loader, opt, forward_step, step_fn):
        forward_step = wrap(forward_step)
        step_fn = functools.partial(step_fn, opt=opt)
        for batch in loader:
            loss = forward_step(model, batch.cuda(non_blocking=True))
            step_fn(loss)
            loss.backward()
            opt.step()
    """
    assert default(body) == [], default(body)


def test_a_product_of_masks_indexes_as_a_mask_and_a_project_iterator_runs_per_step():
    """Rainbow: `l[(u > 0) * (l == u)] -= 1` writes through a boolean mask (nonzero, every learn step);
    `for state in val_mem:` runs ReplayMemory.__next__ once per iteration, which copies host frames."""
    body = """
    class ReplayMemory:
        def __iter__(self):
            self.i = 0
            return self

        def __next__(self):
            self.i += 1
            return torch.tensor(np.zeros((4, 84, 84)), dtype=torch.float32, device=DEVICE)

    def learn(net, states, opt):
        b = net(states)
        l, u = b.floor().to(torch.int64), b.ceil().to(torch.int64)
        l[(u > 0) * (l == u)] -= 1
        b.sum().backward()
        opt.step()

    def evaluate(net, val_mem, out):
        for state in val_mem:
            out.append(net(state))

    def train(net, memory, opt):
        for step in range(1000):
            learn(net, memory.sample(32), opt)
    """
    found = default(body)
    assert ("GB008", 14) in found and ("GB010", 9) in found, found


def test_a_numpy_index_expression_is_a_host_index():
    """YOLOv4's loss: `output[..., np.r_[:2, 4:n_ch]]` builds the index array on the host; each use copies
    it to the device."""
    body = """
    def yolo_loss(outputs):
        loss = 0
        for output in outputs:
            output[..., np.r_[:2, 4:85]] = torch.sigmoid(output[..., np.r_[:2, 4:85]])
            loss = loss + output.sum()
        return loss

    def train(model, loader, opt):
        for images in loader:
            loss = yolo_loss(model(images.cuda(non_blocking=True)))
            loss.backward()
            opt.step()
    """
    assert ("GB011", 5) in default(body), default(body)


def test_a_stopwatch_synchronize_in_the_step_is_reported_with_events_as_the_fix():
    """`torch.cuda.synchronize(); batch_time.update(time.time() - end)` every step: a measurement, and
    still a full stall of the queue each step; benchmark code keeps its syncs unreported."""
    body = """
    import time

    def train(model, loader, opt, meter):
        end = time.time()
        for x in loader:
            loss = model(x.cuda(non_blocking=True)).mean()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            meter.update(time.time() - end)
            end = time.time()

    def bench_step(model, x):
        for _ in range(10):
            model(x)
            torch.cuda.synchronize()
    """
    out = lint_source(HEAD + textwrap.dedent(body), "train.py")
    found = {(f.rule, f.line - HEAD.count("\n")): f for f in out}
    assert ("GB004", 10) in found and "Event" in found[("GB004", 10)].fix, sorted(found)
    assert ("GB004", 17) not in found


def test_config_nodes_sizes_predicates_and_host_elements_are_not_device_values():
    """Quiet shapes from heldout6/7's false findings: `self.cfg = cfg.clone()` then `if self.cfg.MODEL.RPN_ONLY:`
    (an upper-case config node); `boxlist1.size != boxlist2.size` (a tuple); `d() if isfunction(d) else d`;
    `if type(b).__name__ != 'ndarray': b = b.cpu().numpy()` (numpy after the if); `obj_mask[b, a, j, i] = 1`
    with `i, j = truth_i[ti], truth_j[ti]` one element each of a numpy array (a plain select)."""
    body = """
    from inspect import isfunction

    def default(val, d):
        return d() if isfunction(d) else d

    class RPN(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg.clone()

        def forward(self, boxes_a, boxes_b, scores):
            if self.cfg.MODEL.RPN_ONLY:
                return scores
            if boxes_a.size != boxes_b.size:
                raise RuntimeError("sizes differ")
            return default(scores, None)

    def post_process(out):
        b = out[0]
        if type(b).__name__ != 'ndarray':
            b = b.cpu().detach().numpy()
        keep = b[b[:, 4] > 0.5]
        return keep

    def build_target(labels, obj_mask):
        truth_i = labels[:, 0].cpu().numpy()
        truth_j = labels[:, 1].cpu().numpy()
        for ti in range(len(truth_i)):
            i, j = truth_i[ti], truth_j[ti]
            obj_mask[0, 0, j, i] = 0
        return obj_mask

    def train(model, rpn, loader, opt):
        for x, labels in loader:
            out = model(x.cuda(non_blocking=True))
            rpn(out, out, out)
            keep = post_process(out)
            mask = build_target(labels.cuda(non_blocking=True), torch.ones(1, 1, 8, 8, device="cuda"))
            out.sum().backward()
            opt.step()
    """
    found = default(body)
    quiet = {5, 13, 15, 23, 31}
    assert not [f for f in found if f[1] in quiet], found


def test_a_dtensor_layout_and_an_uncalled_dim_are_python_values():
    """torchtitan: `elif chunk_grad.placements != self._placements:` compares Placement tuples, and
    `p.dim < ndim` (a Shard's dim) compares ints: no tensor is read."""
    body = """
    def accumulate(chunks, placements, ndim):
        for chunk_grad in chunks:
            if chunk_grad.placements != placements:
                raise ValueError("mixed")
            kept = [p for p in chunk_grad.placements if p.dim < ndim]

    def train(model, loader, opt, placements):
        for x in loader:
            grads = [model(x.cuda(non_blocking=True))]
            accumulate(grads, placements, 2)
            grads[0].sum().backward()
            opt.step()
    """
    assert not [f for f in default(body) if f[1] in (4, 6)], default(body)


def test_a_project_helper_read_without_a_certain_return_is_not_guessed_a_tensor():
    """YOLOv4's evaluation: `boxes = do_detect(model, img)` returns `post_processing(...)`, a list of numpy
    rows it builds by appending; the helper was read, so its result is not guessed a device tensor from
    its arguments, and `int(box[-1])` reads nothing from the GPU. A helper that returns the model's output
    is still a tensor."""
    body = """
    def post_processing(output):
        boxes = output[0].cpu().numpy()
        batch = []
        for i in range(boxes.shape[0]):
            batch.append([boxes[i, 0], boxes[i, 1]])
        return batch

    def do_detect(model, img):
        output = model(img)
        return post_processing(output)

    def logits_of(model, img):
        return model(img)

    def evaluate(model, images):
        for img in images:
            boxes = do_detect(model, img.cuda(non_blocking=True))
            for box in boxes:
                category = int(box[-1])
            top = float(logits_of(model, img.cuda(non_blocking=True)).max())
    """
    found = default(body)
    assert ("GB002", 20) not in found and ("GB002", 21) in found, found


def test_an_object_a_factory_builds_into_a_local_and_returns_is_its_class():
    """maskrcnn-benchmark: `loss_evaluator = RPNLossComputation(...); return loss_evaluator` in
    make_rpn_loss_evaluator; `self.loss_evaluator(...)` per step runs RPNLossComputation.__call__ and its
    torch.nonzero. A factory returning a transform pipeline (a Compose over numpy) still gives host data."""
    body = """
    class RPNLossComputation:
        def __call__(self, labels):
            pos = torch.nonzero(labels > 0).squeeze(1)
            return labels[pos].float().mean()

    def make_rpn_loss_evaluator(cfg):
        loss_evaluator = RPNLossComputation()
        return loss_evaluator

    class Compose:
        def __call__(self, image, boxes=None):
            return torch.from_numpy(image), boxes

    def build_transforms():
        transform = Compose()
        return transform

    class RPN(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            self.loss_evaluator = make_rpn_loss_evaluator(cfg)

        def forward(self, labels):
            return self.loss_evaluator(labels)

    def demo(model, paths, device):
        transforms = build_transforms()
        for path in paths:
            image = np.load(path)
            out = model(transforms(image)[0].unsqueeze(0).to(device))
    """
    found = default(body)
    assert ("GB008", 4) in found and ("GB010", 31) in found, found


def test_a_wrapper_made_at_the_call_site_runs_what_it_wraps():
    """detectron2: `retry_if_cuda_oom(self.matcher_fn)(iou)`: the wrapper is built and called at once; what
    runs is the wrapped function."""
    body = """
    def retry_if_cuda_oom(func):
        def wrapped(*args):
            return func(*args)
        return wrapped

    def match(iou):
        return torch.nonzero(iou > 0.5)

    def train(model, loader, opt):
        for x in loader:
            iou = model(x.cuda(non_blocking=True))
            idx = retry_if_cuda_oom(match)(iou)
            iou.sum().backward()
            opt.step()
    """
    assert ("GB008", 8) in default(body), default(body)


def test_a_tensor_passed_for_a_parameter_with_a_number_default_is_a_tensor():
    """MAR: `def sample(self, z, temperature=1.0, cfg=1.0): if not cfg == 1.0:` called with a CUDA `cfg_iter`
    every sampling step: the default says a number, the call passes a device tensor, and the call wins."""
    body = """
    class DiffLoss(nn.Module):
        def sample(self, z, temperature=1.0, cfg=1.0):
            if not cfg == 1.0:
                z = torch.cat([z, z])
            return z * temperature

    class MAR(nn.Module):
        def __init__(self):
            super().__init__()
            self.diffloss = DiffLoss()

        def sample_tokens(self, z, num_iter, cfg):
            for step in range(num_iter):
                mask_len = torch.tensor([step], device=z.device)
                cfg_iter = 1 + (cfg - 1) * mask_len[0] / num_iter
                z = self.diffloss.sample(z, 1.0, cfg_iter)
            return z
    """
    assert ("GB007", 4) in default(body), default(body)


def test_repeat_keeps_a_mask_but_not_pinned_memory():
    """`mask.repeat(5, 1, 1)` still selects a data-dependent number of rows; `pinned.repeat(2, 1)` is a copy
    into pageable memory, so its `non_blocking=True` copy is synchronous (GB005), unlike a view of it."""
    body = """
    def train(model, loader, opt):
        for x, t in loader:
            xp = x.pin_memory().repeat(2, 1)
            y = model(xp.cuda(non_blocking=True))
            j = y > 0
            sel = y.repeat(5, 1)[j.repeat(5, 1)]
            sel.sum().backward()
            opt.step()
    """
    found = default(body)
    assert ("GB005", 5) in found and ("GB008", 7) in found, found
