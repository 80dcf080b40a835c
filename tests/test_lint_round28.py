"""gobrrr lint on code written for Python 3.6 (DeepRL: `async` as a parameter name): read with that grammar when
today's refuses it, beside a file that does not parse in either, which is still refused in one line."""
from __future__ import annotations

import textwrap

from gobrrr.lint.check import main

OLD = """
import torch


def train(model, opt, loader, async=False):
    for x, y in loader:
        loss = model(x.cuda()).mean()
        loss.backward()
        opt.step()
        print(loss.item())
"""


def test_a_file_for_python_36_is_checked_with_its_grammar(tmp_path, capsys):
    (tmp_path / "agent.py").write_text(textwrap.dedent(OLD))
    assert main([str(tmp_path), "--format", "json"]) == 1   # findings, not a refusal
    out = capsys.readouterr()
    assert '"GB002"' in out.out and "cannot check" not in out.err


def test_a_file_that_no_grammar_reads_is_still_refused_with_todays_error(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "broken.py:1" in err and "cannot check this file: SyntaxError" in err and "Traceback" not in err
