"""Source attribution for traces: which line of the user's code made a host call.

A `python_function` event in a torch.profiler trace is named `file(first_line): function`: it
tells which function was running, not which line inside it. To name the line we take the
Python frames open at the time of the call (`stacks_at`), walk from the innermost outwards to
the first frame that is the user's own code (not torch, not the standard library, not gobrrr),
take the callee just below it (`<built-in method item ...>` -> `item`, `torch/cuda/__init__.py(..):
synchronize` -> `synchronize`) and look for that call in the function's source with `ast`
(`SourceResolver.call_lines`). When the source is not at hand the function's first line stands in.
"""
from __future__ import annotations

import ast
import builtins
import functools
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

FRAME_RE = re.compile(r"^(.*)\((\d+)\): (.*)$")
_BUILTIN_RE = re.compile(r"^<built-in (?:method|function) ([\w.]+)")
_GOBRRR_DIR = str(Path(__file__).resolve().parent.parent) + os.sep  # an editable install is not under sys.prefix
_LIBRARY_TOPS = {"torch", "gobrrr", "numpy", "triton", "functorch", "_pytest", "pytest", "runpy"}


@dataclass
class Frame:
    file: str
    line: int
    func: str
    ts: float
    end: float
    raw: str
    index: int = -1     # position in its thread's frame list (set by timeline_trace.parse)
    parent: int = -1    # the caller's position, -1 for an outermost frame


@dataclass
class Site:
    """A source location that a host call was attributed to."""
    file: str = "?"
    line: int = 0
    code: str = ""
    func: str = ""
    callee: str = ""
    detail: str = ""    # what the call ran through, when it matters for the fix ("DataParallel")

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}" if self.line else (self.callee or self.file)


def is_generated_file(file: str) -> bool:
    """Code torch wrote at run time: inductor's output (`/tmp/torchinductor_<user>/xx/cxxxx.py`, or under
    TORCHINDUCTOR_CACHE_DIR), FX's `<eval_with_key>.N`, Triton's launchers. Never a line to fix."""
    f = file.replace("\\", "/")
    if "/torchinductor_" in f or f.startswith("<eval_with_key") or "/.triton/cache/" in f:
        return True
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return bool(cache) and f.startswith(cache.replace("\\", "/").rstrip("/") + "/")


def is_graph_frame(f: "Frame") -> bool:
    """A frame that runs a compiled graph: AOTAutograd's runtime (forward and backward of a compiled
    graph) or inductor's generated code. (torch.compile's frame evaluation, eval_frame.py, also wraps the
    functions torch marks `_disable_dynamo`, such as `optimizer.zero_grad`: alone it means nothing.)"""
    file = f.file.replace("\\", "/")
    return "_functorch/aot_autograd.py" in file or "_functorch/_aot_autograd/" in file or is_generated_file(file)


def is_dynamo_frame(f: "Frame") -> bool:
    """torch.compile's frame evaluation: the wrapper between a caller and the function it compiled."""
    return f.file.replace("\\", "/").endswith("torch/_dynamo/eval_frame.py")


def is_library_file(file: str) -> bool:
    """True for frames that are not the user's code: torch, the standard library, built-ins, gobrrr,
    and code torch generated (inductor's files)."""
    if file.startswith("<") or "site-packages" in file or "dist-packages" in file or is_generated_file(file):
        return True
    parts = file.replace("\\", "/").lstrip("/").split("/")
    top = parts[0].removesuffix(".py") if parts else ""
    if len(parts) > 1 and os.path.isabs(file):  # an absolute path: library if under the interpreter or gobrrr
        return file.startswith((sys.base_prefix, sys.prefix, _GOBRRR_DIR))
    return top in _LIBRARY_TOPS or top in sys.stdlib_module_names or _installed(file)


@functools.lru_cache(maxsize=4096)
def _installed(rel: str) -> bool:
    """A path the profiler wrote relative to a sys.path entry (`torchvision/models/resnet.py`): a library's
    when some site-packages folder holds it."""
    return any(("site-packages" in p or "dist-packages" in p) and os.path.isfile(os.path.join(p, rel))
               for p in sys.path)


def _is_detective(file: str) -> bool:
    """The sync detective's wrappers (gobrrr/syncs/watch.py) sit between a user's line and the call
    it makes while the doctor watches: transparent, the callee is the call below them."""
    return file.replace("\\", "/").endswith("gobrrr/syncs/watch.py")


def callee_name(frame_name: str) -> str:
    """`<built-in method item of Tensor ...>` -> `item`; `torch/cuda/__init__.py(1): synchronize` -> `synchronize`."""
    m = _BUILTIN_RE.match(frame_name)
    if m:
        return m.group(1).rsplit(".", 1)[-1]
    m = FRAME_RE.match(frame_name)
    return m.group(3) if m else frame_name


class SourceResolver:
    """Finds the line, inside a function known by (file, first line or a line of its body), that calls a
    given callee."""

    def __init__(self, roots: Iterable[str | os.PathLike] = (), user_paths: Iterable[str] = ()):
        self.roots = [Path(r) for r in roots] + [Path.cwd()] + [Path(p) for p in sys.path if p]
        # files counted as the user's even inside a library (`gobrrr doctor -m gobrrr train`: gobrrr/train/)
        self.user_paths = ["/" + p.replace("\\", "/").strip("/") + "/" for p in user_paths]
        self._cache: dict[str, tuple[list[str], ast.AST] | None] = {}
        self._lines: dict[tuple, list[int]] = {}  # (what, file, def line, func[, callee]) -> lines: asked per gap

    def _load(self, file: str):
        if file not in self._cache:
            found = None
            candidates = [Path(file)] if os.path.isabs(file) else [r / file for r in self.roots]
            for path in candidates:
                try:
                    text = path.read_text()
                    found = (text.splitlines(), ast.parse(text))
                    break
                except (OSError, SyntaxError, ValueError):
                    continue
            self._cache[file] = found
        return self._cache[file]

    def is_library(self, file: str) -> bool:
        """`is_library_file`, except for files under one of `user_paths` (those are the user's)."""
        if self.user_paths:
            f = "/" + file.replace("\\", "/").lstrip("/")
            if any(p in f for p in self.user_paths):
                return False
        return is_library_file(file)

    def code(self, file: str, line: int) -> str:
        src = self._load(file)
        return src[0][line - 1].strip() if src and 0 < line <= len(src[0]) else ""

    def call_lines(self, file: str, def_line: int, func: str, callee: str) -> list[int]:
        """Lines in the body of `func` (defined at `def_line`; `<module>` for module level) calling `callee`."""
        key = ("call", file, def_line, func, callee)
        if key not in self._lines:
            self._lines[key] = self._call_lines(file, def_line, func, callee)
        return self._lines[key]

    def _call_lines(self, file: str, def_line: int, func: str, callee: str) -> list[int]:
        src = self._load(file)
        if src is None or not callee:
            return []
        scope = src[1] if func == "<module>" else _find_scope(src[1], def_line, func)
        if scope is None:
            return []
        lines = set()
        for node in _walk_scope(scope):
            if callee == "__next__" and isinstance(node, (ast.For, ast.AsyncFor)):
                lines.add(node.lineno)  # `for batch in loader:` calls the iterator's __next__
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name == callee or (callee == "__next__" and name == "next"):
                    lines.add(node.lineno)
        return sorted(lines)

    def module_call_lines(self, file: str, def_line: int, func: str) -> list[int]:
        """Lines in `func` that call an object, as a module is called: `model(x)`, `self.conv1(x)`,
        `self.blocks[i](x)`; not a built-in, nor a function, class or import of the file."""
        key = ("module", file, def_line, func)
        if key not in self._lines:
            self._lines[key] = self._module_call_lines(file, def_line, func)
        return self._lines[key]

    def _module_call_lines(self, file: str, def_line: int, func: str) -> list[int]:
        src = self._load(file)
        if src is None:
            return []
        tree = src[1]
        scope = tree if func == "<module>" else _find_scope(tree, def_line, func)
        if scope is None:
            return []
        named = set(dir(builtins))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                named.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                named.update((a.asname or a.name).split(".")[0] for a in node.names)
        lines = set()
        for node in _walk_scope(scope):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id not in named:
                lines.add(node.lineno)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" \
                    and f.attr not in named:
                lines.add(node.lineno)
            elif isinstance(f, ast.Subscript):
                lines.add(node.lineno)
        return sorted(lines)

    def loader_name(self, file: str, line: int) -> str:
        """`for i, (x, y) in enumerate(train_loader):` -> "train_loader" (what the loop iterates)."""
        src = self._load(file)
        if src is None:
            return ""
        for node in ast.walk(src[1]):
            if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno == line:
                it = node.iter
                while isinstance(it, ast.Call) and it.args and isinstance(it.func, ast.Name) \
                        and it.func.id in ("enumerate", "zip", "iter", "tqdm"):
                    it = it.args[0]
                return ast.unparse(it)
        return ""


def _find_scope(tree: ast.AST, def_line: int, func: str):
    """The function `func` that starts at `def_line` or, failing that, the innermost one named `func`
    whose body holds `def_line`: a frame that was already running when the profiler started is named
    by the line it stood at (e.g. the `opt.step()` whose hook started the recording), not its `def`."""
    around = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.name != func:
                continue
            if def_line in (node.lineno, first):
                return node
            if node.lineno <= def_line <= (node.end_lineno or node.lineno) and (
                    around is None or node.lineno > around.lineno):
                around = node
        elif isinstance(node, ast.Lambda) and func == "<lambda>" and node.lineno == def_line:
            return node
    return around


def _walk_scope(scope: ast.AST):
    """ast.walk over one function body, not descending into nested functions or classes."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def stacks_at(frames: list[Frame], times: list[float]) -> list[list[Frame]]:
    """For each time (any order), the Python frames open at that time, outermost first.

    One sweep over frames sorted by start: frames of one thread nest, so a stack suffices.
    """
    order = sorted(range(len(times)), key=lambda i: times[i])
    out: list[list[Frame]] = [[] for _ in times]
    stack: list[Frame] = []
    j = 0
    for i in order:
        t = times[i]
        while j < len(frames) and frames[j].ts <= t:
            f = frames[j]
            while stack and stack[-1].end <= f.ts:
                stack.pop()
            stack.append(f)
            j += 1
        while stack and stack[-1].end < t:
            stack.pop()
        out[i] = [f for f in stack if f.ts <= t <= f.end]
    return out


def attribute(stack: list[Frame], resolver: SourceResolver, fallback: str = "") -> Site:
    """The user's source line in a Python stack (outermost first): innermost user frame + its callee."""
    for k in range(len(stack) - 1, -1, -1):
        f = stack[k]
        if resolver.is_library(f.file):
            continue
        below = [g for g in stack[k + 1:] if not _is_detective(g.file)]
        callee = callee_name(below[0].raw) if below else ""
        lines = resolver.call_lines(f.file, f.line, f.func, callee)
        line = lines[0] if lines else f.line
        return Site(f.file, line, resolver.code(f.file, line), f.func, callee)
    return Site(callee=fallback)
