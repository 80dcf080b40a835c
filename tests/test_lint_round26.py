"""gobrrr lint, issue 29's twenty-seventh round (round 26 of the rules): batches that reach the step loop through an
iterator the lint did not know (edm2's `dataset_iterator`, TorchCFM's `infiniteloop(dataloader)` generator). Each
shape from a minimal example, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

EDM2 = """
def train(ddp, loss_fn, optimizer, make_loader, device):
    dataset_iterator = iter(make_loader())
    while True:
        optimizer.zero_grad(set_to_none=True)
        for round_idx in range(4):
            images, labels = next(dataset_iterator)
            loss = loss_fn(net=ddp, images=images.to(device), labels=labels.to(device))
            loss.sum().backward()
        optimizer.step()
"""


def test_a_dataset_iterator_yields_host_batches():
    """`next(dataset_iterator)` of a loader built elsewhere (edm2 builds it by class name from a kwargs dict): a
    host batch, so its blocking `.to(device)` is a GB009 each accumulation round; a name that says nothing of
    data (`it`) stays unknown."""
    assert ("GB009", 8) in default(EDM2)
    assert ("GB009", 8) not in default(EDM2.replace("dataset_iterator", "it"))


CFM = """
def infiniteloop(dataloader):
    while True:
        for x, y in iter(dataloader):
            yield x


def train(net, optim, dataset, device):
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True, num_workers=4, drop_last=True)
    datalooper = infiniteloop(dataloader)
    for step in range(100000):
        optim.zero_grad()
        x1 = next(datalooper).to(device)
        net(x1).mean().backward()
        optim.step()
"""


def test_a_generator_that_yields_a_loaders_batches_is_that_loader():
    """`datalooper = infiniteloop(dataloader)`: a project generator that loops over the loader it is handed and
    yields its items gives that loader's batches, here from pageable memory, copied blocking every step."""
    assert ("GB009", 13) in default(CFM)


def test_a_generator_that_makes_its_own_values_is_no_loader():
    """A generator that yields what it computes (not the loader's items) says nothing of where they live."""
    own = CFM.replace("        for x, y in iter(dataloader):\n            yield x\n", "        yield make_batch()\n")
    assert "make_batch" in own and ("GB009", 13) not in default(own)


MATCHER = """
from scipy.optimize import linear_sum_assignment


class HungarianMatcher(nn.Module):
    def forward(self, outputs, targets, return_topk=False):
        C = outputs["pred_logits"].softmax(-1)[..., :4].cpu()
        pairs = [linear_sum_assignment(c) for c in C]
        indices = [(torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)) for i, j in pairs]
        if return_topk:
            return {"indices_o2m": C.topk(2)}
        return {"indices": indices}


class Criterion(nn.Module):
    def __init__(self, matcher):
        super().__init__()
        self.matcher = matcher

    def go(self, indices):
        out = []
        for ind in [torch.cat([idx[0][:, None], idx[1][:, None]], 1) for idx in indices]:
            unique, counts = torch.unique(ind, return_counts=True, dim=0)
            out.append(unique)
        return out

    def forward(self, outputs, targets):
        indices = self.matcher(outputs, targets)["indices"]
        indices_aux = self.matcher(outputs["aux"], targets)["indices"]
        indices = [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(indices.copy(), indices_aux.copy())]
        return self.go(indices)


def train(model, crit, opt, loader):
    for x, y in loader:
        loss = crit(model(x.to(DEVICE, non_blocking=True)), y)
        loss.backward()
        opt.step()
"""


def test_a_key_of_the_dict_a_project_function_returns_has_that_values_kind():
    """D-FINE's matcher returns `{"indices": indices}` (or, asked for top-k, another key), a list of host index pairs
    from scipy: `matcher(...)["indices"]` is host, and so is the list of its pairs joined with the auxiliary layers'
    (`zip(indices.copy(), indices_aux.copy())`), so `torch.unique` over them syncs nothing; indices the matcher
    makes on the device still do."""
    assert ("GB008", 23) not in default(MATCHER)
    on_device = MATCHER.replace("torch.as_tensor(i, dtype=torch.int64), torch.as_tensor(j, dtype=torch.int64)",
                                "torch.as_tensor(i, device=DEVICE), torch.as_tensor(j, device=DEVICE)")
    assert ("GB008", 23) in default(on_device)
