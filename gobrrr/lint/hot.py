"""Where `gobrrr lint` looks: which code runs every training step, found from the syntax alone.

A sync costs something only where it repeats. This pass marks, before any rule runs:

    step loops     a loop whose own body (its ifs, withs and trys, not its inner loops, not its
                   rare branches) calls backward, an optimizer step or a same-file function that
                   does (`train_step(batch)`), or calls a model and holds no inner step loop:
                   `for x, y in loader: loss = crit(model(x), y); loss.backward(); opt.step()`.
                   An epoch loop that only holds a step loop (or calls `train_one_epoch`) is not one.
                   A model is known by its name's head word (`model`, `ddp_model`, `netD`, `agent`)
                   or by what was assigned to it (`m = resnet50()`, `nn.Linear(...)`).
    hot code       a step loop's body, and everything nested in it; the body of a per-step hook a
                   framework calls (`training_step`, `compute_loss`, ...).
    off branches   code that runs rarely even inside a step loop: the body of an `if` that is
                   rate-limited (`if step % 100 == 0:`, `if last_batch or i % freq == 0:`,
                   `if step == warmup:`, a log/eval/save flag, a timer) unless it holds the optimizer
                   step itself (gradient accumulation); a branch that ends the loop or the run
                   (`raise`, `break`, `return`); `except` handlers; an assert's message.
    hot calls      a function or method of the same file called from hot code (one level deep):
                   its body is checked as hot, with its arguments' kinds from the call site.
    timed syncs    a synchronize() next to a timer read (time.perf_counter(), event.record()), or
                   in a loop that reads one (timm's batch_time), or in benchmark code (a path or
                   function named bench/timing/profile...): deliberate measurement, not a stall.

Everything here is syntactic, so it is cheap and runs before the kind inference of lint_kinds.
"""
from __future__ import annotations

import ast
import re

# a callee that is a model: its call is a forward pass (`model(x)`, `self.net(x)`, `engine(batch)`)
_MODEL_WORDS = {"model", "models", "net", "engine", "encoder", "decoder", "generator", "discriminator", "policy",
                "actor", "critic", "agent", "classifier", "backbone", "teacher", "student", "transformer", "gpt",
                "llm", "bert", "vae", "unet", "ddp", "fsdp", "ema", "lm", "seq2seq", "autoencoder", "detector"}
# methods of a model that do not compute on a batch
_HOUSEKEEPING = {"train", "eval", "zero_grad", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
                 "named_modules", "children", "named_children", "state_dict", "load_state_dict", "to", "cuda", "cpu",
                 "half", "float", "double", "bfloat16", "apply", "requires_grad_", "register_buffer",
                 "register_parameter", "register_forward_hook", "register_forward_pre_hook",
                 "register_full_backward_hook", "save_pretrained", "init_hidden", "init_weights",
                 "get_input_embeddings", "resize_token_embeddings", "gradient_checkpointing_enable", "tie_weights",
                 "share_memory", "add_module", "update", "set_epoch", "fp16_enabled", "no_sync", "save_checkpoint",
                 "load_checkpoint", "get_submodule", "get_parameter", "set_attn_processor", "log", "print", "get",
                 "backward", "step", "clip_grad_norm_", "unwrap_model", "prepare", "gather", "reduce"}
_NOT_MODEL = re.compile(r"^(get|build|create|load|make|init|save|setup|prepare|wrap|unwrap|to|is|has|"
                        r"print|log|set|update|reset|freeze|count|num|n)_|_(fn|kwargs|args|cfg|config|name|path|"
                        r"type|dir|id|ids|hidden|output|outputs|out|outs|state|states|input|inputs|mask|loss|logits|"
                        r"emb|embeds|features|feats|grad|grads|weight|weights|params|param|optimizer|opt|lr|dim|size|"
                        r"result|results|cls|class|kind|idx|dtype|device|file|dict|list)$|^(net_?loc|network_?utils)",
                        re.I)
# a receiver whose .step() is an optimizer step (a scheduler's is not)
_OPTIM = re.compile(r"optim|^opt(_|$|\d)|scaler|engine|model|trainer|fabric|accelerator|^solver", re.I)
# names in a condition that make the branch rare: logging, evaluation, saving, first/last step
_RARE_WORDS = {"log", "logging", "print", "interval", "every", "freq", "frequency", "last", "first", "final",
               "verbose", "debug", "save", "saving", "ckpt", "checkpoint", "eval", "evaluate", "evaluation", "val",
               "valid", "validate", "validation", "warmup", "report", "display", "show", "visualize", "profile",
               "profiling", "dump", "tensorboard", "wandb"}
_COUNTER = re.compile(r"^(i|j|k|it|n|step|steps|iter|iters|iteration|idx|batch_idx|batch_i|batch_id|"
                      r"global_step|iter_num|n_iter|epoch|micro_step|completed_steps|num_updates|"
                      r"update|updates)$|_(step|idx|iter|iters|steps|num)$", re.I)
_TIMER = re.compile(r"(^|\.)(time|perf_counter|perf_counter_ns|monotonic|monotonic_ns|process_time|"
                    r"time_ns|default_timer|record|elapsed_time|tic|toc)$")
_BENCH = re.compile(r"bench|timing|timed|timeit|timer|profil|measure|latency|throughput|speed", re.I)
# per-step hooks that a framework calls (Lightning, the HF Trainer): their bodies are hot
STEP_HOOKS = {"training_step", "validation_step", "test_step", "predict_step", "training_step_end",
              "validation_step_end", "on_train_batch_start", "on_train_batch_end", "on_validation_batch_end",
              "on_before_optimizer_step", "on_after_backward", "compute_loss", "prediction_step"}
_GPU_WORDS = re.compile(r"cuda|device|gpu|\.to\(|accelerat|xla|\bmps\b|deepspeed|lightning|fabric|\.cpu\(")
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def name_of(node: ast.AST) -> str:
    """The last identifier of a callee or receiver: 'model' for self.model, 'opt' for opt."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return name_of(node.func)
    if isinstance(node, ast.Subscript):
        return name_of(node.value)
    return ""


def is_model_name(name: str) -> bool:
    """`model`, `ddp_model`, `netD`, `resnet`, `model_engine`, `self` (for `self(x)`): a module by its
    name, its head word last. Words, not substrings: `a_factor_of` is no actor; `is_module`,
    `build_model`, `_gen_model_repr` and `encoder_hidden` are not modules."""
    bare = name.lstrip("_")
    if not bare or bare[:1].isupper() or _NOT_MODEL.search(bare):
        return False
    if bare in ("self", "module"):
        return True
    words = [w for w in re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", bare).lower().split("_") if len(w) > 1]
    if not words or words[0] in _VERBS:
        return False
    head = words[-1]
    return head in _MODEL_WORDS or (head.endswith(("net", "model", "former")) and len(head) > 4)


_VERBS = {"add", "apply", "check", "validate", "compute", "run", "convert", "copy", "export", "register", "patch",
          "replace", "find", "describe", "extract", "fuse", "script", "trace", "compile", "quantize", "prune",
          "train", "evaluate", "test", "fit", "gen", "generate", "maybe", "should", "can", "use", "with", "from",
          "parse", "assert", "ensure", "configure", "attach", "detach", "dump", "visit", "process", "handle"}


def may_use_gpu(text: str) -> bool:
    """False for a file that never mentions a device: its loops run on the CPU and sync nothing."""
    return bool(_GPU_WORDS.search(text))


def is_bench_name(name: str) -> bool:
    return bool(_BENCH.search(name))


def step_kind(call: ast.Call, models: set[str], stepping: set[str] = frozenset()) -> str | None:
    """'update' for backward / an optimizer step / a same-file function that does one, 'forward'
    for a model call (`model(x)`, `self.net(x)`, `agent.get_value(obs)`), else None."""
    func = call.func
    if isinstance(func, ast.Attribute):
        if func.attr == "backward":
            return "update"
        if func.attr in ("step", "optimizer_step") and _OPTIM.search(name_of(func.value) or ""):
            return "update"
        if func.attr in stepping and isinstance(func.value, ast.Name) and func.value.id == "self":
            return "update"
        if func.attr in _HOUSEKEEPING or func.attr.startswith(("register_", "set_", "save", "load")):
            return None
        receiver = name_of(func.value)
        if receiver != "self" and (is_model_name(receiver) or receiver in models) and (call.args or call.keywords):
            return "forward"  # model.decode(memory, ys), agent.get_action_and_value(obs)
        return "forward" if is_model_name(func.attr) or func.attr in models else None
    if isinstance(func, ast.Name):
        if func.id in stepping:
            return "update"
        return "forward" if is_model_name(func.id) or func.id in models else None
    return None


def _own_level(body: list[ast.stmt], skip=None):
    """Every node of these statements except inside nested loops (their iterable or test is in),
    definitions, and the bodies of the `if`s that `skip` names."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, _DEFS):
            continue
        if isinstance(node, _LOOPS):
            stack.append(node.test if isinstance(node, ast.While) else node.iter)
            continue
        yield node
        if isinstance(node, ast.If) and skip is not None and skip(node):
            stack += [node.test, *node.orelse]   # `if epoch % 10 == 0: sample = model(z)` does not step
            continue
        stack.extend(ast.iter_child_nodes(node))


def _ends_flow(body: list[ast.stmt]) -> bool:
    last = body[-1] if body else None
    if isinstance(last, (ast.Raise, ast.Break, ast.Return)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return name_of(last.value.func) in ("exit", "_exit", "abort")
    return False


class HotMap:
    """The step loops, rare branches, hot calls and timed syncs of one module (see the module doc)."""

    def __init__(self, tree: ast.Module, path: str = ""):
        self.models = _model_names(tree)
        self.stepping = self._stepping(tree)     # names of same-file functions that call backward / step
        self.step_loops: set[int] = set()        # id(loop)
        self.update_loops: set[int] = set()      # id(loop) of the step loops that train (backward / step)
        self.off_ifs: set[int] = set()           # id(If) whose body is rare
        self.hooks: set[int] = set()             # id(def) of per-step framework hooks
        self.hot_call_nodes: list[ast.Call] = []  # every call made from hot code (for helpers in other files)
        self.step_fns: set[int] = set()          # id(def) of methods (or looped functions) that step once
        self.hot_calls: dict[int, tuple[ast.AST, int]] = {}   # id(def) -> (def, line of first hot call)
        self.call_targets: dict[int, ast.AST] = {}            # id(Call) in hot code -> the def it calls
        self.timed: set[int] = set()             # lines of synchronize() calls used for timing
        self.bench_file = is_bench_name(path)   # benchmarks/..., bench_attention.py, param_bench/...
        self.classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
        self.in_loops = {name_of(n.func) for loop in ast.walk(tree) if isinstance(loop, _LOOPS)
                         for n in ast.walk(loop) if isinstance(n, ast.Call)}
        self._steps(tree)
        self.off_tails = self._off_tails(tree)   # id(stmt) after `if not should_log(step): return`
        self._walk(tree.body, False, [_defs(tree.body)], None)
        self._timed(tree)

    def _stepping(self, tree: ast.AST) -> set[str]:
        """`def train_step(batch): ... loss.backward(); opt.step()`: a loop calling it steps."""
        return {fn.name for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                and any(isinstance(n, ast.Call) and step_kind(n, self.models) == "update" for n in _own_level(fn.body))}

    # -- step loops, bottom-up: a loop steps if its own level updates, or calls a model with no inner step loop
    def _steps(self, tree: ast.AST) -> None:
        looping_fns: set[str] = set()   # same-file functions that hold a step loop (`def train(epoch)`)

        def visit(node: ast.AST) -> bool:        # True if node is or holds a step loop
            inner = False
            for child in ast.iter_child_nodes(node):
                inner |= visit(child)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner:
                looping_fns.add(node.name)
            if not isinstance(node, _LOOPS):
                return inner and not isinstance(node, _DEFS)
            calls = [n for n in _own_level(node.body, self.rare) if isinstance(n, ast.Call)]
            kinds = {step_kind(n, self.models, self.stepping) for n in calls}
            # `for epoch: train(epoch); sample = model.decode(z)`: an epoch loop that samples once
            inner |= any(name_of(n.func) in looping_fns for n in calls)
            if "update" in kinds:
                self.update_loops.add(id(node))
            if "update" in kinds or ("forward" in kinds and not inner):
                self.step_loops.add(id(node))
                return True
            return inner
        visit(tree)
        if looping_fns:   # again, now that every function holding a step loop is known
            self.step_loops.clear()
            self.update_loops.clear()
            visit(tree)

    # -- hot regions and the same-file calls made from them
    def _walk(self, body, hot: bool, defs: list[dict], cls: dict | None) -> None:
        for stmt in body:
            self._stmt(stmt, hot and id(stmt) not in self.off_tails, defs, cls)

    def _stmt(self, node: ast.AST, hot: bool, defs: list[dict], cls: dict | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                self._expr(d, hot, defs, cls)
            is_hook = cls is not None and node.name in STEP_HOOKS
            if is_hook:
                self.hooks.add(id(node))
            elif node.name in self.stepping and (cls is not None or node.name in self.in_loops) \
                    and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
                            and _OPTIM.search(name_of(n.func.value) or "") for n in _own_level(node.body)):
                self.step_fns.add(id(node))   # `def run_step(self): ... loss.backward(); opt.step()`: runs per step
            hot_fn = is_hook or id(node) in self.step_fns
            return self._walk(node.body, hot_fn, [*defs, _defs(node.body)], cls)
        if isinstance(node, ast.ClassDef):
            return self._walk(node.body, False, defs, self._class_defs(node))
        if isinstance(node, _LOOPS):
            self._expr(node.iter if not isinstance(node, ast.While) else node.test, hot, defs, cls)
            inner = hot or id(node) in self.step_loops
            self._walk(node.body, inner, defs, cls)
            return self._walk(node.orelse, hot, defs, cls)
        if isinstance(node, ast.If):
            self._expr(node.test, hot, defs, cls)
            if self.rare(node):
                self.off_ifs.add(id(node))
            self._walk(node.body, hot and id(node) not in self.off_ifs, defs, cls)
            return self._walk(node.orelse, hot, defs, cls)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self._walk(node.body, hot, defs, cls)
            for h in node.handlers:
                self._walk(h.body, False, defs, cls)
            self._walk(node.orelse, hot, defs, cls)
            return self._walk(node.finalbody, hot, defs, cls)
        if isinstance(node, (ast.Raise, ast.Assert)):
            if isinstance(node, ast.Assert):
                self._expr(node.test, hot, defs, cls)
            return
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self._expr(item.context_expr, hot, defs, cls)
            return self._walk(node.body, hot, defs, cls)
        if isinstance(node, ast.Match):
            self._expr(node.subject, hot, defs, cls)
            for case in node.cases:
                self._walk(case.body, hot, defs, cls)
            return
        self._expr(node, hot, defs, cls)

    def _expr(self, node: ast.AST, hot: bool, defs: list[dict], cls: dict | None) -> None:
        if not hot:
            return
        for n in ast.walk(node):
            if not isinstance(n, ast.Call):
                continue
            self.hot_call_nodes.append(n)
            target = self._target(n, defs, cls)
            if isinstance(target, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.call_targets[id(n)] = target
                self.hot_calls.setdefault(id(target), (target, n.lineno))
                inner = _forwarded(target)   # `def _write_metrics(self, d): Trainer.write_metrics(d)`
                inner_target = self._target(inner, [_defs(target.body), *defs], cls) if inner else None
                if isinstance(inner_target, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.call_targets[id(inner)] = inner_target
                    self.hot_calls.setdefault(id(inner_target), (inner_target, n.lineno))

    def _target(self, n: ast.Call, defs: list[dict], cls: dict | None):
        """The same-file def a call runs: `helper(x)`, `self.helper(x)` (also inherited from a class of
        this file), `Trainer.helper(x)`; None if it is not one."""
        f = n.func
        if isinstance(f, ast.Name):
            return next((d[f.id] for d in reversed(defs) if f.id in d), None)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "self" and cls:
                return cls.get(f.attr)
            if f.value.id in self.classes:
                return self._class_defs(self.classes[f.value.id]).get(f.attr)
        return None

    def _class_defs(self, node: ast.ClassDef, seen=None) -> dict[str, ast.AST]:
        """A class's methods with those it inherits from classes of the same file (its own first)."""
        seen = seen or set()
        seen.add(node.name)
        out: dict[str, ast.AST] = {}
        for base in node.bases:
            b = self.classes.get(name_of(base))
            if b is not None and b.name not in seen:
                out.update(self._class_defs(b, seen))
        out.update(_defs(node.body))
        return out

    def rare(self, node: ast.If) -> bool:
        """The body runs on few iterations: rate-limited, first/last, a flag, a timer; and it does
        not hold the optimizer step (`if (i + 1) % accum == 0: opt.step()` is the step itself)."""
        if _ends_flow(node.body) or _lazy_init(node):
            return True
        return self._rate_limited(node.test, node.body)

    def _rate_limited(self, test: ast.AST, body: list[ast.stmt]) -> bool:
        """The test passes on few iterations (`step % N == 0`, a log/eval flag, a timer) and `body`
        does not hold the optimizer step."""
        rare = False
        for n in ast.walk(test):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
                rare = True
            elif isinstance(n, ast.Compare) and any(isinstance(op, ast.Eq) for op in n.ops) \
                    and any(_COUNTER.search(name_of(x) or "") for x in [n.left, *n.comparators]):
                rare = True
            elif isinstance(n, (ast.Name, ast.Attribute)) and _words(name_of(n)) & _RARE_WORDS:
                rare = True
            elif isinstance(n, ast.Call) and _TIMER.search(ast.unparse(n.func)):
                rare = True
        if not rare:
            return False
        for stmt in body:   # the accumulation boundary is hot, not rare
            for n in _own_level([stmt]):
                if isinstance(n, ast.Call) and step_kind(n, self.models, self.stepping) == "update":
                    return False
        return True

    def _off_tails(self, tree: ast.AST) -> set[int]:
        """Statements after a guard that leaves on most steps (`if not log_now: return`,
        `if step % N != 0: continue`): they run on the rare steps only."""
        out: set[int] = set()
        for node in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                if not isinstance(body, list):
                    continue
                for i, stmt in enumerate(body):
                    if not (isinstance(stmt, ast.If) and not stmt.orelse and stmt.body
                            and isinstance(stmt.body[-1], (ast.Return, ast.Continue))):
                        continue
                    t = stmt.test
                    inner = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else (
                        t if isinstance(t, ast.Compare) and any(isinstance(o, ast.NotEq) for o in t.ops) else None)
                    if inner is not None and self._rate_limited(inner, body[i + 1:]):
                        out |= {id(s) for s in body[i + 1:]}
                        break
        return out

    # -- synchronize() next to a timer read, or in a loop that reads one: measurement
    def _timed(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if isinstance(node, _LOOPS):
                own = [n for n in _own_level(node.body) if isinstance(n, ast.Call)]
                if any(_TIMER.search(_dotted(n.func)) for n in own):
                    self.timed |= {n.lineno for n in own if _dotted(n.func).endswith("synchronize")}
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None)
                if not isinstance(body, list):
                    continue
                for i, stmt in enumerate(body):
                    if not _calls(stmt, lambda s: s.endswith("synchronize")):
                        continue
                    near = body[max(0, i - 1):i] + body[i + 1:i + 2]
                    if any(_calls(s, _TIMER.search) for s in near):
                        self.timed.add(stmt.lineno)


def _forwarded(fn: ast.AST) -> ast.Call | None:
    """The call a one-statement wrapper hands its work to (`return helper(x)`), else None."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], (ast.Expr, ast.Return)) and isinstance(body[0].value, ast.Call):
        return body[0].value
    return None


def _lazy_init(node: ast.If) -> bool:
    """`if preds is None: preds = ...`: runs on the first iteration only."""
    t = node.test
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Is)
            and isinstance(t.comparators[0], ast.Constant) and t.comparators[0].value is None):
        return False
    name = ast.unparse(t.left)
    return any(isinstance(s, ast.Assign) and any(ast.unparse(x) == name for x in s.targets) for s in node.body)


def _words(name: str) -> set[str]:
    """'logInterval' / 'log_interval' -> {'log', 'interval'}."""
    return set(re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower().split("_"))


def _calls(stmt: ast.AST, pred) -> bool:
    if isinstance(stmt, (*_DEFS, *_LOOPS, ast.If)):
        return False
    return any(isinstance(n, ast.Call) and pred(_dotted(n.func)) for n in ast.walk(stmt))


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - a node unparse cannot print is no timer
        return ""


def _defs(body: list[ast.stmt]) -> dict[str, ast.AST]:
    return {s.name: s for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}


_MODEL_MAKERS = re.compile(r"(^|\.)(from_pretrained|create_model|build_model|get_model|load_model|"
                           r"DistributedDataParallel|DDP|DataParallel|FSDP|FullyShardedDataParallel)$|^torch\.compile$|"
                           r"(^|\.)(models|nn)\.[A-Za-z_]+$|^torchvision\.models\.")


def _model_names(tree: ast.AST) -> set[str]:
    """Names assigned a module anywhere in the file: `net = resnet50()`, `self.m = nn.Linear(...)`."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = _dotted(node.value.func)
            if _MODEL_MAKERS.search(made) and not re.search(r"(^|\.)nn\.(functional|init|utils)|Loss$", made):
                for t in node.targets:
                    if isinstance(t, (ast.Name, ast.Attribute)):
                        out.add(name_of(t))
    return out


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
