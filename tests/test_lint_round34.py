"""gobrrr lint, issue 29's round on heldout33 (torchcv, code of the torch 0.3 / Python 2 era): `loss.data[0]`,
how a loss was read as a number before `.item()` existed, and Python 2 `print x` statements, one-line or running
on (`print voc_eval(\\n ...)`), which made the whole file unreadable. Each shape from a minimal example, beside
the neighbour that must stay quiet (or refused)."""
from __future__ import annotations

import textwrap

from lintcase import line_of, rules

from gobrrr.lint.check import main

OLD_READ = """
import torch


def train(net, criterion, optimizer, loader):
    train_loss = 0
    for inputs, targets in loader:
        out = net(inputs.cuda(non_blocking=True))
        loss = criterion(out, targets.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()
        train_loss += loss.data[0]
        first = out.data[0]
"""




def test_the_pre_04_read_of_a_loss_is_a_sync_and_a_row_of_a_batch_is_not():
    assert rules(OLD_READ) == [(line_of(OLD_READ, "loss.data[0]"), "GB002")]   # `out.data[0]`: a row, on the device


PY2 = """
import torch


def evaluate(net, loader):
    for i, (inputs, box_targets) in enumerate(loader):
        loc_preds = net(inputs.cuda())
        print '%d/%d' % (i, len(loader))  # progress
        boxes = loc_preds.cpu()
    print voc_eval(
        boxes, box_targets,
        iou_thresh=0.5)
"""


def test_a_python_2_file_of_print_statements_is_checked(tmp_path, capsys):
    path = tmp_path / "eval.py"
    path.write_text(textwrap.dedent(PY2))
    assert main([str(path)]) == 1   # findings, no refusal
    out = capsys.readouterr().out
    assert f"eval.py:{line_of(PY2, 'inputs.cuda()')}:" in out and f"eval.py:{line_of(PY2, 'loc_preds.cpu()')}:" in out


def test_a_file_that_is_broken_beside_its_print_statements_is_still_refused_in_oneline_of(tmp_path, capsys):
    path = tmp_path / "eval.py"
    path.write_text(textwrap.dedent(PY2).replace("def evaluate(net, loader):", "def evaluate(net, loader:"))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot check this file" in err[0] and "Traceback" not in err[0]
