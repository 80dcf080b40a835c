"""How `gobrrr lint` walks loops, branches and error paths (a mixin of rules.Checker).

    loops        a loop's body runs in the loop's region: 'hot' for a step loop (hot.HotMap) or a
                 `while` on a device value, 'cold' for other loops; its target is bound from what
                 it iterates (a loader's batches, a model's parameters, a dict's items)
    branches     an `if` whose body is rare (hot.HotMap.off_ifs) is walked 'off', and so is a way
                 the call never takes (static_truth: `if mode == "cpu":` called with the default
                 "gpu", `if mask is not None:` with no mask passed; after `if copy: return ...`
                 taken, the rest of the def); after an `if`, a name keeps the kind both ways agree
                 on, the device kind where one way moves it to the device (`if use_cuda: buf =
                 buf.cuda()`: the GPU is assumed), the other way's where one binds None, else none
                 (`if cpu_env: a = a.cpu().numpy()` leaves an unknown `a` unknown); a way that
                 leaves (return, raise, continue) does not flow past the `if`
    error paths  `except` handlers, a raise's exception and an assert's message are 'off'; after a
                 try, names keep the kinds of its main path, not of a handler's fallback

It relies on the checker's `kind()`, `bind()`, `scopes`, `flag()`, `hotmap`, `region`.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.bindings import assigned_calls, converted_in_place, param_names
from gobrrr.lint.loops import name_of
from gobrrr.lint.names import BATCHES, GIVEN, HOSTISH, ITEM_KIND, TENSORISH, self_attr
from gobrrr.lint.typetests import container_test, dist_test, number_test, numbers_after, tensor_test, type_checked

_MISSING = object()
_CONTAINER_NAME = re.compile(r"(^|_)(dict|info|infos|metrics|stats|logs|kwargs)$")   # a truth test asks if it is empty
_PASS_THROUGH = {"list", "tuple", "tqdm", "reversed", "trange"}   # iterating them gives their argument's items
_LEAVES = (ast.Return, ast.Raise, ast.Continue)   # a break's bindings reach the code after the loop
_HOST_VALUES = {"numpy": "numpy", "hlist": "host", "nums": "num"}   # the values of a dict of arrays, of host
# tensors, of numbers (a **kwargs every call fills with numbers: scopes._kwargs_kind)


def _leaves(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], _LEAVES)


class FlowRules:
    """Loops, branches and error paths."""

    def bind_loop_target(self, target: ast.AST, it: ast.AST, stepping: bool = False) -> None:
        if isinstance(it, ast.IfExp):   # `tqdm(loader) if is_main else loader`: the same items either way
            return self.bind_loop_target(target, it.body, stepping)
        while isinstance(it, ast.Call) and len(it.args) == 1 \
                and isinstance(it.func, (ast.Name, ast.Attribute)) and name_of(it.func) in _PASS_THROUGH:
            it = it.args[0]   # tqdm.tqdm(list(enumerate(zip(a, b)))): the items of the innermost
        fname = it.func.id if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) else None
        if fname == "range":
            return self.bind(target, "num")
        if fname == "enumerate" and it.args and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            self.bind(target.elts[0], "num")
            return self.bind_loop_target(target.elts[1], it.args[0], stepping)
        if fname == "zip" and isinstance(target, ast.Tuple) and len(target.elts) == len(it.args):
            for t, a in zip(target.elts, it.args):
                self.bind_loop_target(t, a)
            return
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute):
            method, recv = it.func.attr, self.kind(it.func.value)
            if method in ("parameters", "buffers"):
                return self.bind(target, "tensor")
            if method in ("named_parameters", "named_buffers", "items") and isinstance(target, ast.Tuple) \
                    and len(target.elts) == 2:
                self.bind(target.elts[0], "str")
                value = recv if recv in BATCHES else "tensor" if method != "items" or recv in TENSORISH | {"tlist"} \
                    else _HOST_VALUES.get(recv)
                return self.bind(target.elts[1], value)
            if method == "values" and recv in BATCHES | TENSORISH:
                return self.bind(target, recv)
            if method == "values" and recv in _HOST_VALUES:   # {k: np.isnan(v) for ...}.values(): arrays
                return self.bind(target, _HOST_VALUES[recv])
        k = self.iter_kind(it, unpacked=isinstance(target, ast.Tuple) or stepping and self_attr(it))
        if k and k.startswith("enum_") and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            self.bind(target.elts[0], "num")   # for i, batch in pbar (pbar = tqdm(enumerate(loader)))
            return self.bind(target.elts[1], ITEM_KIND.get(k[5:]))
        self.bind(target, {"loader_pageable": "batch_host", "loader_pinned": "batch_pinned", "loader": "batch",
                           "loader_device": "tensor", "tlist": "tensor", "hlist": "host", "loader_index": "host"}.get(
            k, k if k in ("numpy", "host", "pinned", "tensor", "mask", "hlist", *BATCHES) else None))
        fn = self.defs[-1] if self.defs else None
        if k == "tensor" and isinstance(target, ast.Name) and isinstance(it, ast.Name) \
                and not (hasattr(fn, "args") and it.id in param_names(fn)):
            self.scopes[-1][target.id + "#delem"] = "delem"   # `for h0 in h0s:` an element of a device tensor made here

    def visit_For(self, node) -> None:
        self.visit(node.iter)  # evaluated once: set-up code
        if isinstance(node.iter, ast.Call) and self.kind(node.iter) == "loader_pageable":
            self.loaders.append({"name": None, "node": node.iter, "loop": node})
        if id(node) in self.hotmap.step_loops and self.region != "off":
            self.follow_generator(node)
        # an update loop over `self.dataset` (DiffWave's learner, handed the loader) steps through batches; not
        # one over a parameter, which a caller may hand a device iterator (torchtext's BucketIterator(device=cuda))
        self.bind_loop_target(node.target, node.iter, id(node) in self.hotmap.update_loops)
        self.note_loop_elements(node.target, node.iter)
        self.note_dist_items(node.target, node.iter)
        keyed = _keyed(node)
        before = self.lookup(keyed[1]) if keyed else None
        self.key_loops.append(keyed)
        try:
            self.visit_loop_body(node)
        finally:
            self.key_loops.pop()
        if keyed and "moved" in keyed and before != "tlist":   # for k in batch: batch[k] = batch[k].to(dev): device
            self.bind(ast.Name(id=keyed[1], ctx=ast.Store()), "tlist")   # tensors, but for the keys the loop
            if keyed[2]:   # leaves alone (`if k != 'meta':`): what the batch held
                self.scopes[-1][keyed[1] + "#kept"] = (keyed[2], before if before in HOSTISH else "batch")

    visit_AsyncFor = visit_For

    def follow_generator(self, loop: ast.For) -> None:
        """`for sample in rollouts.feed_forward_generator(adv, n):` (or a name assigned that call in this def):
        a project generator's body runs a little per step of the loop that iterates it, so it is walked as hot;
        so is the `__next__` of a project iterator object (`for state in val_mem:`)."""
        it = loop.iter
        if isinstance(it, ast.Name) and self.defs:
            made = [c for c in assigned_calls(self.src, it.id, self.defs[-1]) if c.lineno < loop.lineno]
            it = made[-1] if made else it
        scope = self.defs[-1] if self.defs else None
        if isinstance(it, (ast.Name, ast.Attribute)):   # `for state in val_mem:` a project iterator's __next__
            nxt = ast.copy_location(ast.Call(func=ast.Attribute(value=it, attr="__next__", ctx=ast.Load()),
                                             args=[], keywords=[]), loop.iter)
            hits = self.project.resolve(self.src, nxt, scope, self.types, fallback=False)
            only = self.project.methods.get("__next__", [])
            if not hits and len(only) == 1 and self.kind(it) is None:   # the project's one iterator class
                target_src, fn = only[0]
                self.pending.append((target_src, fn, {}, {}, (*self.chain, f"{self.src.name}:{loop.lineno}"),
                                     list(self.functions)))
            elif hits:
                saved, self.region = self.region, "hot"
                self.follow(nxt)
                self.region = saved
            return
        if not isinstance(it, ast.Call) or not isinstance(it.func, (ast.Name, ast.Attribute)):
            return
        if any(any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn))
               for _, fn in self.project.resolve(self.src, it, scope, self.types)):
            saved, self.region = self.region, "hot"
            self.follow(it)
            self.region = saved

    def visit_loop_body(self, node, *every_iteration: ast.AST) -> None:
        """Visit what runs every iteration (`every_iteration`, then the body) in the loop's region;
        `else:` runs once, after the loop."""
        saved = self.region
        if saved == "off" and id(node) in self.hotmap.step_loops and self.rare_depth and not self.summary_depth:
            saved, self.region = "cold", "cold"   # `if step % val_every == 0: for _ in range(val_steps): ...`:
            # an evaluation loop run every N steps is a step loop of its own, each of its batches a step
        if saved != "off" and id(node) in self.hotmap.step_loops and (saved != "hot" or not self.silent):
            self._carried(node, every_iteration, saved == "hot")   # (inside another: a decode loop per batch)
        if saved != "hot" and saved != "off":
            self.region = "hot" if id(node) in self.hotmap.step_loops else "cold"
        self.loop_stack.append(id(node))
        for part in (*every_iteration, *node.body):
            self.visit(part)
        if self.region == "hot" and id(node) in self.hotmap.step_loops:
            self.env_loop(node)
        self.loop_stack.pop()
        if (converted := converted_in_place(node)) is not None:   # `for k in batch: batch[k] = torch.tensor(batch[k])`
            self.scopes[-1][converted] = "batch_host"
        self.region = saved
        for stmt in node.orelse:
            self.visit(stmt)

    def _carried(self, node, every_iteration, nested: bool = False) -> None:
        """One silent pass over a step loop's body first: what an iteration leaves is what the next starts from (`xs[-1].cuda()`
        after `xs.append(x.cpu())` is a copy); `nested` (in a hot loop): only names unknown or numbers before (`h = None`)."""
        scope = self.scopes[-1]
        before = dict(scope)
        saved, self.silent = self.silent, True   # walked as hot code, reporting and following nothing
        saved_region, self.region = self.region, "hot"
        self.loop_stack.append(id(node))
        for part in (*every_iteration, *node.body):
            self.visit(part)
        self.loop_stack.pop()
        self.silent, self.region = saved, saved_region
        after = dict(scope)
        scope.clear()
        scope.update(before)
        fresh = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)} if hasattr(node, "target") else set()
        fresh |= {t.id for n in ast.walk(node) if isinstance(n, ast.Assign) and _unpacks(n.value, fresh)
                  for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}   # x, y, idx = data: each
        # iteration's item too, in whichever branch unpacks it (RepDistiller's `if opt.distill in ['crd']:`)
        for name, k in after.items():
            b = before.get(name, _MISSING)
            if name in fresh or nested and b not in (_MISSING, None, "num"):
                continue   # the loop target is bound anew each iteration; a nested loop keeps what it is handed
            if b is _MISSING or b is None or b == k:
                scope[name] = k
            elif (b in TENSORISH) != (k in TENSORISH):
                scope[name] = b if b in TENSORISH else k
            else:
                scope[name] = ("mask" if "mask" in (b, k) else "tensor") if b in TENSORISH else None

    def visit_While(self, node: ast.While) -> None:
        saved = self.region
        if saved != "hot" and saved != "off":
            # while delta > tol: a loop on a device value syncs every iteration, however often it runs
            tensor_test = self.kind(node.test) in TENSORISH
            self.region = "hot" if id(node) in self.hotmap.step_loops or tensor_test else "cold"
        if self.kind(node.test) in TENSORISH:
            self.flag(node.test, "GB007", where=" in a while loop")
        self.region = saved
        self.visit_loop_body(node, node.test)  # the test is evaluated every iteration

    def visit_If(self, node: ast.If) -> None:
        test = self.evaluated(node.test)
        if test is not None:
            self.check_condition(test)
            self.visit(test)
        scope = self.scopes[-1]
        before = dict(scope)
        truth = self.static_truth(node.test)
        handed = self.handed_test(node.test) is not None   # (read before the body binds the name)
        name, positive = tensor_test(node.test)   # `if isinstance(boxes, torch.Tensor): ... else:` numpy there
        if name and not positive and scope.get(name) in TENSORISH:
            scope[name] = None
        number = number_test(node.test)
        if number and scope.get(number) in TENSORISH:   # `if isinstance(sigma, float): torch.full(..., sigma)`
            scope[number] = "num"
        listed = container_test(node.test)
        if listed and scope.get(listed) in TENSORISH:   # `if isinstance(images, list): ... if not images:`
            scope[listed] = "tlist"
        dist = dist_test(node.test)   # `if isinstance(out, Distribution): out.log_prob(a)`: a model's output that
        if dist and scope.get(dist) in TENSORISH and not self.project_flags.get("no_validation"):   # is a distribution,
            scope[dist + "#dist"] = "dist"   # validated unless the project turns validation off (inside.py)
        if id(node) in self.hotmap.off_ifs and truth is not True or truth is False:   # `if action is None:`
            # with no action passed is no lazy initialisation: it runs on every such call
            rare = truth is None and id(node) in self.hotmap.rare_ifs
            self.rare_depth += rare
            self.dead_depth += truth is False
            self.visit_off(*node.body)
            self.dead_depth -= truth is False
            self.rare_depth -= rare
        else:
            for stmt in node.body:
                self.visit(stmt)
        body = dict(scope)
        if number and body.get(number) == "num" and before.get(number) in TENSORISH:
            body[number] = before[number]   # after the if, it holds what it held (or the body's tensor)
        if listed and body.get(listed) == "tlist" and before.get(listed) in TENSORISH:
            body[listed] = before[listed]
        scope.clear()
        scope.update(before)
        if name and positive and scope.get(name) in TENSORISH:
            scope[name] = None
        if id(node) in self.hotmap.off_elses or truth is True:
            self.dead_depth += truth is True
            self.visit_off(*node.orelse)   # `if not torch.jit.is_scripting(): ... else:` never runs eagerly
            self.dead_depth -= truth is True
        else:
            for stmt in node.orelse:
                self.visit(stmt)
        if handed:   # `if max_len is None: max_len = lengths.max()` with a max_len handed: only what runs counts
            body, orelse = (body, body) if truth else (dict(before) if not node.orelse else dict(scope),) * 2
            scope.clear()
            scope.update(orelse)
        self._merge(scope, before, body, _leaves(node.body),   # `if not cfg.DEBUG:`: skipping it is the rare way
                    _leaves(node.orelse) or id(node) in self.hotmap.main_ifs and not node.orelse)
        for name in type_checked(node.test) & set(body):   # `if type(b).__name__ != 'ndarray': b = b.cpu().numpy()`
            if not node.orelse and body[name] == "numpy":   # normalises b to numpy: numpy after the if, either way
                scope[name] = body[name]
            elif not node.orelse and before.get(name) == "num" and body[name] in {"host", *TENSORISH}:
                scope[name] = body[name]   # `if type(x) is not torch.Tensor: x = torch.tensor([x])` of a number
        if _leaves(node.body) and not node.orelse:
            scope.update((x, "num") for x in numbers_after(node.test) if scope.get(x) in TENSORISH)
        taken = node.body if truth is True else node.orelse if truth is False else []
        if taken and isinstance(taken[-1], (ast.Return, ast.Raise)) and not self.dead_depth:   # (not in a branch the
            self.left = True   # call never takes) `if copy: return th.tensor(...)` with copy=True: the rest never runs

    @staticmethod
    def _merge(scope: dict, before: dict, body: dict, body_leaves: bool, else_leaves: bool) -> None:
        """The kinds after an if: a way that leaves does not count; where both go on, a name keeps a
        kind both agree on (or the one way's, for a name the other never bound)."""
        orelse = dict(scope)
        for name in [n[:-6] for n in before if n.endswith("#empty")]:   # an empty placeholder one way filled
            filled_body, filled_else = name + "#empty" not in body, name + "#empty" not in orelse
            filled = body.get(name) if filled_body else orelse.get(name)
            if before[name + "#empty"] == "none" and filled is None:
                continue   # None, then something unknown (XMem's `pred = None` or `aggregate(mask)`): no evidence
            if filled_body != filled_else and not body_leaves and not else_leaves:
                body[name] = orelse[name] = filled
                body.pop(name + "#empty", None)
                orelse.pop(name + "#empty", None)
                scope.pop(name + "#empty", None)
        for way, other in ((body, orelse), (orelse, body)):   # `if is_val: loader = None` else a DataLoader: the
            for name in [n[:-6] for n in way if n.endswith("#empty") and way[n] == "none" and n not in before]:
                if way.get(name) in (None, "num") and other.get(name) not in (None, "num", _MISSING):   # loader, when
                    way[name] = other[name]   # there is one (mozilla-TTS's setup_loader)
        if body_leaves and not else_leaves:
            return   # scope already holds the else way
        if else_leaves and not body_leaves:
            scope.clear()
            scope.update(body)
            return
        for name in set(body) | set(orelse):
            a, b = body.get(name, _MISSING), orelse.get(name, _MISSING)
            if (a is _MISSING or b is _MISSING) and "#" in name and name in before:
                scope.pop(name, None)   # a mark one way's binding dropped (`if x is None: x = cfg.x`): gone after
            elif a is _MISSING or b is _MISSING or a == b:
                scope[name] = b if a is _MISSING else a
            elif (a in TENSORISH) != (b in TENSORISH):
                scope[name] = a if a in TENSORISH else b   # `if use_cuda: buf = buf.cuda()`: the GPU is assumed
            else:   # `if m.dtype != torch.bool: m = m.bool()`: a mask either way
                scope[name] = ("mask" if "mask" in (a, b) else "tensor") if a in TENSORISH else None

    def static_truth(self, test: ast.AST) -> bool | None:
        """True / False when the test only compares parameters with the constants this call gives
        them (calls._constants: `if mode == "cpu":` called with the default "gpu", `if mask is not
        None:` with no mask passed); None when it depends on anything else."""
        if isinstance(test, ast.BoolOp):
            parts = [self.static_truth(v) for v in test.values]
            stop = isinstance(test.op, ast.Or)   # `or` is decided by a True part, `and` by a False one
            return stop if stop in parts else (not stop if all(p is not None for p in parts) else None)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            t = self.static_truth(test.operand)
            return None if t is None else not t
        if isinstance(test, ast.Name):
            v = self.constant(test)
            return None if v is _MISSING else bool(v)
        name, positive = tensor_test(test)
        if name and self.lookup(name) in ("numpy", "num", "str"):
            return not positive   # `torch.from_numpy(m).to(x.device) if torch.is_tensor(x) else m` of an array
        if (given := self.handed_test(test)) is not None:
            return given
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            a, b = self.constant(test.left), self.constant(test.comparators[0])
            if a is _MISSING or b is _MISSING:
                return None
            op = test.ops[0]
            if isinstance(op, (ast.Eq, ast.Is)):
                return a == b
            if isinstance(op, (ast.NotEq, ast.IsNot)):
                return a != b
        return None

    def handed_test(self, test: ast.AST) -> bool | None:
        """`if max_len is None:` (`is not None`) of a parameter this call handed a number or a tensor
        (sequence_mask(lengths, max_len=x.size(-1))): decided; None for anything else, a default's guess included."""
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot)) \
                and isinstance(test.left, ast.Name) and isinstance(test.comparators[0], ast.Constant) \
                and test.comparators[0].value is None and self.lookup(test.left.id + "#val") == GIVEN:
            return isinstance(test.ops[0], ast.IsNot)
        return None

    def evaluated(self, test: ast.AST) -> ast.AST | None:
        """The part of a condition that runs: `mask is not None and x.any()` with no mask passed
        stops before `x.any()` (None when nothing of it runs that could sync)."""
        if not isinstance(test, ast.BoolOp):
            return test
        stop = isinstance(test.op, ast.Or)
        for i, v in enumerate(test.values):
            if self.static_truth(v) is stop:
                rest = test.values[:i]
                return None if not rest else rest[0] if len(rest) == 1 else ast.copy_location(ast.BoolOp(test.op, rest), test)
        return test

    def constant(self, node: ast.AST):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            v = self.lookup(node.id + "#val")
            if v is not None and v != GIVEN:   # (a value handed, not a constant: no literal)
                try:
                    return ast.literal_eval(v)
                except ValueError:
                    return _MISSING
        return _MISSING

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.check_condition(node.test)
        truth = self.static_truth(node.test)
        if truth is None:
            self.generic_visit(node)
            return
        self.visit(node.test)   # `[...] if save_hybrid else []` with save_hybrid = False: one way runs
        self.visit(node.body if truth else node.orelse)
        self.visit_off(node.orelse if truth else node.body)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.check_condition(node.test, " in an assert")
        self.visit(node.test)
        self.visit_off(node.msg)  # the message is built only on failure
        for name in _asserted_arrays(node.test):   # assert isinstance(betas, np.ndarray): past it, betas is one
            self.bind(name, "numpy")

    def visit_Raise(self, node: ast.Raise) -> None:
        self.visit_off(node.exc, node.cause)

    def visit_Try(self, node) -> None:
        for stmt in node.body:
            self.visit(stmt)
        scope = self.scopes[-1]
        body = dict(scope)
        self.visit_off(*node.handlers)
        scope.update(body)   # the main path's kinds: a handler's fallback (the CPU retry) is the rare way
        for stmt in [*node.orelse, *node.finalbody]:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def _comprehension(self, node) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # the first iterable is evaluated once
        saved = self.region
        self.region = saved if saved in ("hot", "off") else "cold"
        self.scopes.append({})
        for i, g in enumerate(gens):
            if i:
                self.visit(g.iter)
            self.bind_loop_target(g.target, g.iter)
            self.note_loop_elements(g.target, g.iter)
            self.note_dist_items(g.target, g.iter)
            for cond in g.ifs:
                self.visit(cond)
        for part in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]):
            self.visit(part)
        self.scopes.pop()
        self.region = saved

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _comprehension

    def check_condition(self, test: ast.AST, where: str = " inside a loop") -> None:
        parts, nodes = _parts(test), list(ast.walk(test))   # (the text of a part is made only when asked)
        guarded = {(ast.unparse(n.args[0]), n.args[1].value) for n in nodes if isinstance(n, ast.Call)
                   and isinstance(n.func, ast.Name) and n.func.id == "hasattr" and len(n.args) == 2
                   and isinstance(n.args[1], ast.Constant)}
        parts = [p for p in parts if not (guarded and isinstance(p, ast.Attribute) and (ast.unparse(p.value), p.attr) in guarded)]
        keyed = {ast.unparse(n.comparators[0]) for n in nodes if isinstance(n, ast.Compare)
                 and len(n.ops) == 1 and isinstance(n.ops[0], (ast.In, ast.NotIn))
                 and isinstance(n.left, ast.Constant) and isinstance(n.left.value, str)}
        parts = [p for p in parts if not (keyed and ast.unparse(p) in keyed)   # `d and 'key' in d`: d is a dict
                 and not (isinstance(p, ast.Name) and _CONTAINER_NAME.search(p.id))]   # `if output_dict:` (lerobot)
        if all(self.kind(p) not in TENSORISH or (isinstance(p, ast.Name) and (
                p.id in self.guesses or self.lookup(p.id + "#opt"))) for p in parts):
            return   # `if losses:` on an unknown call's result, `if not mask:` on an optional parameter
        if self.looping() and self.kind(test) in TENSORISH:
            self.flag(test, "GB007", where=where)


def _parts(test: ast.AST) -> list[ast.AST]:
    """The operands of a condition through and/or/not: `hasattr(p, 'tp') and p.tp or q` -> the call, p.tp, q.
    A part guarded by `hasattr(x, 'a')` is a Python attribute someone set, not a tensor op."""
    if isinstance(test, ast.BoolOp):
        return [q for v in test.values for q in _parts(v)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _parts(test.operand)
    return [test]


def _keyed(loop: ast.For) -> list | None:
    """(key, container, the keys it leaves alone) of a loop over a container's own keys or positions: `for k in batch`, `for k in
    batch.keys()`, `for k, v in batch.items()`, `for i in range(len(xs))`; None for any other loop."""
    it, target = loop.iter, loop.target
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items" and not it.args \
            and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        it, target = it.func.value, target.elts[0]
    elif isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "keys" and not it.args:
        it = it.func.value
    elif isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and len(it.args) == 1 \
            and isinstance(it.args[0], ast.Call) and isinstance(it.args[0].func, ast.Name) \
            and it.args[0].func.id == "len" and len(it.args[0].args) == 1:
        it = it.args[0].args[0]
    if isinstance(it, ast.Name) and isinstance(target, ast.Name):
        return [target.id, it.id, _kept_keys(loop, target.id)]   # "moved" is appended when the body moves them
    return None


def _kept_keys(loop: ast.For, key: str) -> tuple[str, ...]:
    """The keys a loop over a container's keys leaves alone: `if k != 'meta':`, `if k in ("meta",): continue`."""
    kept: list[str] = []
    for n in ast.walk(loop):
        if not (isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.ops) == 1
                and isinstance(n.test.left, ast.Name) and n.test.left.id == key):
            continue
        op, right = n.test.ops[0], n.test.comparators[0]
        names = [e.value for e in (right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right])
                 if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        skips = isinstance(n.body[-1], ast.Continue)
        if isinstance(op, (ast.NotEq, ast.NotIn)) or isinstance(op, (ast.Eq, ast.In)) and skips:
            kept += names
    return tuple(kept)


__all__ = ["FlowRules"]


def _unpacks(value: ast.AST, names: set[str]) -> bool:
    """`data`, `data[0]` or `data["x"]` of a loop's item: what it binds is that iteration's, not carried over."""
    while isinstance(value, ast.Subscript):
        value = value.value
    return isinstance(value, ast.Name) and value.id in names


def _asserted_arrays(test: ast.AST) -> list[ast.Name]:
    """The names an assert says are numpy arrays: `isinstance(x, np.ndarray)`, alone or in an `and`."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    return [p.args[0] for p in parts if isinstance(p, ast.Call) and isinstance(p.func, ast.Name)
            and p.func.id == "isinstance" and len(p.args) == 2 and isinstance(p.args[0], ast.Name)
            and ast.unparse(p.args[1]) in ("np.ndarray", "numpy.ndarray")]
