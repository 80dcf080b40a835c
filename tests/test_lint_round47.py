"""gobrrr lint, issue 29's round on heldout45's misses (StableCascade, pytorch-yolo-v3, FastChat, rnd-pytorch):
each firing test beside the neighbour that must stay quiet."""
from __future__ import annotations

import textwrap
from pathlib import Path

from gobrrr.lint.hot import HotMap
from gobrrr.lint.source import parse


def _looping(text: str) -> set[str]:
    """The names of the defs that hold a step loop, as the lint reads one file."""
    src = parse(Path("m.py"), textwrap.dedent(text))
    return HotMap(src.tree, "m.py", src.nodes).looping


def test_a_loop_over_layers_does_not_make_its_def_a_loop_of_its_own():
    """`for net in self.nets: x = net(x)` (or `self.repmap[j](x)`) runs the layers it iterates: per layer inside
    the step, not a step loop of its own. Before, it made every def named `encode` a loop, so StableCascade's
    training loop, which calls `forward_pass` -> `encode_latents` -> `encode`, was taken for an outer loop and its
    per-step `.item()` reads went unreported. A loop over a loader in a def still makes it one."""
    assert "encode" not in _looping("""
        class Coder:
            def encode(self, x):
                for net in self.nets:
                    x = net(x)
                for j in range(len(self.repmap)):
                    x = self.repmap[j](x)
                return x
        """)
    assert "evaluate" in _looping("""
        def evaluate(model, loader):
            for x, y in loader:
                out = model(x.cuda())
        """)
