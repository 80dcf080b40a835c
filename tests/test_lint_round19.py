"""gobrrr lint, issue 29's twentieth round (round 19 of the rules): heldout17's misses and the two shapes read
while judging it (a config attribute named `train` taken for a train/eval switch, a `for` loop that takes its
batch with `next()`), each from a minimal example written for the shape, beside the neighbouring shape that
must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- `config.train.every` is a receiver, not a train/eval mode: its `step % every == 0` branch is rare
INTERVAL = """
def fit(model, loader, opt, cfg, state):
    for x in loader:
        loss = model(x.to(DEVICE, non_blocking=True)).mean()
        loss.backward()
        opt.step()
        if state.step % cfg.train.eval_interval == 0:
            print(loss.item())
        if model.training:
            print(loss.item())
"""


def test_a_rate_read_through_a_config_named_train_makes_a_rare_branch():
    found = default(INTERVAL)
    assert ("GB002", 8) not in found, found


def test_a_train_mode_test_is_still_a_main_path():
    assert ("GB002", 10) in default(INTERVAL)


# -- a `for` loop that takes its batch with next(train_iter)
NEXT = """
def fit(state, train_iter, step_fn, n_steps):
    for step in range(n_steps):
        batch = torch.from_numpy(next(train_iter)).to(DEVICE)
        loss = step_fn(state, batch)
        print(float(loss))
"""


def test_next_of_a_data_iterator_in_a_for_loop_takes_a_batch():
    """score_sde's loop: the step is a function built elsewhere (`train_step_fn(state, batch)`); what makes the
    loop a step loop is the batch it takes, each step, from the iterator."""
    assert ("GB001", 4) in default(NEXT)


def test_next_of_a_parameter_iterator_takes_no_batch():
    """`next(iter(m.parameters()))` in a loop over modules reads a weight, once per module of the set-up."""
    body = """
    def report(model):
        for m in model.modules():
            w = next(iter(m.parameters()))
            out = m(w)
            print(out.norm().item())
    """
    assert default(body) == []


# -- .cpu() of torch.as_tensor(v), v a metric of unknown kind
METRICS = """
from collections import defaultdict

def fit(trainer, loader, opt):
    kept = defaultdict(list)
    for batch in loader:
        loss, metrics = trainer.get_batch_metrics(batch.to(DEVICE, non_blocking=True))
        loss.backward()
        opt.step()
        for k, v in metrics.items():
            kept[k].extend(torch.as_tensor(v).reshape(-1).float().cpu().tolist())
        kept["host"].extend(torch.as_tensor(np.zeros(3)).cpu().tolist())
"""


def test_as_tensor_of_a_metric_read_back_with_cpu_fires():
    """HALOs: each gathered metric, a CUDA tensor in a dict, read back per micro-batch."""
    assert ("GB002", 11) in default(METRICS)


def test_as_tensor_of_host_data_read_back_stays_quiet():
    assert ("GB002", 12) not in default(METRICS)


# -- empty_cache() in a helper the step loop calls itself
def test_empty_cache_in_a_helper_called_every_step_fires():
    """HALOs' `self.free_memory()` after each optimizer step (the helper reached through other calls, once,
    stays quiet: test_lint_round4_quiet)."""
    body = """
    class Trainer:
        def free_memory(self):
            torch.cuda.empty_cache()

        def fit(self):
            for x in self.loader:
                self.model(x.to(DEVICE, non_blocking=True)).mean().backward()
                self.optimizer.step()
                self.free_memory()
    """
    assert ("GB004", 4) in default(body)


# -- a Python list of positions as an index into a device tensor
POSITIONS = """
def fit(model, loader, opt, status):
    for x in loader:
        logps = model(x.to(DEVICE, non_blocking=True))
        chosen = [i for i in range(len(status)) if status[i] == "chosen"]
        firsts = [i for i, s in enumerate(status) if s == "first"]
        loss = logps[chosen].mean() + logps[firsts, ...].mean()
        host = torch.zeros(len(status))[chosen]
        loss.backward()
        opt.step()
"""


def test_a_list_of_positions_indexing_a_device_tensor_fires():
    """HALOs' KTO split: `target_logps[chosen_idx, ...]` with a list comprehension of positions."""
    assert ("GB011", 7) in default(POSITIONS)


def test_a_list_of_positions_indexing_a_host_tensor_stays_quiet():
    assert ("GB011", 8) not in default(POSITIONS)


# -- a device tensor inside the list handed to torch.tensor
STATS = """
def fit(model, loader, opt):
    for x in loader:
        rewards = model(x.to(DEVICE, non_blocking=True))
        stats = torch.tensor([rewards.sum(), len(rewards)]).to(DEVICE)
        rewards.mean().backward()
        opt.step()
"""


def test_a_device_scalar_in_a_list_given_to_torch_tensor_fires():
    """HALOs' KTO statistics: `torch.Tensor([..., KL_rewards.sum(), ...])` reads the sum with .item()."""
    assert ("GB002", 5) in default(STATS)


def test_a_value_tested_not_to_be_a_tensor_stays_quiet():
    """`if type(x) is not torch.Tensor: x = torch.tensor([x])` (DALLE2's all-reduce helper): no tensor there."""
    body = """
    def reduce(x):
        if type(x) is not torch.Tensor:
            x = torch.tensor([x])
        return x.to(DEVICE)

    def fit(model, loader, opt):
        for x in loader:
            loss = model(x.to(DEVICE, non_blocking=True)).mean()
            loss.backward()
            opt.step()
            reduce(loss)
    """
    assert ("GB002", 4) not in default(body)


# -- a loop over `tqdm(loader) if main else loader`
def test_a_loader_chosen_by_a_conditional_expression_gives_batches():
    """HALOs' and DPO's evaluation loops: the progress bar only on the main process."""
    body = """
    def evaluate(model, eval_loader, main):
        for batch in (tqdm(eval_loader) if main else eval_loader):
            out = model(batch.to(DEVICE))
    """
    assert ("GB009", 4) in default(body)


# -- a project def that runs a module, called on a model-named receiver
SAMPLER = """
class ScoreModel:
    def __init__(self, nnet):
        self.nnet = nnet

    def predict(self, x, t):
        return self.nnet(x, t * 999)


class ReverseODE:
    def __init__(self, score_model):
        self.score_model = score_model

    def drift(self, x, t):
        return -0.5 * self.score_model.predict(x, t)


def sample(ode, x, n):
    timesteps = torch.linspace(1.0, 0.0, n, device=DEVICE)
    for s, t in zip(timesteps, timesteps[1:]):
        x = x + ode.drift(x, t) * (s - t)
        if s != 0:
            x = x + torch.randn_like(x)
    return x
"""


def test_a_sampler_calling_a_model_through_two_objects_is_a_step_loop():
    """U-ViT's Euler-Maruyama sampler: drift -> score_model.score -> noise_pred -> self.nnet(x, t): the loop runs
    the network every step, and its `if s != 0` on a device scalar waits every step."""
    assert ("GB007", 22) in default(SAMPLER)


def test_a_sampler_whose_drift_runs_no_module_is_no_step_loop():
    body = SAMPLER.replace("return self.nnet(x, t * 999)", "return x * t")
    assert ("GB007", 22) not in default(body)


# -- a rate given to a config's constructor
RATE = """
class TrainArgs:
    def __init__(self, log_interval, lr):
        self.log_interval, self.lr = log_interval, lr


def fit(model, loader, opt, train=TrainArgs(log_interval=1, lr=1e-3)):
    for iter_num, x in enumerate(loader):
        loss = model(x.to(DEVICE, non_blocking=True)).mean()
        loss.backward()
        opt.step()
        if iter_num % train.log_interval == 0:
            print(loss.item())
"""


def test_a_rate_of_one_given_to_a_config_call_runs_every_step():
    """litgpt's LoRA recipe: `train: TrainArgs = TrainArgs(log_interval=1, ...)`, read as
    `iter_num % train.log_interval == 0`."""
    assert ("GB002", 13) in default(RATE)


def test_a_larger_rate_given_to_a_config_call_stays_rare():
    assert ("GB002", 13) not in default(RATE.replace("log_interval=1,", "log_interval=50,"))
