"""gobrrr lint, issue 29's twenty-second round (round 21 of the rules): heldout19's misses, each from a minimal
example written for the shape, beside the neighbouring shape that must stay quiet."""
from __future__ import annotations

from tests.test_lint_round4 import default

# -- a loop over a name bound to a wrapped loader
EVAL = """
def evaluate(net, dl, main):
    if main:
        diter = enumerate(tqdm(dl))
    else:
        diter = enumerate(dl)
    for i, (imgs, label) in diter:
        label = label.squeeze(1).cuda()
        probs = torch.zeros(label.shape).cuda()
        for scale in (0.5, 1.0):
            probs += net(imgs.cuda())
"""


def test_a_loop_over_a_name_bound_to_a_wrapped_loader_takes_batches():
    """BiSeNet's evaluators: `diter = enumerate(tqdm(dl))`, then `for i, (imgs, label) in diter:` with the
    batch's copies and a zeros tensor built on the host, every batch."""
    found = default(EVAL)
    assert ("GB009", 8) in found and ("GB001", 9) in found, found


def test_a_loop_over_a_name_bound_to_something_else_takes_none():
    found = default(EVAL.replace("enumerate(tqdm(dl))", "enumerate(sizes(dl))").replace(
        "enumerate(dl)", "enumerate(sizes(dl))"))
    assert ("GB009", 8) not in found and ("GB001", 9) not in found, found


# -- a method handed the optimizer steps it
STEP = """
class MixedPrecision:
    def optimize(self, opt):
        norm = 0.0
        for p in self.params:
            norm += p.grad.norm().item() ** 2
        opt.step()
        return norm


class Loop:
    def forward_backward(self, batch):
        for i in range(0, batch.shape[0], self.micro):
            loss = self.model(batch[i:i + self.micro]).mean()
            loss.backward()

    def run_step(self, batch):
        self.forward_backward(batch)
        norm = self.mp.optimize(self.opt)
        print(self.ema.mean().item(), norm)

    def run(self):
        while True:
            batch = next(self.data)
            self.run_step(batch)
"""


def test_a_loop_whose_step_hands_the_optimizer_to_a_helper_is_the_step_loop():
    """consistency_models' TrainLoop: the micro-batch loop does backward; `self.mp_trainer.optimize(self.opt)`
    after it steps the optimizer and reads a norm per parameter with .item(), every step of the outer loop."""
    found = default(STEP)
    assert ("GB002", 6) in found and ("GB002", 20) in found, found


def test_a_helper_handed_something_else_is_no_step():
    """Handed a config, the helper is no optimizer step; since round 73 the loop is still the step loop, because
    `forward_backward` only walks the batch it is handed in micro-batches (`range(0, batch.shape[0], micro)`:
    pieces of one step). A helper whose inner loop is no walk of its argument (a sampler's `range(0, n, k)` over
    a fixed count) keeps the loop around it an outer loop, as round 21 had it."""
    handed_cfg = STEP.replace("self.mp.optimize(self.opt)", "self.mp.optimize(self.cfg)")
    assert ("GB002", 20) in default(handed_cfg)
    assert ("GB002", 20) not in default(handed_cfg.replace("range(0, batch.shape[0], self.micro)",
                                                           "range(0, self.n_steps, self.micro)"))
