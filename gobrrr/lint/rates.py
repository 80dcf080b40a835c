"""Options that default to 1: a `step % log_interval == 0` branch with such a rate runs every step.

The project's configs are read once per run, for every rate-like name they give a number: a dataclass field
or class attribute, an argparse option, a keyword of a call that builds a config. The names set to 1 somewhere
and to no other number anywhere are the every-step rates (`check.py` hands them to hot.py as `every_step`).
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.loops import name_of


def defaults_of_one(nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """(names some config sets to 1 by default, names it sets to another number): a dataclass field or class
    attribute (`logging_steps: int = 1`, `= field(default=1)`), an argparse option (`--log-interval`,
    `default=1`), a rate given to a call (`TrainArgs(log_interval=1)`). A default of None (unset; the branch
    guards on it) says nothing either way."""
    ones, others = set(), set()

    def sort(name: str, default: ast.AST | None) -> None:   # a number default: 1, or another
        if isinstance(default, ast.Constant) and default.value is not None and not isinstance(default.value, str):
            (ones if default.value == 1 and default.value is not True else others).add(name)

    for n in nodes:
        if isinstance(n, ast.ClassDef):
            for st in n.body:
                target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0] \
                    if isinstance(st, ast.Assign) and len(st.targets) == 1 else None
                if isinstance(target, ast.Name) and st.value is not None:
                    v = st.value
                    if isinstance(v, ast.Call) and name_of(v.func) == "field":
                        v = next((k.value for k in v.keywords if k.arg == "default"), None)
                    sort(target.id, v)
        elif isinstance(n, ast.Call) and name_of(n.func) == "add_argument":
            flags = [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not flags:
                continue
            dest = next((k.value.value for k in n.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)),
                        flags[-1].lstrip("-").replace("-", "_"))
            sort(dest, next((k.value for k in n.keywords if k.arg == "default"), None))
        elif isinstance(n, ast.Call):   # a config built with its rates: `TrainArgs(log_interval=1, ...)`
            for k in n.keywords:
                if k.arg and _RATE_NAME.search(k.arg):
                    sort(k.arg, k.value)
    return ones, others


_RATE_NAME = re.compile(r"interval|every|freq|period|_steps$")


def switches(nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """(options some config leaves off by default, options it turns on): an argparse flag with
    `action="store_true"` or `default=False`, a dataclass field, class attribute or module constant `= False`
    (or `= True`)."""
    off, on = set(), set()
    for n in nodes:
        if isinstance(n, ast.Module):   # nanoGPT's `compile = True`, overridden from the command line
            for st in n.body:
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) \
                        and isinstance(st.value, ast.Constant) and isinstance(st.value.value, bool):
                    (on if st.value.value else off).add(st.targets[0].id)
        elif isinstance(n, ast.ClassDef):
            for st in n.body:
                if isinstance(st, (ast.Assign, ast.AnnAssign)) and isinstance(st.value, ast.Constant) \
                        and isinstance(st.value.value, bool):
                    target = st.target if isinstance(st, ast.AnnAssign) else st.targets[0]
                    if isinstance(target, ast.Name):
                        (on if st.value.value else off).add(target.id)
        elif isinstance(n, ast.Call) and name_of(n.func) == "add_argument":
            flags = [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not flags:
                continue
            kw = {k.arg: k.value for k in n.keywords if k.arg}
            dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else flags[-1].lstrip("-").replace("-", "_")
            default, action = kw.get("default"), kw.get("action")
            if isinstance(default, ast.Constant) and isinstance(default.value, bool):
                (on if default.value else off).add(dest)
            elif default is None and isinstance(action, ast.Constant) and action.value in ("store_true", "store_false"):
                (off if action.value == "store_true" else on).add(dest)
    return off, on
