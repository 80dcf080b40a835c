"""gobrrr lint, issue 29's twenty-first round (round 20 of the rules): heldout18's misses and false findings, each
from a minimal example written for the shape, beside the neighbouring shape that must stay quiet (or fire)."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a loop that takes a batch and runs a model itself is a step loop, though it also calls a decoding loop
ROLLOUT = """
def decode(model, x, n):
    for _ in range(n):
        x = torch.cat([x, model(x)[:, -1:]], 1)
    return x


class Trainer:
    def make_experience(self, prompt_loader, n):
        for batch in prompt_loader:
            out = decode(self.model, batch, 8)
            values = self.model(out)
            print(values.mean().item())
"""


def test_a_rollout_loop_that_decodes_and_runs_the_model_is_a_step_loop():
    """trlx's PPO rollouts: each chunk of prompts is decoded (a loop of its own), then scored by the policy,
    the reference and the value head, every iteration of the loop."""
    assert ("GB002", 13) in default(ROLLOUT)


def test_a_loop_whose_only_model_call_is_the_decoding_one_stays_outer():
    assert ("GB002", 13) not in default(ROLLOUT.replace("values = self.model(out)", "values = out.float()"))


# -- results moved to the host, then copied: still host
METRICS = """
import copy

def evaluate(model, loader, targets_of):
    for imgs, targets in loader:
        outputs = model(imgs.to(DEVICE, non_blocking=True))
        kept = copy.deepcopy([o.detach().cpu() for o in outputs])
        for pred in kept:
            labels = torch.cat((targets[:, :1], targets[:, 2:]), 1)
            hits = torch.where(pred[:, 4] > 0.5)
            print(hits[0].shape, labels.shape)
        keep = torch.where(outputs[0][:, 4] > 0.5)
"""


def test_the_deep_copy_of_host_results_stays_on_the_host():
    """YOLOv6's --do_pr_metric statistics: `copy.deepcopy([x.detach().cpu() for x in outputs])`, then torch.where
    on each copy: the shape is known on the host."""
    assert ("GB008", 10) not in default(METRICS)


def test_torch_where_of_a_device_tensor_still_fires():
    assert ("GB008", 12) in default(METRICS)


# -- a local name bound to one of self's methods
ALIAS = """
class Diffusion:
    def sample(self, b):
        z = torch.randn(b, 4, device=DEVICE)
        z = self.net(z)
        return z.cpu()

    def sample_ddim(self, b):
        return self.sample(b)

    def fit(self, loader, opt, ddim):
        sample_fn = self.sample_ddim if ddim else self.sample
        for x in loader:
            loss = self.net(x.to(DEVICE, non_blocking=True)).mean()
            loss.backward()
            opt.step()
            s = sample_fn(4)
            kept = s[~torch.isnan(s).any(1)]
"""


def test_what_a_method_alias_returns_is_known():
    """tab-ddpm's `sample_fn = self.sample` (or `self.sample_ddim`): its samples come back on the host."""
    assert ("GB008", 18) not in default(ALIAS)


def test_a_device_result_through_a_method_alias_still_fires():
    assert ("GB008", 18) in default(ALIAS.replace("return z.cpu()", "return z"))


# -- numpy arrays: annotated as np.array, kept in a list, in a dict
ARRAYS = """
class Diffusion:
    def __init__(self, num_classes: np.array):
        self.num_classes = num_classes
        self.slices = [np.arange(num_classes[0])]
        for i in range(1, len(num_classes)):
            self.slices.append(np.arange(num_classes[i - 1], num_classes[i]))

    def loss(self, out):
        assert out.size(1) == self.num_classes.sum()
        for ix in self.slices:
            out[:, ix] = out[:, ix].log_softmax(1)
        return out.mean()

    def fit(self, model, loader, opt):
        for x in loader:
            loss = self.loss(model(x.to(DEVICE, non_blocking=True)))
            loss.backward()
            opt.step()
"""


def test_an_array_annotated_np_array_is_no_tensor():
    assert ("GB007", 10) not in default(ARRAYS)


def test_numpy_slices_kept_in_a_list_index_a_device_tensor_from_the_host():
    """tab-ddpm's `slices_for_classes`: one numpy index array per categorical feature, copied to the device at
    each use, every step."""
    assert ("GB011", 12) in default(ARRAYS)


def test_the_values_of_a_dict_of_arrays_are_arrays():
    """tab-ddpm's NaN policy, reached from the loop: `{k: ~v.any(1) for k, v in nan_masks.items()}` of numpy masks."""
    body = """
    def clean(dataset):
        masks = {k: np.isnan(v) for k, v in dataset.X.items()}
        valid = {k: ~v.any(1) for k, v in masks.items()}
        assert valid["test"].all()
        return dataset

    def fit(model, loader, opt, dataset):
        for x in loader:
            clean(dataset)
            model(x.to(DEVICE, non_blocking=True)).mean().backward()
            opt.step()
    """
    assert ("GB007", 5) not in default(body)


# -- a method of another class hierarchy called through self's attributes
LOSS = """
class MethodConfig:
    def loss(self, logits):
        raise NotImplementedError


class PPOConfig(MethodConfig):
    def loss(self, logits):
        loss = logits.mean()
        stats = {"loss": loss.item()}
        return loss, stats


class Trainer:
    def loss(self, batch):
        logits = self.model(batch)
        return self.config.method.loss(logits)

    def fit(self, loader, opt):
        for x in loader:
            loss, stats = self.loss(x.to(DEVICE, non_blocking=True))
            loss.backward()
            opt.step()
"""


def test_a_loss_of_the_method_config_hierarchy_is_followed():
    """trlx: `self.config.method.loss(...)` in the trainer's loss runs PPOConfig.loss (or ILQLConfig.loss), a
    method of the config classes, not the trainer's own `loss`."""
    assert ("GB002", 10) in default(LOSS)


def test_a_method_of_self_s_own_hierarchy_is_not_taken_for_it():
    """Without a second hierarchy, nothing is guessed: the trainer's own `loss` is not the callee."""
    body = LOSS.replace("class PPOConfig(MethodConfig):", "class PPOConfig:").replace(
        "class MethodConfig:\n    def loss(self, logits):\n        raise NotImplementedError\n", "")
    body = body.replace("return self.config.method.loss(logits)", "return self.config.method.other(logits)")
    assert not [f for f in default(body) if f[0] == "GB002"]


# -- next() of a data iterator handed in: a host batch
def test_next_of_a_train_iterator_is_a_host_batch():
    """tab-ddpm: `x, y = next(self.train_iter)` (a loader made elsewhere), then `x.to(device)` every step."""
    body = """
    class Trainer:
        def step(self, x):
            x = x.to(DEVICE)
            loss = self.model(x).mean()
            loss.backward()
            self.opt.step()

        def run(self, n):
            for _ in range(n):
                x, y = next(self.train_iter)
                self.step(x)
    """
    assert ("GB009", 4) in default(body)


def test_next_of_a_generator_of_batches_is_not_taken_for_a_host_batch():
    """nanochat's `next(batch_iterator)` yields tensors the generator made on the device."""
    body = """
    def fit(model, batch_iterator, opt, n):
        for _ in range(n):
            inputs, rewards = next(batch_iterator)
            model(inputs).mean().backward()
            opt.step()
            print(rewards.mean().item())
    """
    assert ("GB002", 7) in default(body)
