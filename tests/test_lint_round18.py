"""gobrrr lint, issue 29's nineteenth round (round 18 of the rules): recall on shapes that recur across the
judged repositories, each from a minimal example written for the shape, with the neighbouring quiet shape
that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a 0-d element of a one-dimensional device tensor as an index (read with .item())
ELEMENT = """
def train(model, loader, opt):
    for x, y in loader:
        x, y = x.to(DEVICE), y.to(DEVICE)
        out = model(x)
        picked = torch.nonzero(y > 0).view(-1)
        for i in range(picked.numel()):
            j = picked[i]
            out[0, j, :] = 0
        for g in torch.unique(y):
            out[g] += 1
        loss = out.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_an_element_of_a_flat_device_tensor_as_an_index_fires():
    """FastTD3's per-task statistics (`for task_id in torch.unique(ids): count[task_id]`), faster-rcnn's
    `ind = inds[i]` of `nonzero(...).view(-1)`: each index is a 0-d CUDA tensor, read with .item()."""
    found = default(ELEMENT)
    assert ("GB002", 9) in found and ("GB002", 11) in found, found


def test_a_row_of_a_tensor_of_unknown_rank_as_an_index_stays_quiet():
    """`rows[i]` of a 2-d tensor is a row: indexing with it is advanced indexing on the device."""
    body = ELEMENT.replace("torch.nonzero(y > 0).view(-1)", "torch.nonzero(y > 0)").replace(
        "torch.unique(y)", "torch.unique(y, dim=0)")
    found = default(body)
    assert ("GB002", 9) not in found and ("GB002", 11) not in found, found


# -- torch distributions behind an alias, a list or a TransformedDistribution wrapper (GB013)
ALIAS = """
class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.Dist = torch.distributions.Normal

    def act(self, obs):
        mu = self.net(obs)
        d = self.Dist(mu, mu.exp())
        a = d.sample()
        return a, d.log_prob(a)

def collect(actor, env, obs):
    for step in range(1000):
        obs = torch.as_tensor(obs, device=DEVICE)
        a, logp = actor.act(obs)
        obs, r, done, info = env.step(a)
"""


def test_a_distribution_class_held_in_an_attribute_fires():
    """ElegantRL's `self.ActionDist = th.distributions.normal.Normal`, then `self.ActionDist(avg, std)`: a
    validated Normal built per step, sampled with torch.normal, its log_prob validated."""
    found = default(ALIAS)
    assert {("GB013", 10), ("GB013", 11), ("GB013", 12)} <= set(found), found


def test_an_attribute_bound_to_two_distribution_classes_stays_quiet():
    body = ALIAS.replace("self.Dist = torch.distributions.Normal",
                         "self.Dist = torch.distributions.Normal\n        self.Dist = torch.distributions.Laplace")
    assert not [f for f in default(body) if f[0] == "GB013"], default(body)


LIST = """
class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(8, 5)])

    def forward(self, x, actions):
        logits = [h(x) for h in self.heads]
        dists = [Categorical(logits=l) for l in logits]
        logp = [d.log_prob(a) for d, a in zip(dists, actions.unbind(1))]
        return torch.stack(logp, 1).sum(1)

def train(model, loader, opt):
    for x, a in loader:
        x, a = x.to(DEVICE), a.to(DEVICE)
        loss = -model(x, a).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_log_prob_of_each_item_of_a_list_of_distributions_fires():
    """rl_games' and SB3's multi-discrete heads: `[Categorical(logits=l) for l in logits]`, then a
    log_prob per head, each validating its sample on the host."""
    found = default("from torch.distributions import Categorical\n" + LIST)
    assert ("GB013", 11) in found, found


def test_a_list_of_distributions_without_validation_stays_quiet():
    body = LIST.replace("Categorical(logits=l)", "Categorical(logits=l, validate_args=False)")
    found = default("from torch.distributions import Categorical\n" + body)
    assert ("GB013", 11) not in found, found


WRAPPER = """
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

class Squashed(TransformedDistribution):
    def __init__(self, loc, scale):
        super().__init__(Normal(loc, scale), [TanhTransform()])

class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, obs):
        mu = self.net(obs)
        return Squashed(mu, mu.exp())

def update(loader):
    actor = Actor().to(DEVICE)
    opt = torch.optim.Adam(actor.parameters())
    for obs, a in loader:
        obs, a = obs.to(DEVICE), a.to(DEVICE)
        d = actor(obs)
        loss = -d.log_prob(a).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_log_prob_of_a_transformed_distribution_over_a_normal_fires():
    """A SAC actor's SquashedNormal (a TransformedDistribution subclass whose base is a validated Normal):
    its log_prob checks the sample's support on the host."""
    found = default(WRAPPER)
    assert ("GB013", 24) in found, found


def test_a_transformed_distribution_without_validation_stays_quiet():
    body = WRAPPER.replace("[TanhTransform()])", "[TanhTransform()], validate_args=False)")
    assert ("GB013", 24) not in default(body), default(body)


# -- a torchvision transform's output is a host tensor (GB010 when it is copied per image)
TRANSFORM = """
from torchvision import transforms as T
from PIL import Image

def predict(model, paths):
    prep = T.Compose([T.ToTensor(), T.Normalize([0.5], [0.5])])
    model = model.to(DEVICE).eval()
    with torch.no_grad():
        for p in paths:
            img = prep(Image.open(p)).unsqueeze(0)
            img = img.to(DEVICE)
            pred = model(img)
            save(pred)
"""


def test_a_transformed_image_copied_per_image_fires():
    """DeepLabV3Plus' and YOLOP's inference loops: `transform(img).to(device)`, a pageable host tensor
    copied with a blocking .to() per image."""
    assert ("GB010", 11) in default(TRANSFORM), default(TRANSFORM)


def test_a_transform_applied_to_a_device_tensor_stays_quiet():
    """The same transform handed a tensor already on the device returns a device tensor: no copy."""
    body = TRANSFORM.replace("prep(Image.open(p))", "prep(torch.rand(3, 8, 8, device=DEVICE))")
    assert ("GB010", 11) not in default(body), default(body)


# -- an upper-case self attribute the class binds to a host tensor is that tensor, not a config node
TABLE = """
class Targets(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.MEANS = torch.FloatTensor(cfg.MEANS)

    def forward(self, boxes):
        means = self.MEANS.type_as(boxes)
        return boxes - means

def train(model, head, loader, opt):
    for x, boxes in loader:
        x, boxes = x.to(DEVICE), boxes.to(DEVICE)
        loss = (model(x) - head(boxes)).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_an_upper_case_host_table_moved_per_forward_fires():
    """faster-rcnn's `self.BBOX_NORMALIZE_MEANS = torch.FloatTensor(cfg...)`, then `.type_as(gt_boxes)` in
    every forward: a blocking host-to-device copy."""
    assert ("GB010", 8) in default(TABLE), default(TABLE)


def test_an_upper_case_attribute_bound_to_a_config_value_stays_quiet():
    body = TABLE.replace("torch.FloatTensor(cfg.MEANS)", "cfg.MEANS")
    assert ("GB010", 8) not in default(body), default(body)
