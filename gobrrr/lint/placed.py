"""Which files run on the GPU though they never name a device: those whose classes another file moves there, and
scripts that use what a GPU file they import hands them; and which do not (a script that is its own program).

A project's decoder (attention-is-all-you-need's `Translator`) is a module whose file never names a device: the
script that uses it does, `translator = Translator(model, ...).to(device)`. Its forward is a per-step hook anyway,
but its other methods (`translate_sentence`, a beam search with a `.item()` per step) would be taken for CPU code.
A class constructed and moved in one expression (`Cls(...).to(device)`, `.cuda()`), or assigned and then moved
(`net = Cls(...)`, later `net.to(device)` / `net.cuda()` in the same file), is placed on the device, and so are its
project base classes (the index's `ancestors`).

A def of such a file that a GPU file calls handing it a device tensor or one of the project's modules
(`evaluate(model, dataset, args)` in SASRec's utils.py) runs on the device too (`hands_the_device`); and a project
that makes CUDA the default tensor type (`torch.set_default_tensor_type('torch.cuda.FloatTensor')` where it runs)
builds its `torch.zeros(n)` there (`runs_default_cuda`).
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.loops import name_of
from gobrrr.lint.names import TENSORISH

_DEFAULT_CUDA = re.compile(r"set_default_tensor_type\(\s*['\"]?torch\.cuda\.")
_MOVES = {"to", "cuda"}


def moved_classes(project, sources) -> set[int]:
    """ids of the project classes (and their project bases) that one of `sources` builds and moves to a device."""
    out: set[int] = set()
    for s in sources:
        built: dict[str, list] = {}
        for n in s.nodes:
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and (hit := _class(project, s, n.value)):
                for t in n.targets:
                    if isinstance(t, (ast.Name, ast.Attribute)):
                        built.setdefault(ast.unparse(t), []).append(hit)
        for n in s.nodes:
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MOVES
                    and _to_device(n)):
                continue
            recv = n.func.value
            hits = [h] if isinstance(recv, ast.Call) and (h := _class(project, s, recv)) else \
                built.get(ast.unparse(recv), []) if isinstance(recv, (ast.Name, ast.Attribute)) else []
            for _, cls in hits:
                out |= project.ancestors(id(cls))   # the class and its project bases
    return out


def _class(project, src, call: ast.Call):
    return project.class_of(src, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None


def _to_device(call: ast.Call) -> bool:
    """`.cuda()`, `.to(device)`, `.to("cuda:0")`; not `.to("cpu")` nor a cast (`.to(torch.float16)`)."""
    if call.func.attr == "cuda":
        return True
    target = next((k.value for k in call.keywords if k.arg == "device"), call.args[0] if call.args else None)
    if target is None:
        return False
    if isinstance(target, ast.Constant):
        return isinstance(target.value, str) and not target.value.startswith(("cpu", "meta")) \
            or isinstance(target.value, int) and not isinstance(target.value, bool)
    text = ast.unparse(target)
    return not (text.startswith(("torch.", "th.")) and text.count(".") == 1) and "dtype" not in text \
        and "cpu" not in text.lower()


def own_program(s) -> bool:
    """The file runs as its own program (`if __name__ == "__main__":`): a script in a folder of scripts (sweetice's
    DQN beside its DDPG) that names no device trains on the CPU, whatever its neighbours do. A trainer module handed
    its model by a script (decision-transformer's) has no such guard."""
    return "__main__" in s.text and any(
        isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Name)
        and n.test.left.id == "__name__" for n in s.tree.body)


def imported_files(project, src) -> set[int]:
    """ids of the project files `src` imports (`import TD3`, `from lib import model`, `from lib.model import Net`)
    that pick CUDA themselves (`torch.device("cuda" if ... else "cpu")`, `.cuda()`): a script that names no device
    runs on the GPU through what these give it. Not through a method of another file that a call's name happens
    to match (a CartPole script's `optimizer.step()` is not a KFAC optimizer's), nor through helpers whose device is
    a parameter left at "cpu", nor through a model class that only another file moves. One file further counts:
    an agent module that reads `self.actor.device` from the networks file it imports, which picks CUDA
    (Actor-Critic-Methods-Paper-To-Code's DDPG, TD3 and SAC scripts)."""
    return {id(found) for found in _imports(project, src)
            if "cuda" in found.text or any("cuda" in deeper.text for deeper in _imports(project, found))}


def _imports(project, src, stars: bool = False):
    """The project files `src` imports (a module and, for `from m import x`, `m.x` too); with `stars`, also those
    of its `from m import *`."""
    names = [d for module, name in src.imports.values() for d in ((module, f"{module}.{name}") if name else (module,))]
    for dotted in names + (list(src.stars) if stars else []):
        found = project.module(dotted, src)
        if found is not None:
            yield found


def gpu_reach(project, sources, gpu: dict) -> set[int]:
    """ids of the files that a file naming a device imports, directly or through others (decision-transformer's
    script imports its SequenceTrainer's module, which imports the Trainer's): a trainer that names no device
    runs on the GPU when such a file reaches it, not because the project uses the GPU elsewhere (a folder of
    DDPG and TRPO scripts beside GPU ones, whose own files never name a device, trains on the CPU)."""
    todo = [s for s in sources if gpu[id(s)]]
    seen = {id(s) for s in todo}
    while todo:
        for found in _imports(project, todo.pop(), stars=True):   # `from .agent import *` in a package's __init__ too
            if id(found) not in seen:
                seen.add(id(found))
                todo.append(found)
    return seen


__all__ = ["gpu_reach", "imported_files", "moved_classes", "own_program"]


def hands_the_device(project, kinds: dict, types: dict) -> bool:
    """A call (from a file that uses the GPU) that hands a device tensor, an instance of one of the project's
    torch modules, or one of a class that moves its own work to a device (caser's Recommender hands itself,
    `evaluate_ranking(self, test)`, whose `predict` copies each user up with `.to(self._device)`): the def it calls
    runs on the device, whether or not its own file names one."""
    return any(v in TENSORISH for k, v in kinds.items() if "#" not in k) or any(
        project.is_module_class(src, cls) or _moves_its_work(cls) for v in types.values() for src, cls in v
        if isinstance(cls, ast.ClassDef))


def _moves_its_work(cls: ast.ClassDef) -> bool:
    """A class whose methods move something to a device (`x.to(self._device)`, `.cuda()`)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MOVES and _to_device(n)
               for n in ast.walk(cls))


def runs_default_cuda(sources: list) -> bool:
    """Whether the project makes CUDA the default tensor type (NeuS's exp_runner): then `torch.zeros(n)` is on the
    device. Files of test folders do not count."""
    return any(_DEFAULT_CUDA.search(s.text) and "test" not in s.path.parent.name and _runs_default_cuda(s, sources)
               for s in sources)


def _runs_default_cuda(s, sources: list) -> bool:
    """`torch.set_default_tensor_type(torch.cuda.FloatTensor)` at module level, or in a def the project calls:
    not one in a `def set_device(device)` nothing calls (trajectory-transformer; `torch.cuda.set_device(i)` is
    not a call of it), where tensors stay on the CPU."""
    for n in s.nodes:
        if not (isinstance(n, ast.Call) and _DEFAULT_CUDA.search(ast.unparse(n))):
            continue
        around = [d for d in s.nodes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and d.lineno <= n.lineno <= (d.end_lineno or d.lineno)]
        up = max(around, key=lambda d: d.lineno) if around else None   # the innermost def holding the call
        if up is None or any(isinstance(c, ast.Call) and name_of(c.func) == up.name
                             and not ast.unparse(c.func).startswith(("torch.", "cuda.")) for o in sources for c in o.nodes):
            return True
    return False
