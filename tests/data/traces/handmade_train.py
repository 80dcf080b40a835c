# The source that tests/data/traces/handmade.json pretends to profile: that trace was written
# by hand (see tests/test_timeline.py for the expected figures), this file is never run. The
# tests point the doctor's source resolver here so the trace's frames resolve to these lines.
import torch


def make_batch():
    return torch.randn(1000, 2000)


def step(model, opt, x_cpu):
    x = x_cpu.to("cuda")  # pageable H2D copy: line 12
    loss = model(x).mean()
    loss.backward()
    opt.step()
    return loss.item()  # sync: line 16
