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
