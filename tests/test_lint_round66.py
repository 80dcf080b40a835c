"""gobrrr lint, issue 29's round 66: a Python number written through a device tensor of positions (G.pt's
`cur_reward_sum[new_ids] = 0`, measured syncing on an H100), each beside the neighbours that must stay quiet."""
from __future__ import annotations

import textwrap

from tests.lintcase import line_of, rules

LOOP = """
    import math
    import torch

    def train(model, loader, opt, n):
        scores = torch.zeros(n, 4, device="cuda")
        zero = torch.zeros((), device="cuda")
        for x in loader:
            x = x.cuda(non_blocking=True)
            loss = model(x).mean()
            loss.backward()
            opt.step()
    {body}
    """


def _found(body: str) -> tuple[str, set[int]]:
    src = textwrap.dedent(LOOP).format(body=textwrap.indent(textwrap.dedent(body).strip("\\n"), " " * 8))
    return src, {line for line, rule in rules(src) if rule == "GB010"}


def test_a_number_written_through_positions_the_device_made_is_a_blocking_copy():
    """index_put_ takes the number as a CPU tensor and copies it up, blocking, on every call; the positions may come
    from argmax, randint on the device, topk's or sort's indices (as a pair, by `.indices` or `[1]`), `.long()`,
    and views or slices of any of these."""
    src, found = _found("""
        best = x.argmax(1)
        scores[best] = 0
        _, top = torch.topk(x, 2)
        scores[top[:, 0]] = -math.inf
        scores[x.sort(1).indices[:, 0], 1] = 1.5
        scores[x.max(1)[1]] = -float('inf')
        picks = torch.randint(0, n, (4,), device=x.device).view(-1, 1)
        scores[picks] = True
    """)
    for text in ("scores[best] = 0", "scores[top[:, 0]]", "scores[x.sort(1)", "scores[x.max(1)[1]]", "scores[picks]"):
        assert line_of(src, text) in found, (text, found)


def test_device_values_fills_masks_and_adds_through_positions_stay_quiet():
    """A device value (`zero` made once), `index_fill_` with a number, an in-place add (`t[idx] += 1` reads and
    writes device values), a boolean mask alone (masked_fill), and a mask that is not positions (`scatter` of a
    mask, the top-p shape) copy nothing from the host."""
    src, found = _found("""
        best = x.argmax(1)
        scores[best] = zero
        scores.index_fill_(0, best, 0)
        scores[best] += 1
        keep = x > 0
        scores[keep] = 0
        drop = keep.scatter(1, best[:, None], keep)
        scores[drop] = 0
        first = x.max()
        scores[0] = first
    """)
    assert not found, found
