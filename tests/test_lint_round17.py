"""gobrrr lint, issue 29's eighteenth round (round 17 of the rules): precision on heldout16's false
findings (DINO, ElegantRL, REPA), each generic shape from a minimal example in the default run, with the
neighbouring true shape that must still fire."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- an empty literal copied to the device moves no bytes
EMPTY = """
def train(model, loader, opt):
    for x, y in loader:
        x = x.to(DEVICE)
        idx = torch.tensor([]).to('cuda')
        pad = torch.Tensor([]).type_as(x)
        loss = model(x, idx, pad).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_an_empty_literal_copied_to_the_device_stays_quiet():
    """DINO's `torch.tensor([]).to('cuda')`, REPA's `torch.Tensor([]).type_as(x)`: nothing to copy."""
    assert not [f for f in default(EMPTY) if f[0] == "GB001"], default(EMPTY)


def test_a_literal_with_elements_copied_to_the_device_still_fires():
    body = EMPTY.replace("torch.tensor([])", "torch.tensor([1, 2])").replace("torch.Tensor([])", "torch.Tensor([0.5])")
    assert ("GB001", 5) in default(body) and ("GB001", 6) in default(body), default(body)


# -- a tensor made from a host list without device=, returned through a method the class binds to an attribute
EVAL = """
class Evaluator:
    def __init__(self, env, vectorized):
        self.env = env
        if vectorized:
            self.get_returns = self.get_returns_vec
        else:
            self.get_returns = self.get_returns_single

    def evaluate(self, actor):
        returns = self.get_returns(actor)[:, 0]
        return returns.mean().item(), returns.std().item()

    def get_returns_single(self, actor) -> torch.Tensor:
        rows = [rollout(self.env, actor) for _ in range(4)]
        return torch.tensor(rows, dtype=torch.float32)

    def get_returns_vec(self, actor) -> torch.Tensor:
        rows = [rollout(self.env, actor) for _ in range(4)]
        return torch.tensor(rows)


def rollout(env, actor):
    return 1.0, 2


def train(agent, buffer, evaluator, opt):
    for step in range(1000):
        loss = agent(buffer.sample().to(DEVICE)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        evaluator.evaluate(agent)
"""


def test_a_host_list_tensor_returned_through_a_bound_method_attribute_stays_quiet():
    """ElegantRL's `self.get_cumulative_rewards_and_step = self..._vectorized_env` (or `_single_env`), each
    returning `th.tensor(list_of_floats)` without device=: `.item()`/`.std()` of a CPU tensor, no sync."""
    assert not [f for f in default(EVAL) if f[0] == "GB002"], default(EVAL)


def test_a_device_tensor_returned_through_a_bound_method_attribute_still_syncs():
    body = EVAL.replace("torch.tensor(rows)", "torch.tensor(rows, device=DEVICE)")
    assert ("GB002", 12) in default(body), default(body)


# -- a name the same condition asks for a string key (`meta and 'known' in meta`) is a dict, not a tensor
CRITERION = """
class Criterion(nn.Module):
    def forward(self, outputs, targets):
        meta = outputs['meta']
        loss = F.l1_loss(outputs['boxes'], targets)
        if self.training and meta and 'known' in meta:
            loss = loss + F.l1_loss(meta['known'], targets)
        return loss


def train(model, loader, opt):
    criterion = Criterion()
    for x, y in loader:
        x, y = x.to(DEVICE), y.to(DEVICE)
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_dict_asked_for_a_string_key_in_the_same_condition_stays_quiet():
    """DINO's `if self.training and dn_meta and 'output_known_lbs_bboxes' in dn_meta:` (dn_meta a dict of
    ints and tensors): `'key' in t` is no tensor op, so the name is a container and its truth a host test."""
    assert not [f for f in default(CRITERION) if f[0] == "GB007"], default(CRITERION)


def test_a_dict_entry_compared_in_a_condition_still_syncs():
    body = CRITERION.replace("if self.training and meta and 'known' in meta:",
                             "if 'known' in meta and meta['known'].sum() > 0:")
    assert ("GB007", 6) in default(body), default(body)
