"""What the test of an `if` says about the type of a name it checks: `isinstance(x, torch.Tensor)`,
`torch.is_tensor(x)`, `type(x) is torch.Tensor`, `isinstance(x, (list, tuple))`, `isinstance(x, float)`,
`isinstance(x, Distribution)`. flow.FlowRules narrows the name's kind inside the branch (and after it, when the
other way leaves)."""
from __future__ import annotations

import ast

from gobrrr.lint.loops import name_of


def type_checked(test: ast.AST) -> set[str]:
    """Names whose type the condition tests: `type(x)`, `isinstance(x, ...)`, `torch.is_tensor(x)`."""
    return {n.args[0].id for n in ast.walk(test) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Name) and name_of(n.func) in ("type", "isinstance", "is_tensor")}


def tensor_test(test: ast.AST) -> tuple[str | None, bool]:
    """(x, True) for `isinstance(x, torch.Tensor)` / `torch.is_tensor(x)` / `type(x) is torch.Tensor`,
    (x, False) for its `not` (or `is not`):
    the way the test does not take holds something else (a numpy array)."""
    positive = True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, False
    if isinstance(test, ast.Call) and test.args and isinstance(test.args[0], ast.Name) and (
            name_of(test.func) == "is_tensor" and len(test.args) == 1
            or name_of(test.func) == "isinstance" and len(test.args) == 2 and name_of(test.args[1]) == "Tensor"):
        return test.args[0].id, positive
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Call) \
            and name_of(test.left.func) == "type" and len(test.left.args) == 1 and isinstance(test.left.args[0], ast.Name) \
            and name_of(test.comparators[0]) == "Tensor":   # `type(x) is not torch.Tensor`
        return test.left.args[0].id, positive == isinstance(test.ops[0], (ast.Is, ast.Eq))
    return None, positive


def container_test(test: ast.AST) -> str | None:
    """x for `isinstance(x, list)` (tuple, dict, or a tuple of them): a Python container there, never tested
    as a tensor (`if not images:` asks whether the list is empty)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and test.values:
        return container_test(test.values[0])   # isinstance(images, list) and images
    if isinstance(test, ast.Call) and name_of(test.func) == "isinstance" and len(test.args) == 2 \
            and isinstance(test.args[0], ast.Name):
        types = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
        if types and all(name_of(t) in ("list", "tuple", "dict", "List", "Tuple", "Dict", "Sequence") for t in types):
            return test.args[0].id
    return None


def number_test(test: ast.AST) -> str | None:
    """x for `isinstance(x, float)` (int, bool, numbers.Number, or a tuple of them): a Python number there."""
    if isinstance(test, ast.Call) and name_of(test.func) == "isinstance" and len(test.args) == 2 \
            and isinstance(test.args[0], ast.Name):
        types = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
        if types and all(name_of(t) in ("float", "int", "bool", "Number", "Real", "Integral") for t in types):
            return test.args[0].id
    return None


def dist_test(test: ast.AST) -> str | None:
    """x for `isinstance(x, torch.distributions.Distribution)` (or one of its classes, Normal)."""
    if isinstance(test, ast.Call) and name_of(test.func) == "isinstance" and len(test.args) == 2 \
            and isinstance(test.args[0], ast.Name) and ("distributions." in ast.unparse(test.args[1])
                                                        or name_of(test.args[1]) in ("Distribution", "Normal")):
        return test.args[0].id
    return None


def numbers_after(test: ast.AST) -> set[str]:
    """Names that hold Python numbers after `if <test>: continue` (or return, raise): `if isinstance(v, bool) or
    not isinstance(v, (int, float)): continue` leaves only numbers below it (lerobot's metrics tracker)."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    return {x for p in parts if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not)
            and (x := number_test(p.operand)) is not None}


__all__ = ["container_test", "dist_test", "number_test", "numbers_after", "tensor_test", "type_checked"]
