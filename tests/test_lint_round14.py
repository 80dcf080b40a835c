"""gobrrr lint, issue 29's fifteenth round (round 14 of the rules): shapes still missed on the judged
repositories after round 13, each from a minimal example in the default run, with the look-alike
shapes that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a numpy array indexed by an element of a device tensor
TALLY = """
class Tally:
    def __init__(self, n):
        self.counts = np.zeros((n + 1, n + 1))
        self.n = n

    def add(self, found, labels):
        if found is None:
            for c in labels.int():
                self.counts[self.n, c] += 1
            return
        for c in labels[:, 0].int():
            self.counts[c, self.n] += 1


def evaluate(model, loader):
    tally = Tally(80)
    for x, y in loader:
        y = y.to(DEVICE)
        out = model(x.to(DEVICE))
        if len(out) == 0:
            tally.add(found=None, labels=y[:, 0])
            continue
        tally.add(out, y)
"""


def test_a_device_element_as_a_numpy_index_is_read_with_index():
    """yolov5's ConfusionMatrix.process_batch: `self.matrix[self.nc, gc] += 1` with gc from iterating
    a CUDA class tensor; numpy takes the 0-d tensor through __index__, an .item() per label."""
    assert ("GB002", 13) in default(TALLY), default(TALLY)


def test_a_host_element_as_a_numpy_index_stays_quiet():
    body = TALLY.replace("y = y.to(DEVICE)", "y = y.numpy()")   # the labels stay a host array
    assert not [f for f in default(body) if f[0] == "GB002"], default(body)


# -- a literal passed where the parameter has no default decides the branches on it
def test_none_passed_to_a_parameter_without_default_walks_its_none_branch():
    """The same tally called with `found=None` (the images without detections): the `if found is None:`
    branch runs on that call, every such image."""
    assert ("GB002", 10) in default(TALLY), default(TALLY)


def test_the_none_branch_stays_off_when_no_call_passes_none():
    body = TALLY.replace("tally.add(found=None, labels=y[:, 0])", "pass")
    assert ("GB002", 10) not in default(body) and ("GB002", 13) in default(body), default(body)
