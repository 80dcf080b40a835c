"""gobrrr lint, issue 29's twelfth round: shapes met in the misses of the heldout11 set (RT-DETR,
dreamerv3-torch, imagen-pytorch; tuned on here, so no longer unseen), each from a minimal example in the
default run, with the look-alike shapes that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default


# -- math.* on a device scalar
def test_math_isfinite_of_a_summed_loss_dict_reads_it_on_the_host():
    """`loss_value = sum(loss_dict_reduced.values()); if not math.isfinite(loss_value)` (RT-DETR's engine):
    math converts its argument with float(), an .item() every step; a reduce helper that hands back the dict
    or a dict of reduced tensors still holds device tensors."""
    body = """
    import math
    import torch.distributed as tdist

    def reduce_dict(data):
        if tdist.get_world_size() < 2:
            return data
        values = torch.stack(list(data.values()))
        tdist.all_reduce(values)
        return {k: v for k, v in zip(data.keys(), values)}

    def train(model, criterion, loader, opt, device):
        for x, y in loader:
            loss_dict = criterion(model(x.to(device)), y)
            loss = sum(loss_dict.values())
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_value = sum(reduce_dict(loss_dict).values())
            if not math.isfinite(loss_value):
                break
            scale = math.sqrt(loss.detach())
    """
    found = default(body)
    assert ("GB002", 20) in found, found
    assert ("GB002", 22) in found, found


def test_math_of_host_numbers_is_quiet():
    """math.isfinite of a Python float (`loss.item()` already read, a learning rate): nothing more to read."""
    body = """
    import math

    def train(model, loader, opt, lr):
        for x, y in loader:
            loss = model(x.cuda(non_blocking=True), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            values = {"a": 1.0, "b": 2.0}
            total = sum(values.values())
            ok = math.isfinite(total) and math.isfinite(lr) and math.log(len(values)) > 0
    """
    assert not [f for f in default(body) if f[0] == "GB002"], default(body)
