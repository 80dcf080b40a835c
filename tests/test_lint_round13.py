"""gobrrr lint, issue 29's fourteenth round: shapes met in the misses of the heldout13 set (yolov7,
recurrent-ppo-truncated-bptt; tuned on here, so no longer unseen), each from a minimal example in the
default run, with the look-alike shapes that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

TRAIN = """
def train(model, loader, opt):
    for x, y in loader:
        y = y.to(DEVICE)
        out = find(model(x), y)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

# -- rows of a mask (`j, k = mask.T`) and a stack of masks are masks
OFFSETS = """
def find(p, targets):
    gxy = targets[:, 2:4]
    j, k = ((gxy % 1. < 0.5) & (gxy > 1.)).T
    j = torch.stack((torch.ones_like(j), j, k))
    return targets.repeat((3, 1, 1))[j]
""" + TRAIN


def test_the_rows_of_a_transposed_mask_stacked_again_index_as_a_mask():
    """yolov7's find_3_positive: `j, k = (mask).T` then `torch.stack((torch.ones_like(j), j, k))`:
    still a bool mask, so `t.repeat(...)[j]` has a data-dependent shape."""
    assert ("GB008", 6) in default(OFFSETS), default(OFFSETS)


def test_a_stack_of_a_mask_with_a_float_tensor_is_not_a_mask():
    body = OFFSETS.replace("torch.ones_like(j), j, k", "torch.ones_like(j).float(), j, k")
    assert ("GB008", 6) not in default(body), default(body)


# -- a list of tuples of device tensors, returned and unpacked again
INDICES = """
def find(p, targets):
    indices = []
    for i in range(3):
        b = targets[:, 0].long()
        indices.append((b, targets[:, 1]))
    return indices

def build(p, targets):
    indices = find(p, targets)
    for i in range(3):
        b, a = indices[i]
        idx = b == 2
        b, a = b[idx], a[idx]
    return b
""" + TRAIN.replace("find(", "build(")


def test_a_list_of_appended_tuples_of_device_tensors_unpacks_to_device_tensors():
    """yolov7's build_targets: `b, a, gj, gi = indices[i]` from find_3_positive's `indices.append((b, a,
    gj, gi))`; `b[b == batch_idx]` is a boolean mask on the device."""
    assert ("GB008", 14) in default(INDICES), default(INDICES)


def test_a_list_of_appended_tuples_of_host_tensors_stays_quiet():
    body = INDICES.replace("targets[:, 0].long()", "targets[:, 0].long().cpu()").replace(
        "(b, targets[:, 1])", "(b, targets[:, 1].cpu())")
    assert ("GB008", 14) not in default(body), default(body)


# -- a clamp bound read off a device tensor beside a Python number
CLAMP = """
def find(p, targets):
    gain = torch.ones(7, device=targets.device).long()
    gij = targets[:, 2:4].long()
    return gij.clamp_(0, {BOUND})
""" + TRAIN


def test_a_device_elements_as_a_clamp_bound_beside_a_number_is_read_with_item():
    """yolov7's `gj.clamp_(0, gain[3] - 1)`: the (Scalar, Scalar) overload reads the 0-d tensor on the host."""
    found = default(CLAMP.replace("{BOUND}", "gain[3] - 1"))
    assert ("GB002", 5) in found, found


def test_clamp_bounds_that_are_numbers_or_whole_tensors_stay_quiet():
    for bound in ("6", "gain", "len(p) - 1"):
        found = default(CLAMP.replace("{BOUND}", bound))
        assert ("GB002", 5) not in found, (bound, found)


# -- a mask moved to the device is still a mask
MOVED = """
def build(p, targets):
    device = torch.device(targets.device)
    cost = targets * 2
    m = (cost.sum(0) > 0.0).to({TO})
    return targets[:, m]
""" + TRAIN.replace("find(", "build(")


def test_a_mask_moved_with_to_device_still_indexes_as_a_mask():
    """yolov7's `fg_mask_inboxes = (matching_matrix.sum(0) > 0.0).to(device)`, then `all_b[fg_mask_inboxes]`."""
    found = default(MOVED.replace("{TO}", "device"))
    assert ("GB008", 6) in found, found


def test_a_mask_moved_and_cast_to_long_is_an_index_not_a_mask():
    found = default(MOVED.replace("{TO}", "device, torch.long"))
    assert ("GB008", 6) not in found, found


# -- a CUDA default tensor type: factories without device= make CUDA tensors
DEFAULT = """
torch.set_default_tensor_type({TYPE})

def train(model, loader, opt):
    for x, y in loader:
        idx = torch.randperm(8)
        for start in range(0, 8, 2):
            rows = idx[start:start + 2].tolist()
        loss = model(torch.tensor(x)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_cuda_default_tensor_type_puts_factories_on_the_device():
    """recurrent-ppo's train.py sets `torch.cuda.FloatTensor` as the default type: `torch.randperm(n)` is a
    CUDA tensor (its `.tolist()` a readback) and `torch.tensor(obs)` a copy of host data to the device."""
    found = default(DEFAULT.replace("{TYPE}", "'torch.cuda.FloatTensor'"))
    assert ("GB002", 8) in found and ("GB010", 9) in found, found


def test_a_cpu_default_tensor_type_leaves_factories_on_the_host():
    found = default(DEFAULT.replace("{TYPE}", "'torch.FloatTensor'"))
    assert ("GB002", 8) not in found and ("GB010", 9) not in found, found


def test_typed_constructors_stay_on_the_host_under_a_cuda_default():
    """ssd.pytorch: `torch.LongTensor(n)` is a CPU LongTensor whatever the default type."""
    body = DEFAULT.replace("{TYPE}", "'torch.cuda.FloatTensor'").replace("torch.randperm(8)", "torch.LongTensor(8)")
    found = default(body)
    assert ("GB002", 8) not in found, found


def test_from_numpy_stays_on_the_host_under_a_cuda_default():
    """ssd.pytorch's dataset and test loop: `torch.from_numpy(img)` shares the array's host memory whatever the
    default type, so it copies nothing to the device."""
    body = DEFAULT.replace("{TYPE}", "'torch.cuda.FloatTensor'").replace("torch.tensor(x)", "torch.from_numpy(x)")
    found = default(body)
    assert ("GB010", 9) not in found, found


# -- a def that builds its own module on the CPU and never names a device
HOST_MODEL = """
def evaluate(path, env, episodes=10):
    model = Net(4, 2)
    model.load_state_dict(torch.load(path, map_location="cpu")["model"])
    {MOVE}
    obs = env.initial()
    returns = []
    while len(returns) < episodes:
        out = model(obs)
        obs = env.step(out["action"])
        if obs["done"].item():
            returns.append(obs["episode_return"].item())
    return returns
"""


def test_a_def_that_builds_its_module_and_names_no_device_runs_on_the_host():
    """torchbeast's test(): `model = Net(...)` loaded with map_location="cpu" and called in an episode
    loop; its outputs, and what the environment returns for them, are host tensors: `.item()` is free."""
    found = default(HOST_MODEL.replace("{MOVE}", "pass"))
    assert ("GB002", 11) not in found and ("GB002", 12) not in found, found


def test_the_same_def_moving_its_module_to_the_gpu_is_still_checked():
    found = default(HOST_MODEL.replace("{MOVE}", "model.cuda()"))
    assert ("GB002", 11) in found, found


# -- environments stepped in worker processes through pipes
WORKERS = """
class Trainer:
    def __init__(self):
        self.actions = torch.zeros(128, 8, device=DEVICE)

    def run(self):
        for update in range(100):
            self.sample()
            self.train_epochs()

    def train_epochs(self):
        for epoch in range(4):
            loss = self.model(torch.as_tensor(self.obs).to(DEVICE)).sum()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()

    def sample(self):
        for t in range(128):
            action = self.actions[t]
            for w, worker in enumerate(self.workers):
                worker.child.send(({CMD}, action[w].cpu().numpy()))
            for w, worker in enumerate(self.workers):
                obs, reward, done, info = worker.child.recv()
                self.obs[w] = obs
"""


def test_a_loop_that_sends_step_to_its_workers_steps_environments():
    """recurrent-ppo's rollout: `worker.child.send(("step", action))` for each worker: the loop around it
    is an environment step, its per-worker action readback (`.cpu()`) a per-step sync."""
    found = default(WORKERS.replace("{CMD}", '"step"'))
    assert ("GB002", 22) in found, found


def test_a_loop_that_sends_other_commands_to_its_workers_is_not_an_env_step():
    found = default(WORKERS.replace("{CMD}", '"reset"'))
    assert ("GB002", 22) not in found, found


# -- a mask carried in a batch dict by name
MASK_KEY = """
def train(model, loader, opt):
    for samples in loader:
        samples = {k: v.to(DEVICE) for k, v in samples.items()}
        value = model(samples["obs"])
        value = value[samples[{KEY}]]
        loss = value.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_device_tensor_indexed_by_a_batch_dicts_mask_entry_is_a_boolean_mask():
    """recurrent-ppo's `value[samples["loss_mask"]]`: the padding mask a minibatch dict carries."""
    found = default(MASK_KEY.replace("{KEY}", '"loss_mask"'))
    assert ("GB008", 6) in found, found


def test_a_batch_dicts_index_entry_is_not_a_mask():
    found = default(MASK_KEY.replace("{KEY}", '"indices"'))
    assert ("GB008", 6) not in found, found


def test_a_host_batchs_mask_entry_indexing_a_host_tensor_stays_quiet():
    body = MASK_KEY.replace("{KEY}", '"loss_mask"').replace('"obs"])', '"obs"]).cpu()')
    found = default(body)
    assert ("GB008", 6) not in found, found
