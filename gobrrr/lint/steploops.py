"""The step loops of a file, bottom-up: loops.Facts says what each call of a loop's own level does (update,
forward, data, env), and a loop that does one of them is a step loop unless it only holds one (an epoch loop).
Also the project-wide closure of the defs that hold a step loop (`looping_closure`).
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.loops import (
    COMMON_METHODS,
    DEFS,
    HOUSEKEEPING,
    LOADER_NAME,
    LOOPS,
    Facts,
    env_steps,
    name_of,
    one_block,
    own_level,
    sends_step,
    steps_each_env,
)
from gobrrr.lint.names import DTYPE_METHODS, VIEW_METHODS, self_attr

_DATA_ITERATOR = re.compile(r"^(train|eval|val|valid|test|data|batch)_?iterator$", re.I)   # self.eval_iterator
_NOT_WRAPPERS = {"DataLoader"}   # `torch.utils.data.DataLoader(dataset)` is the loader itself, not a wrapper of one
_CAPTURE = re.compile(r"cap|video|cam$|camera|webcam", re.I)   # cv2.VideoCapture(...) as vidcap, cap, cam
_ITER_WRAPPERS = ("enumerate", "tqdm", "iter", "zip")   # what a loop iterates its loader through
_COUNTS = {"range", "trange", "arange", "count", "repeat"}   # for n in trange(n_iter): a count, not items
_EPOCH = re.compile(r"epoch", re.I)   # for epoch in ...: a count of passes, whatever it iterates
_SWEEP = re.compile(r"^(bs|batch_?size|seq_?len|size|lr|dim)s?$|^(n|num)_", re.I)   # a setting swept, not an item
_BATCHING_CALL = re.compile(r"^(get_|iter_|iterate_|make_|yield_)?(as_)?(mini)?batch(es|ify)?(_|$)", re.I)
_BATCH_SOURCE = re.compile(r"loader|iter|gen|data|batch|stream|_dl$|^dl$|(^|_)db(_|$)", re.I)   # next(train_iter)


def step_loops(tree: ast.AST, facts: Facts, rare, nodes: list[ast.AST] | None = None
               ) -> tuple[set[int], set[int], set[int], set[str]]:
    """(id of the step loops, id of those that update, id of those that step an environment, names
    of the defs that hold a step loop), bottom-up. A loop that calls a def holding a step loop
    (`facts.looping`, this file's or the project's: `train_one_epoch()`, `sample_fn(model, shape)`)
    is an outer loop, not a step loop, unless it updates itself or takes a batch that it copies to the
    device itself (an evaluation loop that runs a sampler per batch: its copies and reads repeat).
    `nodes`: every node of `tree` in one list (source.walk), when the caller has it."""
    steps: set[int] = set()
    updates: set[int] = set()
    envs: set[int] = set()
    looping_fns: set[str] = set(facts.looping)   # defs that hold a step loop (`def train(epoch)`)

    imported: set[str] = set()
    wrapped: set[str] = set()   # names assigned a loader or a wrapper of one: `diter = enumerate(tqdm(dl))`
    nodes = list(ast.walk(tree)) if nodes is None else nodes
    for n in nodes:
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            imported |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _loader_like(n.value):
            wrapped |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.withitem) and isinstance(n.optional_vars, ast.Name) and _loader_like(n.context_expr):
            wrapped.add(n.optional_vars.id)   # with tqdm.tqdm(loader) as bar: for batch in bar

    local = {d.name: d for d in getattr(tree, "body", []) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    local_looping: set[str] = set()   # this file's module-level defs that hold a step loop
    own_methods = _own_method_calls(nodes)   # id of a `self.forward(...)` call -> the class's own `def forward`
    method_loops: dict[int, bool] = {}   # id of such a method -> it reaches a def that holds a step loop
    repeats: set[int] = set()   # step loops that run the model again on the same state (`for u in range(U):`)

    def looping(call: ast.Call, seen: frozenset = frozenset()) -> bool:
        n = name_of(call.func)
        f = call.func
        if isinstance(f, ast.Name) and f.id in local:   # update_params(batch), defined here: what this file's def
            return local_holds(f.id, set())            # does, whatever other scripts' defs of the name do
        method = own_methods.get(id(call))
        if method is not None and id(method) not in seen and not any(
                isinstance(x, LOOPS) and not _runs_its_items(x, [c for c in own_level(x.body) if isinstance(c, ast.Call)])
                for x in ast.walk(method)):
            # self.forward(ids) of a class whose own forward has no loop (but over its layers): what it calls
            # decides, not every project def named forward (MaskGIT's sampling loop is a step loop, not an outer one)
            if id(method) not in method_loops:
                method_loops[id(method)] = any(looping(c, seen | {id(method)}) for c in ast.walk(method)
                                               if isinstance(c, ast.Call))
            return method_loops[id(method)]
        if isinstance(f, ast.Attribute) and (n in COMMON_METHODS or n == "inference") and not (
                isinstance(f.value, ast.Name) and (f.value.id == "self" or f.value.id in imported)):
            return False   # `callbacks.run("on_val_batch_start")` is not the project's `def run` (`val.run` is), nor
            # RIFE's `model.inference(I0, I1)` a benchmark script's own looping `def inference(...)`
        return n in looping_fns or bool(facts.aliases.get(n, set()) & looping_fns)

    held: dict[str, bool] = {}   # local_holds, per pass (local_looping grows during the first)

    def local_holds(name: str, seen: set) -> bool:
        """This file's def `name` holds a step loop, or calls a def that does (`inference()` -> compute_on_dataset)."""
        if name in local_looping:
            return True
        if name in held:
            return held[name]
        top = not seen
        seen.add(name)
        found = any(n in local and n not in seen and local_holds(n, seen) or n not in local and looping(c)
                    for c in ast.walk(local[name]) if isinstance(c, ast.Call)
                    for n in [c.func.id if isinstance(c.func, ast.Name) else None])
        if found or top:   # a False found below a cut cycle (f -> g -> f) may not hold for g on its own
            held[name] = found
        return found

    def local_kind(call: ast.Call) -> str | None:
        """'update' for a call of this file's def that updates once (`def update_params(batch): ... a2c_step(...)`,
        no loop of its own): one step of the loop that calls it, as another script's def of the name may not be."""
        fn = local.get(call.func.id) if isinstance(call.func, ast.Name) else None
        if fn is None or local_holds(fn.name, set()):
            return None
        return "update" if any(isinstance(c, ast.Call) and facts.step_kind(c) == "update"
                               for c in own_level(fn.body)) else None

    holds: dict[int, bool] = {}   # id of a loop -> it is or holds a step loop (this pass)
    chunkers: set[str] = set()    # this file's defs whose step loops only walk their arguments in chunks

    def chunking(name: str, depth: int) -> bool:
        """This file's def `name` is a chunker, or calls one (nerf's `render()` -> `batchify_rays()`)."""
        fn = local.get(name) if chunkers else None
        return name in chunkers or fn is not None and depth > 0 and name not in local_looping and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id != name and chunking(c.func.id, depth - 1)
            for c in ast.walk(fn))

    def visit(node: ast.AST) -> bool:    # True if node is or holds a step loop
        inner = False
        for child in statements(node):
            inner |= visit(child)
        below = [x for x in _loops_below(node) if holds.get(id(x))] \
            if inner and isinstance(node, (ast.For, ast.FunctionDef)) else []
        pieces = [x for x in below if _chunk_range(x)]
        names = _walked_names(node, rare) if pieces else set()
        chunks = [x for x in pieces if _walks_in_chunks(x, names)]
        if chunks and len(chunks) == len(below):
            inner = False   # `for j in range(0, tgt_len - 1, trunc)` over this batch's target (OpenNMT's truncated
            # BPTT, a renderer's chunks of this image's rays): pieces of one step, not steps of an outer loop
            if isinstance(node, ast.FunctionDef) and local.get(node.name) is node:
                chunkers.add(node.name)   # nerf's `batchify_rays(rays_flat, chunk)`: a call of it is one step's work
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner:
            looping_fns.add(node.name)
            if local.get(node.name) is node:
                local_looping.add(node.name)
        if not isinstance(node, LOOPS):
            return inner and not isinstance(node, DEFS)
        own = list(own_level(node.body, rare))
        calls = [n for n in own if isinstance(n, ast.Call)]
        kinds = {local_kind(n) or facts.step_kind(n) for n in calls}
        if chunks or any(isinstance(c.func, ast.Name) and chunking(c.func.id, 2) for c in calls):
            kinds.add("forward")   # what its chunks do, it does once per item
        if any(id(x) in repeats for x in _loops_below(node)):
            kinds.add("forward")   # its step only repeats the same forward U times (RePaint's resampling):
            inner = False          # each of its own iterations is a step of the sampler
        if any(env_steps(n) for n in own) or sends_step(node) or steps_each_env(node) \
                or any(name_of(c.func) in facts.env_stepping for c in calls):
            kinds.add("env")   # (or a call of the project's def that steps one: `self.conduct_action(self.action)`)
        if calls and (_takes_batches(node, calls) or isinstance(node, ast.For) and _unwrapped(node.iter) in wrapped
                      and not _keys_of(node)):
            kinds.add("data")
        prompts = [n for n in calls if isinstance(n.func, ast.Attribute) and n.func.attr.endswith("generate")] \
            if _copies_up(calls) else []   # one prompt per iteration, copied up here: `model.generate(ids.cuda())`
        outer = any(looping(n) for n in calls if n not in prompts)   # calls a def that holds a step loop: a loop around
        if prompts:
            kinds.add("forward")
        if "update" in kinds:
            updates.add(id(node))
        if "env" in kinds:
            envs.add(id(node))
        runs_model = bool(prompts) or any(facts.step_kind(n) == "forward" and not looping(n)
                                          for n in calls)   # not a sampler's loop
        if "update" in kinds or "env" in kinds or _layer_by_layer(node, own) \
                or ("data" in kinds and (not outer or _moves_batch(node, own) or runs_model)) \
                or ("forward" in kinds and (not (inner or outer) or runs_model and _moves_batch(node, own)
                                            or prompts and outer and not inner
                                            or runs_model and isinstance(node, ast.While) and not inner)) \
                or (outer and not inner and _over_items(node) and (runs_model or _moves_batch(node, own))
                    and _hands_item(node, own, [c for c in calls if looping(c)])):
            steps.add(id(node))   # an env stepped or a batch taken is a step, whatever inner loops it holds
            if kinds <= {"forward", None} and _repeats(node):
                repeats.add(id(node))
            # (and a loop that copies its own item to the device and runs the model on it: a detect loop; one that
            # copies up a prompt and generates from it, though it calls a looping def too: RAFT's reward pass)
            inside = _over_optimizers(node) or (_runs_its_items(node, calls) and "update" not in kinds)
            holds[id(node)] = True
            return not (inside and not kinds & {"data", "env"})   # one optimizer or layer at a time, in the step
        inner |= outer
        holds[id(node)] = inner
        return inner

    known = set(looping_fns)
    visit(tree)
    if looping_fns != known or local_looping or chunkers:   # again, now that every def holding a step loop is known (a
        steps.clear(), updates.clear(), envs.clear(), repeats.clear()   # local one may be defined below the loop that calls it)
        held.clear(), method_loops.clear(), holds.clear()   # (chunkers kept: what the first pass learnt)
        visit(tree)
    return steps, updates, envs, looping_fns


def looping_closure(calls_by_def: dict[str, set[str]], looping: set[str]) -> set[str]:
    """The defs that hold a step loop, directly or through the defs they call (names, to a fixed
    point); housekeeping names (`train`, `eval`) are left out: they are also methods of every model. A `forward`
    holding a loop (StyleMelGAN's discriminator repeats itself) is one, but its name, every module's, makes no
    caller of a `.forward(...)` one (ParallelWaveGAN's `inference`, then its decode loop, taken for outer loops)."""
    out = {n for n in looping if n not in HOUSEKEEPING}
    changed = True
    while changed:
        changed = False
        for name, called in calls_by_def.items():
            if name not in out and name not in HOUSEKEEPING and called & out - {"forward"}:
                out.add(name)
                changed = True
    return out


def _repeats(loop: ast.AST) -> bool:
    """`for u in range(U):`, `for t in reversed(range(T)):` whose count picks no data (`x[c, i]`, `seq[i]`: a loop
    over chunks or a schedule's entries, whose reads stay an outer loop's): the model run again, U or T times."""
    it = loop.iter if isinstance(loop, ast.For) else None
    if isinstance(it, ast.Call) and name_of(it.func) == "reversed" and it.args:
        it = it.args[0]
    if not (isinstance(it, ast.Call) and name_of(it.func) == "range" and isinstance(loop.target, ast.Name)):
        return False
    return not _indexes_with(loop, {loop.target.id})


def _loops_below(node: ast.AST):
    """The loops directly inside a loop (through ifs, withs and trys, not through other loops or defs)."""
    for child in statements(node):
        if isinstance(child, LOOPS):
            yield child
        elif not isinstance(child, DEFS):
            yield from _loops_below(child)


def statements(node: ast.AST):
    """The statements directly inside a statement (its bodies, handlers and cases): loops and defs
    are statements, so a walk for them need not enter expressions."""
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, None) or ():
            if isinstance(child, ast.AST):
                yield child


def _chunk_range(loop: ast.AST) -> ast.Call | None:
    """The `range(start, end, size)` a for loop walks, if it takes three arguments."""
    it = loop.iter if isinstance(loop, ast.For) else None
    return it if isinstance(it, ast.Call) and name_of(it.func) == "range" and len(it.args) == 3 else None


def _walked_names(around: ast.AST, rare) -> set[str]:
    """What a loop's pieces may walk: the item of the loop (`_item_names`), or a def's arguments and the names made
    from them at its own level (`rays_flat` of `batchify_rays(rays_flat, chunk)`)."""
    own = list(own_level(around.body, rare))
    if not isinstance(around, ast.FunctionDef):
        return _item_names(around, own)
    return _made_from({a.arg for a in [*around.args.posonlyargs, *around.args.args, *around.args.kwonlyargs]} - {"self"},
                      own)


def _walks_in_chunks(loop: ast.AST, names: set[str]) -> bool:
    """`for j in range(0, n, size)` whose end is made from `names`, the item of the loop around it (`target_size =
    batch["tgt"].size(1)`, `rays.shape[0]` of this image's rays) or the def's arguments: it walks one item in
    pieces."""
    end = _chunk_range(loop).args[1]
    return _mentions(end, names) and not _mentions(end, {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)})


def _moves_batch(loop: ast.AST, own: list[ast.AST]) -> bool:
    """The loop copies its batch to the device itself: `x.to(dev)` of its target, of a name unpacked or made
    from it (`ids = [vocab[w] for w in example.src]`), or of a tensor built from those
    (`torch.LongTensor([ids]).to(device)`, a translation loop's sentence); not a copy to the host."""
    names = _item_names(loop, own)
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda")
               and not (c.args and isinstance(c.args[0], ast.Constant) and str(c.args[0].value).startswith("cpu"))
               and (_bare(c.func.value) in names or _built_from(c.func.value, names)) for c in own)


def _item_names(loop: ast.AST, own: list[ast.AST]) -> set[str]:
    """The names a loop binds to its item and those made from them at its own level, in source order: `images,
    targets, ids = batch`, `ids = tokenizer(prompt)["input_ids"]`; a while loop's `batch = next(data)`."""
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} if isinstance(loop, ast.For) else set()
    names |= {t.id for n in own if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
              and name_of(n.value.func) == "next" for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
    return _made_from(names, own)


def _made_from(names: set[str], own: list[ast.AST]) -> set[str]:
    """`names` and those assigned from them at a block's own level, in source order (own_level runs backwards)."""
    names = set(names)
    for n in sorted((n for n in own if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if _mentions(n.value, names):
            names |= {t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
    return names


def _layer_by_layer(loop: ast.AST, own: list[ast.AST]) -> bool:
    """A layer-by-layer pass, each layer a step whatever loops over samples it holds: one that moves a block of the
    model to the device at the loop's own level (GPTQ's `layer = layers[i].to(dev)`, AWQ's `layer = layers[i]; layer =
    layer.cuda()`), or takes one (`layer = layers[i]`) and runs the calibration samples through it in a loop of its
    own (Wanda's and SparseGPT's pruning, `for j in range(nsamples): outs[j] = layer(inps[j])`). A model's forward
    runs each layer at the loop's own level (_runs_its_items): per layer inside the step, not a pass of this kind."""
    taken = _taken_layers(own)
    moves = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda")
                and (one_block(c.func.value) or isinstance(c.func.value, ast.Name) and c.func.value.id in taken)
                for c in own)
    return moves or bool(taken) and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in taken
                                        for inner in ast.walk(loop) if inner is not loop and isinstance(inner, LOOPS)
                                        for n in ast.walk(inner))


def _taken_layers(own: list[ast.AST]) -> set[str]:
    """The names a loop binds to one block of a model's list at its own level: `layer = layers[i]`."""
    return {t.id for a in own if isinstance(a, ast.Assign) and one_block(a.value)
            for t in a.targets if isinstance(t, ast.Name)}


def _mentions(e: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(e))


def _built_from(e: ast.AST, names: set[str]) -> bool:
    """`torch.LongTensor([ids])`, `torch.tensor(ids)`: a tensor made from the loop's item on the host."""
    return isinstance(e, ast.Call) and bool(re.match(r"(torch|th)\.(tensor|as_tensor|from_numpy|[A-Z]\w*Tensor)$",
                                                      ast.unparse(e.func))) and _mentions(e, names)


def _over_optimizers(loop: ast.AST) -> bool:
    """`for name, opt in self.optimizers.items():` (a GAN's generator and discriminator, VQ-Diffusion's
    `optimizer_and_scheduler`): one update per optimizer inside the step, not a step loop that makes the
    def holding it a loop of its own; the loop over batches that calls that def is the step loop."""
    return isinstance(loop, ast.For) and bool(re.search(r"optim", ast.unparse(loop.iter), re.I))


def _runs_its_items(loop: ast.AST, calls: list[ast.Call]) -> bool:
    """`for block in self.blocks: x = block(x)` (or `self.blocks[i](x)`): a loop over layers that runs each one,
    inside a module's forward (or an encoder's `encode`): per layer inside the step, not a step loop that makes the
    def holding it a loop of its own (every caller of `encode` would be taken for an outer loop)."""
    if not isinstance(loop, ast.For):
        return False
    names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}

    def runs_item(f: ast.AST) -> bool:   # block(x), self.blocks[i](x), repmap[j - 1](x)
        if isinstance(f, ast.Name):
            return f.id in names
        return isinstance(f, ast.Subscript) and any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(f.slice))
    return any(runs_item(c.func) for c in calls)


def _own_method_calls(nodes) -> dict[int, ast.AST]:
    """id of each `self.name(...)` call inside a class -> that class's own method `name`, where it defines one (the
    innermost such class, by line span); one pass over the file's nodes."""
    classes = [(n.lineno, n.end_lineno, {d.name: d for d in n.body if isinstance(d, DEFS)})
               for n in nodes if isinstance(n, ast.ClassDef)]
    out: dict[int, ast.AST] = {}
    for c in nodes if classes else ():
        if isinstance(c, ast.Call) and self_attr(c.func):
            held = [(lo, m) for lo, hi, m in classes if lo <= c.lineno <= hi and c.func.attr in m]
            if held:
                out[id(c)] = max(held, key=lambda t: t[0])[1][c.func.attr]
    return out


def _copies_up(calls: list[ast.Call]) -> bool:
    """The loop copies something to the device itself (`.cuda()`, `.to(...)`): a prompt, an image."""
    return any(isinstance(c.func, ast.Attribute) and c.func.attr in ("to", "cuda") for c in calls)


def _bare(node: ast.AST) -> str:
    """The name a copy starts from: `im` in `im`, `torch.from_numpy(im)`, `im.float()`, `x.squeeze(0)`."""
    while isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and (not node.args and not node.keywords
                                                     or node.func.attr in VIEW_METHODS | DTYPE_METHODS):
            node = node.func.value   # im.float(), x.contiguous(), x_spt.squeeze(0) (MAML's episodes)
        elif name_of(node.func) in ("from_numpy", "as_tensor", "tensor") and len(node.args) == 1:
            node = node.args[0]   # torch.from_numpy(im)
        else:
            return ""
    return node.id if isinstance(node, ast.Name) else ""


def _takes_batches(loop: ast.AST, calls: list[ast.Call]) -> bool:
    """A for loop over a loader (`train_loader`, `DataLoader(...)`, `tqdm(loader)`), a while loop that
    calls next() on an iterator, a for loop that calls it on one named for data (`next(train_iter)`), or a
    loop that reads a frame from a video capture (`cap.read()`)."""
    if any(isinstance(c.func, ast.Attribute) and c.func.attr == "read" and not c.args
           and _CAPTURE.search(name_of(c.func.value)) for c in calls):
        return True   # ret, frame = vidcap.read(): a frame of a video or camera per iteration
    nexts = [c.args[0] for c in calls if isinstance(c.func, ast.Name) and c.func.id == "next" and c.args] + [
        c.func.value for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "next"]   # db_train.next()
    if isinstance(loop, ast.While) or any(isinstance(a, (ast.Name, ast.Attribute)) and _BATCH_SOURCE.search(
            name_of(a)) for a in nexts):   # not `next(iter(m.parameters()))` in a loop over modules
        return bool(nexts)
    return _loader_like(loop.iter)


def _hands_item(loop: ast.AST, own: list[ast.AST], loopers: list[ast.Call]) -> bool:
    """One of these calls of looping defs is handed the loop's item or a name made from it (`sample(model, c)`
    with `c = model.get_learned_conditioning(prompts)`), not only a fixed noise or a logger's message."""
    names = _item_names(loop, own)
    return any(_mentions(c, names) for c in loopers)


def _over_items(loop: ast.AST) -> bool:
    """`for prompts in tqdm(data):`, `for input_ids in tokenized_prompts:`, `for j in range(len(turns)):` picking
    `turns[j]`: a for loop over items (prompts, images, requests), not a count (`range(epochs)`, `trange(n_iter)`).
    One that hands each item (or what it makes of it) to a sampler or generator, and copies it up or runs the model
    on what comes back, does per-item work each time (txt2img's batch of prompts, TriForce's prompt, an MT-bench turn)."""
    if not isinstance(loop, ast.For) or _EPOCH.search(" ".join(
            n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name))) or _SWEEP.search(name_of(loop.target)):
        return False
    if isinstance(loop.iter, (ast.List, ast.Tuple, ast.Set)) and all(isinstance(e, ast.Constant) for e in loop.iter.elts):
        return False   # for bs in [1, 8, 32, 64]: a benchmark's sweep of settings, each one a run of its own
    it = loop.iter
    while isinstance(it, ast.Call) and it.args and name_of(it.func) in _ITER_WRAPPERS:
        it = it.args[0]
    if not (isinstance(it, ast.Call) and name_of(it.func) in _COUNTS):
        return True
    return _indexes_with(loop, {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)})


def _indexes_with(loop: ast.AST, counters: set[str]) -> bool:
    """The loop's counter picks data: some subscript in its body is indexed with it (`x[c, i]`, `turns[j]`)."""
    return any(isinstance(n, ast.Subscript) and _mentions(n.slice, counters) for st in loop.body for n in ast.walk(st))


def _keys_of(loop: ast.For) -> bool:
    """`for k in all_ret: all_ret[k] = ...`: the loop walks the keys of a dict it indexes with them (nerf's
    `all_ret = batchify_rays(rays, chunk)`, a dict of results), not batches of a loader."""
    return isinstance(loop.iter, ast.Name) and isinstance(loop.target, ast.Name) and any(
        isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == loop.iter.id
        and isinstance(n.slice, ast.Name) and n.slice.id == loop.target.id for st in loop.body for n in ast.walk(st))


def _unwrapped(it: ast.AST) -> str | None:
    """The name a loop iterates through enumerate/tqdm/iter/zip (`for i, x in enumerate(t)` -> t), else None."""
    while isinstance(it, ast.Call) and it.args and name_of(it.func) in _ITER_WRAPPERS:
        it = it.args[0]
    return it.id if isinstance(it, ast.Name) else None


def _loader_like(it: ast.AST) -> bool:
    """`train_loader`, `DataLoader(...)`, `tqdm(loader)`, `dataloaders["train"]`, `self.eval_iterator`, and
    `tqdm(it) if main_process else it`."""
    while isinstance(it, ast.Call) and it.args and isinstance(it.func, (ast.Name, ast.Attribute)) \
            and (name_of(it.func) in (*_ITER_WRAPPERS, "islice", "progress_bar", "track")
                 or isinstance(it.func, ast.Attribute) and name_of(it.func) not in _NOT_WRAPPERS):
        it = it.args[0]   # also a logger's wrapper: `metric_logger.log_every(data_loader, 10, header)`
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and not it.args and not it.keywords \
            and it.func.attr not in ("items", "keys", "values") and _loader_like(it.func.value):
        return True   # self.datasets.dataloader_train.__iter__(), dataloader['train_loader'].get_iterator() (MTGNN's
        # own loader class); not `mm_motion_loaders.items()`, the (name, loader) pairs of a dict of loaders
    if isinstance(it, ast.IfExp):
        return _loader_like(it.body) or _loader_like(it.orelse)
    if isinstance(it, ast.Call):   # DataLoader(...), or a project generator named for batches: get_as_batch(data,
        return name_of(it.func) == "DataLoader" or bool(_BATCHING_CALL.search(name_of(it.func)))   # bs, device=dev)
    if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Constant) and isinstance(it.slice.value, str):
        it = it.value   # dataloaders["train"]: one loader of a dict of them
    return isinstance(it, (ast.Name, ast.Attribute)) and bool(LOADER_NAME.search(name_of(it))
                                                              or _DATA_ITERATOR.search(name_of(it)))


__all__ = ["step_loops", "looping_closure", "statements"]
