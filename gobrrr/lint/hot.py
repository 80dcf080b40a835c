"""Where `gobrrr lint` looks: which code runs every training step, found from the syntax alone.

A sync costs something only where it repeats. This pass marks, before any rule runs:

    step loops     loops that update, call a module, take batches or step an environment, and
                   hold no inner step loop (loops: by what they do, not by names).
    hot code       a step loop's body, and everything nested in it; the body of a per-step hook:
                   one a framework calls (`training_step`, `compute_loss`, ...), a module's
                   `forward()` (it runs on every batch), an optimizer's `step()`, an environment's
                   `step(actions)` (a GPU env: a class based on a Task or VecEnv, stepped by a library's runner), a method that
                   steps the optimizer itself (`def run_step(self): ... opt.step()`).
    off branches   code that runs rarely even inside a step loop: the body of an `if` that is
                   rate-limited (`if step % 100 == 0:`, `if step == warmup:`, a timer) unless it
                   holds the optimizer step itself (gradient accumulation, a delayed update made up
                   in a loop); an option named like logging or saving (`if args.verbose:`,
                   `if tb_writer is not None:`) only if its branch saves, evaluates or plots (once
                   on, it runs every step); a
                   branch that ends the loop or the run (`raise`, `break`, `return`); `except`
                   handlers; an assert's message; code after `if not should_log(step): return`.
    timed syncs    a synchronize() next to a timer read (time.perf_counter(), elapsed_time()), or
                   in a loop that reads one (timm's batch_time): a stopwatch, still a stall every
                   step, reported with CUDA events as its fix; in benchmark code (a path or function
                   named bench/timing/profile...) it is measurement and not reported.

The functions hot code calls (in this file or another) are followed by the call graph
(graph), not here. Everything here is syntactic and runs before the kinds of kinds.
"""
from __future__ import annotations

import ast
import re

from gobrrr.lint.conditions import (
    RARE_WORDS,
    cuda_test,
    graph_mode,
    mode_switch,
    option_flags,
    other_backend,
    words,
)
from gobrrr.lint.loops import (
    LOOPS,
    OPTIM,
    Facts,
    dotted,
    is_model_name,
    name_of,
    own_level,
    stepping_defs,
)
from gobrrr.lint.source import walk
from gobrrr.lint.steploops import step_loops

# calls that make a branch rare work whatever guards it: saving, evaluating, plotting, sampling
_RARE_WORK = re.compile(r"save|dump|checkpoint|ckpt|eval|valid|test|plot|visuali|sample|generate|export|"
                        r"image|video|histogram|profile", re.I)
_COUNTER = re.compile(r"^(i|j|k|it|n|step|steps|iter|iters|iteration|idx|batch_idx|batch_i|batch_id|"
                      r"global_step|iter_num|n_iter|epoch|micro_step|completed_steps|num_updates|"
                      r"update|updates)$|_(step|idx|iter|iters|steps|num|nb)$", re.I)
_ACCUM = re.compile(r"^(gradient_accumulation_steps|grad(ient)?_accum\w*|accum(ulation)?(_steps|_iters?)?|"
                    r"accumulate_grad_batches|num_accum\w*)$")   # micro-batches per optimizer step
_BATCHING = re.compile(r"(^|_)(batch_size|bsz|bs)$")   # `(i + 1) % infer_batch_size == 0`: a batch gathered is run
_TIMER = re.compile(r"(^|\.)(time|perf_counter|perf_counter_ns|monotonic|monotonic_ns|process_time|"
                    r"time_ns|default_timer|elapsed_time|tic|toc)$")
_BENCH = re.compile(r"bench|timing|timed|timeit|timer|profil|measure|latency|throughput|speed", re.I)
# per-step hooks that a framework calls (Lightning, the HF Trainer): their bodies are hot
STEP_HOOKS = {"training_step", "validation_step", "test_step", "predict_step", "training_step_end",
              "validation_step_end", "on_before_optimizer_step", "on_after_backward", "compute_loss", "prediction_step",
              "train_batch", "post_step",   # OLMo-core: TrainModule.train_batch, Callback.post_step
              "get_batch_loss_metrics", "concatenated_forward",   # trl's DPO/KTO/ORPO trainers call them per step
              "_prepare_inputs"}   # transformers' Trainer.training_step, per micro-batch (trl's on-policy trainers)
# words that say a file runs on a device; `.cpu()` alone does not (a CPU model's .cpu() is a no-op)
_DEVICE_WORDS = re.compile(r"cuda|device|dev\b|gpu")   # what `.to(...)`/`device=` name when they move to the GPU
_GPU_WORDS = re.compile(r"cuda|device|gpu|\.to\(|accelerat|torch_xla|\bxla\b|\bxm\b|\bmps\b|deepspeed|lightning|"
                        r"fabric")


# handlers of a batch event (Lightning's `on_train_batch_end`, sample-factory's `on_new_training_batch`), and methods
# connected to a loop's per-iteration signal (`self.inference_loop.iteration.connect(self._run)`): once per batch or step
_BATCH_HANDLER = re.compile(r"on_\w*batch\w*")
# a GPU environment class (Isaac Gym's `BaseTask`/`VecTask`, a `VecEnv`): a runner from a library calls its
# `step(actions)` per step, so its body (and what it calls) is per-step code though no loop of the project calls it;
# not a `gym.Env` (a host simulator in numpy, mbrl-lib's CartPole)
_ENV_BASE = re.compile(r"(Task|VecEnv)$")
_STEP_SIGNALS = {"iteration", "step", "on_step", "new_batch"}


def _per_step_slots(cls: ast.ClassDef) -> set[str]:
    """Names of the class's methods connected to a per-iteration signal: `loop.iteration.connect(self._run)`."""
    return {n.args[0].attr for n in ast.walk(cls)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "connect"
            and isinstance(n.func.value, ast.Attribute) and n.func.value.attr in _STEP_SIGNALS and len(n.args) == 1
            and isinstance(n.args[0], ast.Attribute) and isinstance(n.args[0].value, ast.Name) and n.args[0].value.id == "self"}


_ROUTES = {"post", "get", "put", "route", "websocket", "api_route"}   # @app.post("/generate"), @bp.route(...)
_SUBSCRIBERS = {"Subscriber", "create_subscription"}   # rospy.Subscriber(topic, Msg, cb), node.create_subscription(...)


def _request_handlers(nodes: list[ast.AST]) -> set[str]:
    """Names of the defs a server runs once per request or message: a web route's handler (`@app.post(...)`) and
    a callback given to a ROS subscriber. Each call is one iteration of a loop the framework runs."""
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in _ROUTES
                and isinstance(d.func.value, ast.Name) and re.search(r"app|router|bp|api|server", d.func.value.id)
                for d in n.decorator_list):
            out.add(n.name)
        elif isinstance(n, ast.Call) and name_of(n.func) in _SUBSCRIBERS and len(n.args) > 2:
            cb = n.args[2]
            out.add(cb.attr if isinstance(cb, ast.Attribute) else cb.id if isinstance(cb, ast.Name) else "")
    return out - {""}


def _moves_to_device(fn: ast.AST) -> bool:
    """The def calls `.cuda()`, `.to(<a device>)` or builds with `device=<a device>` (syntax only: `.to("cuda")`)."""
    return any(isinstance(n, ast.Call) and (isinstance(n.func, ast.Attribute) and (n.func.attr == "cuda" or (
        n.func.attr == "to" and n.args and _DEVICE_WORDS.search(ast.unparse(n.args[0]))))
        or any(k.arg == "device" and _DEVICE_WORDS.search(ast.unparse(k.value)) for k in n.keywords)) for n in ast.walk(fn))


def may_use_gpu(text: str) -> bool:
    """False for a file that never mentions a device: its loops run on the CPU and sync nothing."""
    return bool(_GPU_WORDS.search(text))


def host_model_def(fn: ast.AST, plain: frozenset = frozenset()) -> bool:
    """A def that builds its module from a class (`model = Net(...)`, a checkpoint loaded with map_location="cpu"),
    calls it, and never names a device: torchbeast's test(); it runs on the CPU. `plain`: the project's classes
    that are no modules (Crossformer's `early_stopping = EarlyStopping(...)`, a callable object)."""
    built = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Name) and n.value.func.id[:1].isupper()
             and n.value.func.id not in plain for t in n.targets if isinstance(t, ast.Name)}
    called = {n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return bool(built & called) and not _GPU_WORDS.search(ast.unparse(fn))


def is_bench_name(name: str) -> bool:
    return bool(_BENCH.search(name))


_SIMPLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Import, ast.ImportFrom, ast.Pass,
           ast.Raise, ast.Assert, ast.Delete, ast.Global, ast.Nonlocal, ast.Break, ast.Continue)


def _ends_flow(body: list[ast.stmt], in_loop: bool = True) -> bool:
    """The branch leaves early: raise, break, exit, a return of what is already computed (outside a
    loop, `result = {...}; return result` computes: one of the def's main paths)."""
    last = body[-1] if body else None
    if isinstance(last, (ast.Raise, ast.Break)):
        return True
    if isinstance(last, ast.Return):   # `return self.prepare_bbox(preds)`, `...; return result` do the work
        if last.value is None or any(isinstance(n, ast.Call) for n in ast.walk(last.value)):
            return last.value is None
        made = {t.id for st in body if isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for tgt in (st.targets if isinstance(st, ast.Assign) else [st.target]) for t in ast.walk(tgt)
                if isinstance(t, ast.Name)}
        return in_loop or not any(isinstance(n, ast.Name) and n.id in made for n in ast.walk(last.value))
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return name_of(last.value.func) in ("exit", "_exit", "abort")
    return False


class HotMap:
    """The step loops, hooks, rare branches and timed syncs of one module (see the module doc).
    `nodes`: the module's nodes in one flat list (source.walk); `module_classes`: the names of
    the project's nn.Module classes; `facts`: loops.Facts with the project's updating defs."""

    def __init__(self, tree: ast.Module, path: str = "", nodes: list[ast.AST] | None = None,
                 module_classes=frozenset(), facts: Facts | None = None):
        nodes = walk(tree) if nodes is None else nodes
        self.constants = {t.id: st.value.value for st in tree.body if isinstance(st, ast.Assign)
                          and isinstance(st.value, ast.Constant) for t in st.targets if isinstance(t, ast.Name)}
        self.accum = {t.id for st in nodes if isinstance(st, ast.Assign) and isinstance(st.value, (ast.Name, ast.Attribute))
                      and _ACCUM.search(name_of(st.value)) for t in st.targets if isinstance(t, ast.Name)}
        self.rated = {t.id for st in nodes if isinstance(st, ast.Assign) and any(   # log_now = step % every == 0
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(st.value))
            for t in st.targets if isinstance(t, ast.Name)}   # a rate decided per step, not an option
        if facts is None:
            facts = Facts(nodes, module_classes)
            facts.stepping |= stepping_defs(nodes, facts)
        self.facts = facts
        self.models = self.facts.models
        self.off_ifs: set[int] = set()           # id(If) whose body is rare (or never runs on the GPU)
        self.rare_ifs: set[int] = set()          # id(If) whose body runs every N steps (`step % val_every == 0`)
        self.hooks: set[int] = set()             # id(def) of per-step hooks (framework hooks, forward, step)
        self.step_fns: set[int] = set()          # id(def) of methods (or looped functions) that step once
        self.timed: set[int] = set()             # lines of synchronize() calls used for timing
        self.bench_file = is_bench_name(path)    # benchmarks/..., bench_attention.py, param_bench/...
        self.off_elses: set[int] = set()         # id(If) whose else runs only when scripting/tracing/compiling
        self.main_ifs: set[int] = set()          # id(If) `if not cfg.DEBUG:`: the body is the normal way
        self.on_flags, self.loop_ifs = _default_on_flags(tree)
        self.backend_flags = {t.id for n in nodes if isinstance(n, ast.Assign) and other_backend(n.value)
                              for t in n.targets if isinstance(t, ast.Name)}   # is_mps = x.device.type == "mps"
        for n in nodes:
            if isinstance(n, ast.If):
                cuda = cuda_test(n.test)
                rare = self.rare(n)
                if rare or graph_mode(n.test) or cuda is False:
                    self.off_ifs.add(id(n))
                if rare:
                    self.rare_ifs.add(id(n))
                elif isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not) and graph_mode(n.test.operand) \
                        or cuda:
                    self.off_elses.add(id(n))   # the GPU is assumed: `else:` of `if use_cuda:` is the CPU path,
                    if cuda:                    # and what the body binds holds after it (OpenNRE's
                        self.main_ifs.add(id(n))   # `if torch.cuda.is_available(): data[i] = data[i].cuda()`)
                off_flag = n.test.operand if isinstance(n.test, ast.UnaryOp) and isinstance(n.test.op, ast.Not) else \
                    n.test.left if isinstance(n.test, ast.Compare) and len(n.test.ops) == 1 \
                    and isinstance(n.test.ops[0], ast.Eq) and isinstance(n.test.comparators[0], ast.Constant) \
                    and n.test.comparators[0].value is False else None   # `not cfg.DEBUG`, `self.debug == False`
                if isinstance(off_flag, (ast.Name, ast.Attribute)) and "debug" in dotted(off_flag).rsplit(".", 1)[-1].lower():
                    self.main_ifs.add(id(n))
                    self.off_elses.add(id(n))   # its else is the debug way: off, as `if cfg.DEBUG:` is rare
        self.tree, self._nodes = tree, nodes
        self.restep()
        self._hooks(tree, module_classes, nodes)
        self.off_tails = self._off_tails(nodes)  # id(stmt) after `if not should_log(step): return`
        if any(isinstance(n, ast.Attribute) and n.attr == "synchronize" or isinstance(n, ast.Name)
               and n.id == "synchronize" for n in nodes):
            self._timed(nodes)

    def restep(self) -> None:
        """(Re)find the step loops, with what `facts` knows now."""
        self.step_loops, self.update_loops, self.env_loops, self.looping = step_loops(
            self.tree, self.facts, lambda n: id(n) in self.off_ifs, self._nodes)

    def _hooks(self, tree: ast.Module, module_classes, nodes) -> None:
        in_loops = None
        handlers = _request_handlers(nodes)
        engines = {n.args[0].id for n in nodes if isinstance(n, ast.Call) and name_of(n.func) == "Engine"
                   and n.args and isinstance(n.args[0], ast.Name)}   # ignite: Engine(process_batch) runs it per batch
        self.step_fns |= {id(fn) for fn in nodes if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and fn.name in engines}   # (a step function: on the CPU in a script that names no device)
        for cls in [None, *(n for n in nodes if isinstance(n, ast.ClassDef))]:   # nested classes too
            body = tree.body if cls is None else cls.body
            bases = [dotted(b) for b in cls.bases] if cls is not None else []
            is_module = cls is not None and (cls.name in module_classes or any(b.endswith("Module") for b in bases))
            is_optim = cls is not None and any(b.endswith("Optimizer") for b in bases)
            is_env = cls is not None and any(_ENV_BASE.search(b) for b in bases)   # legged_gym's LeggedRobot(BaseTask)
            slots = _per_step_slots(cls) if cls is not None else set()
            for fn in body:
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if fn.name in handlers:
                    self.hooks.add(id(fn))   # a request's or a message's handler: per request
                elif cls is not None and (fn.name in STEP_HOOKS or fn.name in slots or _BATCH_HANDLER.fullmatch(fn.name)
                                        or (fn.name == "forward" and is_module)
                                        or (fn.name == "step" and (is_optim or is_env))
                                        or (fn.name == "__call__" and any(   # a wrapper that runs the model
                                            isinstance(n, ast.Call) and self.facts.step_kind(n) == "forward"
                                            for n in own_level(fn.body)))):
                    self.hooks.add(id(fn))
                elif (fn.name in self.facts.collates or cls is not None and fn.name == "__getitem__"
                      and any(b.endswith("Dataset") for b in bases)) and _moves_to_device(fn):
                    self.hooks.add(id(fn))   # collate_fn=partial(f, device=device) per batch, a Dataset's __getitem__
                    # per sample, each moving it to the GPU (a collate of host samples only, as NeMo's, is host code)
                elif fn.name in self.facts.stepping and (cls is not None or fn.name in (
                        in_loops := in_loops if in_loops is not None else _called_in_loops(tree))) \
                        and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
                                and self.facts.is_optimizer(n.func.value) for n in own_level(fn.body)):
                    self.step_fns.add(id(fn))   # `def run_step(self): ... loss.backward(); opt.step()`
        in_classes = {id(d) for c in nodes if isinstance(c, ast.ClassDef) for d in c.body}
        self.hooks |= {id(fn) for fn in nodes if isinstance(fn, ast.FunctionDef) and fn.name in STEP_HOOKS
                       and id(fn) not in in_classes and fn.args.args and fn.args.args[0].arg == "self"}
        # `def training_step(self, model, inputs)` written in main() and bound onto the trainer (types.MethodType)

    def rare(self, node: ast.If) -> bool:
        """The body runs on few iterations: rate-limited, first step, a flag, a timer; and it does
        not hold the optimizer step (`if (i + 1) % accum == 0: opt.step()` is the step itself)."""
        if mode_switch(node.test):
            return False   # `if self.training: ... return losses`: a forward's main path, not an early exit
        if other_backend(node.test, self.backend_flags):
            return True    # `if device.type == "mps":` never runs where the GPU is a CUDA one
        if _ends_flow(node.body, id(node) in self.loop_ifs) or _lazy_init(node):
            return True
        if isinstance(node.test, ast.Name) and id(node) in self.on_flags.get(node.test.id, ()):
            return False   # `def loss_labels(..., log=True): ... if log:` runs on every call by default
        return self._rate_limited(node.test, node.body)

    def _rate_limited(self, test: ast.AST, body: list[ast.stmt]) -> bool:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and all(
                isinstance(v, (ast.Name, ast.Attribute)) for v in test.values):
            # `if save_img or save_crop or view_img:` runs when any option is on: rare only if each one is
            return all(self._rate_limited(v, body) for v in test.values)
        nodes = list(ast.walk(test))
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and (
                self.constants.get(name_of(n.right)) == 1 or name_of(n.right) in self.facts.every_step)
               for n in nodes):
            return False   # `iter_num % log_interval == 0` with `log_interval = 1` at the top: every step
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and (
                _ACCUM.search(name_of(n.right) or "") or name_of(n.right) in self.accum
                or _BATCHING.search(name_of(n.right) or "")) for n in nodes):
            return False   # `step % gradient_accumulation_steps == 0`: once per optimizer step, a step itself;
            # `(i + 1) % batch_size == 0` over samples: the batch they fill runs, once per batch
        rare = False
        flags = option_flags(test, self.rated)
        tops, todo = set(), [test]   # the comparisons the test itself makes: `m1 == i` inside any(...) is an array's
        while todo:
            t = todo.pop()
            tops.add(id(t))
            todo += t.values if isinstance(t, ast.BoolOp) else [t.operand] if isinstance(t, ast.UnaryOp) else []
        for n in nodes:
            if flags and id(n) in flags:
                continue   # judged below, by what its branch does
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
                rare = rare or not _remainder_test(n)
            elif isinstance(n, ast.Compare) and any(isinstance(op, ast.Eq) for op in n.ops) and id(n) in tops \
                    and any(_COUNTER.search(name_of(x) or "") for x in [n.left, *n.comparators]):
                rare = True
            elif isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Lt, ast.LtE)) \
                    and _COUNTER.search(name_of(n.left) or "") and isinstance(n.comparators[0], ast.Constant) \
                    and isinstance(n.comparators[0].value, int) and n.comparators[0].value <= 10:
                rare = True   # `if batch_i < 3:` the first few iterations
            elif isinstance(n, (ast.Name, ast.Attribute)) and words(name_of(n)) & RARE_WORDS:
                rare = True
            elif isinstance(n, ast.Call) and _TIMER.search(dotted(n.func)):
                rare = True
        if not rare and flags:
            rare = any(isinstance(n, ast.Call) and _RARE_WORK.search(name_of(n.func) or "") for n in own_level(body))
        if not rare:
            return False
        for stmt in body:   # the accumulation boundary is hot, not rare
            for n in own_level([stmt]):
                if isinstance(n, ast.Call) and self.facts.step_kind(n) == "update":
                    return False
        for n in (n for stmt in body for n in ast.walk(stmt)):   # a delayed update, made up in a loop:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (   # `for _ in range(k): ...
                    n.func.attr == "backward" or n.func.attr == "step" and self.facts.is_optimizer(n.func.value)):
                return False   # actor_loss.backward(); actor_opt.step()` every k steps is training, not logging
        return True

    def _off_tails(self, nodes: list[ast.AST]) -> set[int]:
        """Statements after a guard that leaves on most steps (`if not log_now: return`,
        `if step % N != 0: continue`): they run on the rare steps only. Also those after a GPU path that
        returns (`if torch.cuda.is_available(): return nms_cuda(...)`, `if x.is_cuda: return ext(x)`): the
        rest is the CPU fallback, as the `else:` of such a test is."""
        out: set[int] = set()
        for node in nodes:
            if not isinstance(node, (ast.stmt, ast.Module, ast.excepthandler)) or isinstance(node, _SIMPLE):
                continue
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                if not isinstance(body, list):
                    continue
                for i, stmt in enumerate(body):
                    if not (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                            and isinstance(stmt.body[-1], (ast.Return, ast.Continue))):
                        continue
                    t = stmt.test
                    if cuda_test(t) is True and isinstance(stmt.body[-1], ast.Return):
                        out |= {id(s) for s in body[i + 1:]}
                        break
                    inner = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else (
                        t if isinstance(t, ast.Compare) and any(isinstance(o, ast.NotEq) for o in t.ops) else None)
                    if inner is not None and self._rate_limited(inner, body[i + 1:]) \
                            and not self._runs_a_model(body[i + 1:]):
                        out |= {id(s) for s in body[i + 1:]}
                        break
        return out

    def _runs_a_model(self, stmts: list[ast.stmt]) -> bool:
        """The tail after `if count % skip != 0: continue` runs a model (`model(x)`, `detect(pose_model, img)`):
        the loop skips frames and the kept ones are its steps, not a log written every N steps."""
        return any(isinstance(n, ast.Call) and (self.facts.step_kind(n) in ("forward", "update") or any(
            isinstance(a, (ast.Name, ast.Attribute)) and is_model_name(name_of(a)) for a in n.args))
            for st in stmts for n in own_level([st]))

    def _timed(self, nodes: list[ast.AST]) -> None:
        """synchronize() next to a timer read, or in a loop that reads one: measurement."""
        for node in nodes:
            if isinstance(node, LOOPS):
                own = [n for n in own_level(node.body) if isinstance(n, ast.Call)]
                if any(_TIMER.search(dotted(n.func)) for n in own):
                    self.timed |= {n.lineno for n in own if dotted(n.func).endswith("synchronize")}
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                if not isinstance(body, list):
                    continue
                for i, stmt in enumerate(body):
                    if not _calls(stmt, lambda s: s.endswith("synchronize")):
                        continue
                    near = body[max(0, i - 1):i] + body[i + 1:i + 2]
                    if any(_calls(s, _TIMER.search) for s in near):
                        self.timed |= {n.lineno for n in ast.walk(stmt) if isinstance(n, ast.Call)
                                       and dotted(n.func).endswith("synchronize")}


def _called_in_loops(tree: ast.AST) -> set[str]:
    """Names of the functions called somewhere inside a loop (one pass)."""
    out: set[str] = set()
    stack = [(tree, False)]
    while stack:
        node, inside = stack.pop()
        if inside and isinstance(node, ast.Call):
            out.add(name_of(node.func))
        inside = inside or isinstance(node, LOOPS)
        stack.extend((c, inside) for c in ast.iter_child_nodes(node))
    return out


def _default_on_flags(tree: ast.AST) -> tuple[dict[str, set[int]], set[int]]:
    """(flag name -> id of the ifs that test a parameter of their def defaulting to True, id of the
    ifs inside a loop of their def), in one walk over statements."""
    flags: dict[str, set[int]] = {}
    in_loop: set[int] = set()
    stack = [(tree, frozenset(), False)]
    while stack:
        node, on, looping = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = [*a.posonlyargs, *a.args]
            pairs = [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            on = frozenset(p.arg for p, d in pairs if isinstance(d, ast.Constant) and d.value is True)
            looping = False
        elif isinstance(node, ast.If):
            if looping:
                in_loop.add(id(node))
            if isinstance(node.test, ast.Name) and node.test.id in on:
                flags.setdefault(node.test.id, set()).add(id(node))
        inner = looping or isinstance(node, LOOPS)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            stack += [(child, on, inner) for child in getattr(node, field, None) or ()]
    return flags, in_loop


_SIZE_WORDS = {"len", "length", "size", "shape", "dim", "seq", "pred", "width", "height", "channels"}


def _remainder_test(mod: ast.BinOp) -> bool:
    """A remainder of sizes decides a shape, not a rate: `(self.seq_len + self.pred_len) % period != 0` pads a
    sequence the period does not divide, on whatever step the data asks. `step % every == 0` stays a rate limit."""
    inner = {id(x.value) for x in ast.walk(mod.left) if isinstance(x, ast.Attribute)}   # x.shape: "shape", not "x"
    names = [name_of(x) for x in ast.walk(mod.left) if isinstance(x, (ast.Name, ast.Attribute)) and id(x) not in inner]
    return bool(names) and all(set(re.split(r"_+", n.lower())) & _SIZE_WORDS for n in names)


def _lazy_init(node: ast.If) -> bool:
    """`if preds is None: preds = ...`, `if self.grid[i].shape != x.shape: self.grid[i] = ...`, `if k not in cache:
    cache[k] = ...`, `if not hasattr(self, 'a'): self.a = ...`: runs when a cached value is missing or stale (the
    first iteration, a new input size, a new key), not every step. `if p.grad is not None: ...; p.grad = None` uses
    and clears a value that is there every step: no initialisation."""
    t = node.test
    assigned = {ast.unparse(x) for s in node.body if isinstance(s, ast.Assign)
                and not (isinstance(s.value, ast.Constant) and s.value.value is None)   # `p.grad = None` after
                for x in s.targets if isinstance(x, (ast.Attribute, ast.Subscript))}    # using it clears, not fills
    if assigned and any(isinstance(n, (ast.Attribute, ast.Subscript)) and ast.unparse(n) in assigned
                        for n in ast.walk(t)):
        return True
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and isinstance(t.operand, ast.Call) \
            and name_of(t.operand.func) == "hasattr" and len(t.operand.args) == 2 and isinstance(t.operand.args[1], ast.Constant):
        obj, attr = t.operand.args   # `if not hasattr(self, 'queue_lr'): self.queue_lr = torch.zeros(...).cuda()`
        return f"{ast.unparse(obj)}.{attr.value}" in assigned
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.NotIn):
        key, table = ast.unparse(t.left), ast.unparse(t.comparators[0])   # `if k not in cache: cache[k] = ...`
        return any(isinstance(x, ast.Subscript) and ast.unparse(x.value) == table and ast.unparse(x.slice) == key
                   for st in ast.walk(node) if isinstance(st, ast.Assign) for x in st.targets)
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is)
            and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None):
        return False
    name = ast.unparse(t.left)
    return any(isinstance(s, ast.Assign) and any(ast.unparse(x) == name for x in s.targets) for s in node.body)


def _calls(stmt: ast.AST, pred) -> bool:
    if isinstance(stmt, ast.If) and not stmt.orelse:   # if torch.cuda.is_available(): torch.cuda.synchronize()
        return all(not isinstance(s, (ast.If, *LOOPS)) for s in stmt.body) and any(_calls(s, pred) for s in stmt.body)
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, *LOOPS, ast.If)):
        return False
    return any(isinstance(n, ast.Call) and pred(dotted(n.func)) for n in ast.walk(stmt))


def own_nodes(scope: ast.AST):
    """The nodes of a module or function, not those of functions defined inside it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        stack += [c for c in ast.iter_child_nodes(node)
                  if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))]


def iterates(it: ast.AST, name: str | None) -> bool:
    if isinstance(it, ast.Name):
        return it.id == name
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "iter", "zip", "tqdm"):
        return any(iterates(a, name) for a in it.args)
    return False


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


__all__ = ["HotMap", "may_use_gpu", "is_bench_name", "is_model_name", "name_of", "own_nodes", "iterates",
           "root_name", "STEP_HOOKS", "OPTIM"]
