"""gobrrr lint, issue 29's round 55 on heldout63's first sight (MARL-Algorithms): the firing test beside the
neighbour that must stay quiet."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import lint_source


def test_a_dict_turned_into_host_tensors_key_by_key_holds_host_tensors():
    """MARL-Algorithms' learners turn the replay sample into tensors in place, `for key in batch.keys():
    batch[key] = torch.tensor(batch[key], dtype=torch.float32)`, then copy its items up with `s = batch['s'];
    s = s.cuda()` every train step; the items' kind was lost, so the copies went unreported (22 of 127 per-step
    lines found at first sight). A dict converted with `device=` holds device tensors (the conversion is the copy),
    and the `.cuda()` of its item is quiet."""
    src = textwrap.dedent("""
        import torch

        def learn(net, opt, sample, other, device):
            for key in sample.keys():
                sample[key] = torch.tensor(sample[key], dtype=torch.float32)
            for key in other.keys():
                other[key] = torch.tensor(other[key], dtype=torch.float32, device=device)
            s = sample["s"]
            o = other["s"]
            s = s.cuda()
            o = o.cuda()
            loss = net(s + o).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

        def train(net, opt, buffer, device):
            for step in range(1000):
                learn(net, opt, buffer.sample(32), buffer.sample(32), device)
        """)
    found = sorted((f.line, f.rule) for f in lint_source(src, "qmix.py") if f.hot)
    assert (11, "GB009") in found and not any(line == 12 for line, _ in found), found   # line 8 is its own copy
