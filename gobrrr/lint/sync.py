"""The expression rules of `gobrrr lint` that read a device value on the host: GB002 (`.item()`,
`.cpu()`, `float(t)`), GB003 (printing, formatting or logging a tensor), GB004 (synchronize), GB008
(data-dependent shapes). A mixin of rules.Checker: it relies on the checker's `kind()`,
`looping()`, `flag()`, `hotmap` and `functions`; each rule fires only on evidence of a tensor.
"""
from __future__ import annotations

import ast

from gobrrr.lint.hot import is_bench_name
from gobrrr.lint.kinds import DATA_DEPENDENT, HOSTISH, TENSORISH

READS = {"item", "cpu", "tolist", "numpy"}
_LOGGERS = {"add_scalar", "add_scalars", "add_histogram", "log_metric", "log_metrics"}


class SyncRules:
    """GB002/GB003/GB004/GB008 on calls, f-strings, %-formatting and boolean-mask indexing."""

    def sync_rules(self, node, func, name, method, recv, kw) -> None:
        # GB002: reading a device value on the host
        forced = isinstance(kw.get("force"), ast.Constant) and kw["force"].value is True
        if method in READS and recv not in HOSTISH and recv != "generated" and not isinstance(func.value, ast.Constant) \
                and (method != "numpy" or forced) \
                and (method != "tolist" or recv in TENSORISH) \
                and not (method == "cpu" and self.is_model(func.value)):
            # .numpy() of a CUDA tensor raises unless force=True; .tolist() of an unknown is as likely numpy
            self.flag(node, "GB002", what=f"`.{method}()`")
        elif isinstance(func, ast.Name) and func.id in ("float", "int", "bool") and len(node.args) == 1 \
                and self.kind(node.args[0]) in TENSORISH:
            self.flag(node, "GB002", what=f"`{func.id}()` of a tensor")
        # GB003: printing or formatting a tensor
        if isinstance(func, ast.Name) and func.id in ("print", "str", "repr", "format") \
                and any(self.kind(a) in TENSORISH for a in node.args):
            self.flag(node, "GB003", what="printing" if func.id == "print" else "formatting")
        elif method == "format" and isinstance(func.value, ast.Constant) \
                and any(self.kind(a) in TENSORISH for a in [*node.args, *kw.values()]):
            self.flag(node, "GB003", what="formatting")
        elif (method in _LOGGERS or name in ("wandb.log", "mlflow.log_metric", "mlflow.log_metrics")) \
                and any(self.kind(v) in TENSORISH for a in [*node.args, *kw.values()] for v in _values(a)):
            self.flag(node, "GB003", what="logging")  # writer.add_scalar("loss", loss, step) reads it on the host
        # GB004: synchronize in a loop, unless it is measuring time or in benchmark code
        if name.endswith("torch.cuda.synchronize") or method == "synchronize":
            if not (self.hotmap.bench_file or node.lineno in self.hotmap.timed
                    or any(is_bench_name(f) for f in self.functions)):
                self.flag(node, "GB004", what=f"`{ast.unparse(func)}()`")
        # GB008: data-dependent output shapes
        last = name.rsplit(".", 1)[-1]
        if (name.startswith("torch.") and name.count(".") == 1 and last in DATA_DEPENDENT) or \
                (name == "torch.where" and len(node.args) == 1 and not node.keywords):
            self.flag(node, "GB008", what=f"`{name}()`")
        elif method in DATA_DEPENDENT and recv not in HOSTISH and not name.startswith(("torch.", "numpy.", "np.")):
            self.flag(node, "GB008", what=f"`.{method}()`")

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if self.looping() and any(isinstance(v, ast.FormattedValue) and self.kind(v.value) in TENSORISH
                                  for v in node.values):
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        right = [e.value if isinstance(e, ast.Starred) else e for e in node.right.elts] \
            if isinstance(node.right, ast.Tuple) else [node.right]   # "%.4g %.4g" % (*mloss, n)
        if self.looping() and isinstance(node.op, ast.Mod) and self.kind(node.left) == "str" \
                and any(self.kind(r) in TENSORISH for r in right):   # "%.4f %.4f" % (loss, acc)
            self.flag(node, "GB003", what="formatting")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self.index_rule(node)
        if self.looping() and isinstance(node.ctx, ast.Load) and self.kind(node.value) not in HOSTISH:
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(self.kind(p) == "mask" for p in parts):
                self.flag(node, "GB008", what="boolean-mask indexing `x[mask]`")
        self.generic_visit(node)


def _values(node: ast.AST) -> list[ast.AST]:
    """The values a logging call is handed: the dict's values for wandb.log({"loss": loss})."""
    return [v for v in node.values if v is not None] if isinstance(node, ast.Dict) else [node]


__all__ = ["READS", "SyncRules"]
