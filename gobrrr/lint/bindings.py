"""What a name was bound to, for the call graph (graph.Project.resolve): the calls assigned to it in a
def or the defs around it (`step_fn = get_step_fn(sde)`, `update_fn = functools.partial(g, sde=sde)`), and
the nested defs a factory returns by name."""
from __future__ import annotations

import ast
import re
from functools import lru_cache

from gobrrr.lint.loops import LOADER_NAME, is_model_name, name_of
from gobrrr.lint.names import TENSORISH
from gobrrr.lint.source import DEFS, Source, own_statements


def assigned_calls(src: Source, name: str, scope: ast.AST | None) -> list[ast.Call]:
    """The calls assigned to `name` in this def or the nearest def around it that assigns one (each
    branch's): `update_fn = functools.partial(shared_update_fn, sde=sde)`, `step_fn = get_step_fn(sde)`."""
    s = scope
    while True:
        found = [st.value for st in src.assigns(s).get(name, ()) if isinstance(st.value, ast.Call)
                 and isinstance(st.value.func, (ast.Name, ast.Attribute))]
        if found or s is None:
            return found
        s = src.parent.get(id(s))


def assigned_methods(src: Source, name: str, scope: ast.AST | None) -> list[ast.Attribute]:
    """The methods of self assigned to `name` in this def (each branch's): `sample_fn = self.sample_ddim if ddim
    else self.sample`, or one per branch of an if."""
    if scope is None:
        return []
    return [v for st in src.assigns(scope).get(name, ()) for v in _branches(st.value)
            if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self"]


def _branches(value: ast.AST) -> list[ast.AST]:
    """What an assignment may bind: both arms of `a if c else b`, else the value itself."""
    return [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]


def assigned_functions(src: Source, name: str, scope: ast.AST | None, cache: dict) -> list[ast.expr]:
    """The plain names `name` is bound to in this def, the nearest enclosing def that binds it, or the module, one
    per branch: Open-Sora's `prepare = prepare_causal if causal else prepare_uncausal` (an if, or an if expression),
    called in a def nested in the one that chose; SIREN's `loss_fn = loss_functions.wave_pml` at a script's top.
    `cache` is the file's (project.per_file): the names it binds anywhere, found once (each scope's bindings are
    the file's own table, Source.assigns)."""
    if "bound_names" not in cache:
        cache["bound_names"] = set(re.findall(r"(\w+) =[^=]", src.text))
    if name not in cache["bound_names"]:
        return []
    while True:
        found = [v for st in src.assigns(scope).get(name, ()) for v in _branches(st.value) if _function_name(v, name)]
        if found or scope is None:
            return found[:4]
        scope = src.parent.get(id(scope))


def _function_name(v: ast.AST, target: str) -> bool:
    """A name, not the target itself, or an attribute of a name (`loss_fn = loss_functions.wave_pml`, SIREN's
    scripts; `update = normalizer.update`, FastTD3's bound method), not of self."""
    return isinstance(v, ast.Name) and v.id != target or isinstance(v, ast.Attribute) \
        and isinstance(v.value, ast.Name) and v.value.id != "self"


def picked_tables(src: Source, name: str, scope: ast.AST | None) -> list[ast.AST]:
    """The tables of callables `name` was picked from in this def (or at module level): `sample_fn = {"heun":
    sample_heun, "dpm": sample_dpm}[sampler]` gives the dict literal, `fn = SAMPLERS[kind]` the name SAMPLERS."""
    return [st.value.value for st in src.assigns(scope if getattr(scope, "body", None) else None).get(name, ())
            if isinstance(st.value, ast.Subscript)]


def module_attrs(src: Source, name: str, scope: ast.AST | None, modules: set[str]) -> list[str]:
    """The attributes of those modules assigned to `name` in this def or at module level: `criterion =
    MODEL.get_loss` gives ["get_loss"]."""
    if not modules:
        return []
    scopes = ([scope] if getattr(scope, "body", None) else []) + [None]
    return [st.value.attr for s in scopes for st in src.assigns(s).get(name, ()) if isinstance(st.value, ast.Attribute)
            and isinstance(st.value.value, ast.Name) and st.value.value.id in modules]


def returned_defs(src: Source, fn: ast.AST) -> list[tuple[Source, ast.AST]]:
    """The defs nested in a factory that it returns by name (`def get_step_fn(...): def step_fn(...): ...;
    return step_fn`)."""
    nested = {d.name: d for d in getattr(fn, "body", []) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return [(src, nested[r.value.id]) for r in own_statements(getattr(fn, "body", []))
            if isinstance(r, ast.Return) and isinstance(r.value, ast.Name) and r.value.id in nested]


def converted_in_place(loop: ast.AST) -> str | None:
    """The dict a loop turns into host tensors key by key, `for key in batch.keys(): batch[key] =
    torch.tensor(batch[key], dtype=...)` (a replay sample of numpy arrays, MARL-Algorithms' learners): its name,
    whose items are then host tensors; None for any other loop (a `device=` puts them on the device)."""
    if not (isinstance(loop, ast.For) and isinstance(loop.target, ast.Name)):
        return None
    it = loop.iter.func.value if isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute) \
        and loop.iter.func.attr == "keys" and not loop.iter.args else loop.iter
    if not isinstance(it, ast.Name):
        return None
    for n in ast.walk(loop):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript) \
                and ast.unparse(n.targets[0]) == f"{it.id}[{loop.target.id}]" and isinstance(n.value, ast.Call) \
                and ast.unparse(n.value.func) in _HOST_MAKERS and n.value.args \
                and ast.unparse(n.value.args[0]) == f"{it.id}[{loop.target.id}]" \
                and not any(k.arg == "device" for k in n.value.keywords):
            return it.id
    return None


_HOST_MAKERS = {"torch.tensor", "torch.as_tensor", "torch.from_numpy", "torch.Tensor", "torch.FloatTensor",
                "torch.LongTensor"}


__all__ = ["agreed", "assigned_calls", "assigned_functions", "converted_in_place", "main_path", "module_attrs", "own_statements",
           "returned_defs"]


def yields_on_device(fn: ast.AST) -> bool:
    """Every `yield` of `fn` hands out only what it moves to the GPU there (`yield (x.to(device="cuda",
    non_blocking=True), ..., meta.numpy())`, `yield batch.cuda()`): a loader of device batches, at least one moved."""
    yields = [n.value for n in ast.walk(fn) if isinstance(n, ast.Yield)]
    parts = [e for y in yields for e in (y.elts if isinstance(y, (ast.Tuple, ast.List)) else [y])]
    moved = [p for p in parts if _moved_to_gpu(p)]
    return bool(yields) and bool(moved) and all(p in moved or isinstance(p, ast.Call) and isinstance(p.func, ast.Attribute)
                                                and p.func.attr in ("numpy", "tolist", "item") for p in parts)


def _moved_to_gpu(e: ast.AST) -> bool:
    if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in ("to", "cuda")):
        return False
    if e.func.attr == "cuda":
        return True
    where = [*e.args[:1], *(k.value for k in e.keywords if k.arg == "device")]
    return any(isinstance(w, ast.Constant) and isinstance(w.value, str) and w.value.startswith("cuda") for w in where)


def assigned_pairs(fn: ast.AST):
    """(target, value) of each assignment below `fn`; a tuple target beside a tuple value of its length, item by
    item (`u_idx, i_idx = [], []`)."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Tuple) and isinstance(n.value, ast.Tuple) and len(t.elts) == len(n.value.elts):
                    yield from zip(t.elts, n.value.elts)
                else:
                    yield t, n.value


def yields_host_lists(fn: ast.AST) -> bool:
    """Every `yield` of `fn` hands out Python lists it builds (`u_idx, i_idx = [], []`, appended in a loop, then
    `yield u_idx, i_idx, j_idx`: SELFRec's batches of ids): a loader of host index lists."""
    return _built_lists(fn, [n.value for n in ast.walk(fn) if isinstance(n, ast.Yield) and n.value is not None])


def returns_host_lists(fn: ast.AST, randoms: frozenset = frozenset()) -> bool:
    """`fn` draws with the `random` module, names no torch, and every `return` hands back Python lists it builds or
    draws (`users = rd.sample(self.exist_users, bs)`, `pos_items = []` then `+=`: NGCF's batch of ids). `randoms`:
    the names the file imports the random module as."""
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    if not names & randoms or "torch" in names:
        return False   # a sampler draws with `random` and names no torch (an accuracy's list of device tensors)
    nested = {id(r) for d in ast.walk(fn) if d is not fn and isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
              for r in ast.walk(d)}   # (sample_pos_items_for_u's own names and returns)
    return _built_lists(fn, [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None
                             and id(n) not in nested], randoms, nested)


def _built_lists(fn: ast.AST, values: list, randoms: frozenset = frozenset(), skip: set | frozenset = frozenset()
                 ) -> bool:
    parts = [e for y in values for e in (y.elts if isinstance(y, (ast.Tuple, ast.List)) else [y])]
    made: dict[str, list] = {}
    for name, v in assigned_pairs(fn):
        if isinstance(name, ast.Name) and id(v) not in skip:
            made.setdefault(name.id, []).append(v)

    def built(v: ast.AST) -> bool:
        return isinstance(v, (ast.List, ast.ListComp)) or isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) \
            and isinstance(v.func.value, ast.Name) and v.func.value.id in randoms and v.func.attr in ("sample", "choices")
    return bool(parts) and all(built(p) or isinstance(p, ast.Name) and made.get(p.id)
                               and all(built(v) for v in made[p.id]) for p in parts)


def device_dataset(src: Source, data: ast.AST | None, scope: ast.AST | None, kind) -> bool:
    """`TensorDataset(torch.from_numpy(x).to(dev))`, or a name the def assigns one: a dataset of device tensors,
    whose loader's batches are slices already on the device (CTGAN's TVAE); `kind` gives an argument's kind."""
    made = [data] if isinstance(data, ast.Call) else assigned_calls(src, data.id, scope) \
        if isinstance(data, ast.Name) else []
    return len(made) == 1 and name_of(made[0].func) == "TensorDataset" and bool(made[0].args) \
        and all(kind(a) in TENSORISH and _moved(a) for a in made[0].args)


def _moved(e: ast.AST) -> bool:
    """A tensor the expression itself moves (`torch.from_numpy(x).to(dev).float()`), not one a CUDA default
    tensor type set somewhere in the project would put on the device (TabSurvey's `torch.tensor(X)`)."""
    while isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
        if e.func.attr in ("to", "cuda"):
            return True
        e = e.func.value
    return False


def kept_loader(node: ast.AST) -> bool:
    """`self.dataloaders['train']`, `loaders[phase]`: an item of a dict named for loaders (ResShift keeps an endless
    wrapper of each DataLoader there); `next()` of it draws a batch."""
    return isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)) \
        and bool(LOADER_NAME.search(name_of(node.value)))


def loaded_module(node: ast.AST) -> bool:
    """`pickle.load(f)['ema']`, `torch.load(path)['model']`: a module taken from what was loaded."""
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) \
        and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) and is_model_name(node.slice.value)


def through_partial(made: ast.Call, call: ast.Call) -> ast.Call:
    """`call` of a name bound to `made = functools.partial(f, a, k=v)`: `f(a, *call.args, k=v, **call.keywords)`."""
    return ast.Call(func=made.args[0], args=[*made.args[1:], *call.args], keywords=[*made.keywords, *call.keywords])


def param_default(fn: ast.AST | None, name: str) -> ast.expr | None:
    """The default of `fn`'s parameter `name` when it names a callable (`decode_func=decode`), else None."""
    if not isinstance(fn, DEFS):
        return None
    a = fn.args
    pairs = [*zip(reversed([*a.posonlyargs, *a.args]), reversed(a.defaults)), *zip(a.kwonlyargs, a.kw_defaults)]
    return next((d for p, d in pairs if p.arg == name and isinstance(d, (ast.Name, ast.Attribute))), None)


def param_names(fn: ast.AST) -> set[str]:
    """The names of `fn`'s parameters (positional and keyword)."""
    return {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}


@lru_cache(maxsize=4096)
def _tested(fn: ast.AST) -> frozenset:
    return frozenset(n.left.id for n in ast.walk(fn) if isinstance(n, ast.Compare) and len(n.ops) == 1
                     and isinstance(n.ops[0], (ast.Is, ast.IsNot)) and isinstance(n.left, ast.Name)
                     and isinstance(n.comparators[0], ast.Constant) and n.comparators[0].value is None)


def none_tested(fn: ast.AST) -> frozenset:
    """The parameters of `fn` it compares with None (`if max_len is None:`): the ones a call's value decides."""
    return _tested(fn) & param_names(fn)


def main_path(fn, return_at: dict) -> str | None:
    """The kind of a def's last statement, `return ...`, when every other return leaves from a guard at its top
    level (`if not targets: return [(torch.as_tensor([]).to(logits), ...)] * B`, then the matcher's host index
    tensors): the edge case returns something else, the main path says what callers get."""
    body = getattr(fn, "body", [])
    while body and isinstance(body[-1], (ast.With, ast.AsyncWith)):
        body = body[-1].body   # `with torch.no_grad(): ... return indices`
    last = body[-1] if body else None
    if not isinstance(last, ast.Return) or return_at.get(id(last)) in (None, "", "none"):
        return None
    guards = {id(r) for st in body if isinstance(st, ast.If) and not st.orelse and _empty_test(st.test)
              for inner in st.body for r in ast.walk(inner) if isinstance(r, ast.Return)}
    if all(i == id(last) or i in guards for i in return_at):
        return return_at[id(last)]
    return None


def _empty_test(test: ast.AST) -> bool:
    """`if tgt_ids.shape[0] == 0:`, `if not targets:`, `if boxes is None:`, `if len(x) == 0:`: a test for nothing
    to work on (an edge case), not `if torch.cuda.is_available():` (the path that matters on the GPU)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not isinstance(test.operand, ast.Call) or name_of(test.operand.func) == "len"
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is, ast.LtE)) \
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value in (0, None)


def agreed(kinds: set) -> str | None:
    """One item's kind over every return: the one they share; a mask where one return makes it a mask
    and another a placeholder tensor (`return ..., fg_mask.bool()` after an early `return ...,
    torch.zeros_like(x)` when there is nothing to match): what indexes with it on the main path."""
    if kinds == {"mask", "tensor"}:
        return "mask"
    return kinds.pop() if len(kinds) == 1 else None
