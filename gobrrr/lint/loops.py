"""Which loops step, recognised by what they do, not by what their variables are called (the rules here;
steploops.step_loops applies them to a file's loops, bottom-up).

A loop steps if its own level (its ifs, withs and trys; not its inner loops, not its rare
branches) does one of:

    update     `.backward()`; `.step()` of an optimizer (named like one, or assigned one:
               `q_opt = optim.Adam(...)`, `create_optimizer(...)`); a function of the project
               that does either, directly or through its own calls (`train_step(batch)`,
               `agent.learn(batch)`, `self.train_actor_critic(mb)` -> calc_gradients -> backward)
    forward    a call of a module: named like one (`model`, `netD`), or assigned one
               (`q = QNetwork(envs).to(device)` where QNetwork is a project nn.Module,
               `m = resnet50()`, `m = Foo(...).cuda()`, `copy.deepcopy(model)`); a function
               of the project that calls one (`self.get_action_values(obs)`, `policy.act(obs)`)
    data       a batch taken: the loop iterates a loader (`for x, y in train_loader`, a DataLoader, `dataloaders["train"]`)
               or calls `next(it)` in a `while` loop, or `next(train_iter)` (named for data) in any loop
    env        an environment stepped: `.step(action)` on an env-named receiver, or a `step` /
               `env_step` call whose result unpacks into four or five names (obs, reward, done, info)

and holds no inner step loop itself unless it updates, takes a batch or steps an environment (an
epoch loop that only holds a step loop is not one; a loop around gradient-accumulation micro-batches
that steps the optimizer is, and so is a loop over batches or env steps that holds an update loop).
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache

_MODEL_WORDS = {"model", "models", "net", "engine", "encoder", "decoder", "generator", "discriminator", "policy",
                "actor", "critic", "agent", "classifier", "backbone", "teacher", "student", "transformer", "gpt",
                "llm", "bert", "vae", "unet", "ddp", "fsdp", "ema", "lm", "seq2seq", "autoencoder", "detector",
                "network", "qnet", "denoiser"}
# methods of a model that do not compute on a batch
HOUSEKEEPING = {"train", "eval", "zero_grad", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
                "named_modules", "children", "named_children", "state_dict", "load_state_dict", "to", "cuda", "cpu",
                "half", "float", "double", "bfloat16", "apply", "requires_grad_", "register_buffer",
                "register_parameter", "register_forward_hook", "register_forward_pre_hook",
                "register_full_backward_hook", "save_pretrained", "init_hidden", "init_weights",
                "get_input_embeddings", "resize_token_embeddings", "gradient_checkpointing_enable", "tie_weights",
                "share_memory", "add_module", "update", "set_epoch", "fp16_enabled", "no_sync", "save_checkpoint",
                "load_checkpoint", "get_submodule", "get_parameter", "set_attn_processor", "log", "print", "get",
                "backward", "step", "clip_grad_norm_", "unwrap_model", "prepare", "gather", "reduce", "append",
                "extend", "insert"}   # `pred_layers.append(nn.Linear(d, h))`: a list (or ModuleList) built, not run
_NOT_MODEL = re.compile(r"^(get|build|create|load|make|init|save|setup|prepare|wrap|unwrap|to|is|has|"
                        r"print|log|set|update|reset|freeze|count|num|n)_|_(fn|kwargs|args|cfg|config|name|path|"
                        r"type|dir|id|ids|hidden|output|outputs|out|outs|state|states|input|inputs|mask|loss|logits|"
                        r"emb|embeds|features|feats|grad|grads|weight|weights|params|param|optimizer|opt|lr|dim|size|"
                        r"result|results|cls|class|kind|idx|dtype|device|file|dict|list)$|^(net_?loc|network_?utils)",
                        re.I)
_VERBS = {"add", "apply", "check", "validate", "compute", "run", "convert", "copy", "export", "register", "patch",
          "replace", "find", "describe", "extract", "fuse", "script", "trace", "compile", "quantize", "prune",
          "train", "evaluate", "test", "fit", "gen", "generate", "maybe", "should", "can", "use", "with", "from",
          "parse", "assert", "ensure", "configure", "attach", "detach", "dump", "visit", "process", "handle"}
# a receiver whose .step() is an optimizer step (a scheduler's is not)
OPTIM = re.compile(r"optim|^opt(_|$|\d)|scaler|engine|model|trainer|fabric|accelerator|^solver", re.I)
_OPTIM_MAKERS = re.compile(r"(^|\.)optim\.[A-Z]\w*$|Optimi[sz]er$|(^|\.)(Adam|AdamW|SGD|RMSprop|Adagrad|Adadelta|"
                           r"Adamax|NAdam|RAdam|LBFGS|Lion|LAMB|Lamb|Adafactor|FusedAdam|DeepSpeedCPUAdam)$|"
                           r"(create|build|get|make|configure)_optimizers?$")
_MODEL_MAKERS = re.compile(r"(^|\.)(from_pretrained|create_model|build_model|get_model|load_model|"
                           r"DistributedDataParallel|DDP|DataParallel|FSDP|FullyShardedDataParallel)$|^torch\.compile$|"
                           r"(^|\.)(models|nn)\.[A-Za-z_]+$|^torchvision\.models\.|[A-Z]\w*Rasterizer$")   # 3DGS, pytorch3d
# what `from_pretrained` also loads beside models: tokenizers, processors, configs (host objects, never run on a batch)
_NOT_A_MODEL = re.compile(r"(Tokenizer|Processor|FeatureExtractor|Config|Preprocessor)(Fast)?\.from_pretrained$")
# callees that take a model without running it on a batch
_NOT_RUNNING = re.compile(r"^_*(save|load|log|print|set|build|create|get|init|copy|deepcopy|wrap|unwrap|prepare|"
                          r"register|count|summary|summarize|freeze|unfreeze|to|move|apply|isinstance|hasattr|"
                          r"getattr|setattr|len|str|repr|id|type|update|sync|broadcast|convert|export|compile|"
                          r"clip|zero|parameters|named|state|describe|check|watch|track)", re.I)
_TENSOR_WRAPS = re.compile(r"^(Variable|Parameter)$|Tensor$")   # Variable(torch.rand(n)).cuda(): a tensor, no module
CONFIG_NAME = re.compile(r"(^|_)(cfg|config|conf|args|opt|opts|hparams|params|settings)$", re.I)   # args.d_model
LOADER_NAME = re.compile(r"loader|dataloader|_dl$|^dl$|batches$", re.I)
_STEPS_WITH = {"optimize", "step", "apply_gradients", "update", "optimizer_step", "take_step"}
_ENV = re.compile(r"(^|_)(env|envs|environment|environments|venv|vec_?env|sim|simulator|game)(_|$|\d)", re.I)
_ENV_COUNT = re.compile(r"^(envs|env_nums?|num_envs|n_envs|nenvs|env_num|environments|num_env)$", re.I)
_ENV_STEP = re.compile(r"^(step|env_step|step_env|step_envs|envs_step)$")
_LAYERS = re.compile(r"(^|_)(layers|blocks|h|modules)$")   # a model's blocks (`model.layers[i]`, AutoAWQ's modules)
# names too common to take a call as a forward because one project def of that name runs a model
COMMON_METHODS = {"forward", "step", "update", "run", "call", "apply", "get", "sample", "predict", "compute", "process",
           "evaluate", "eval", "train", "test", "generate", "transform", "encode", "decode", "build", "log"}
LOOPS = (ast.For, ast.AsyncFor, ast.While)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


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


def one_block(node: ast.AST) -> bool:
    """`layers[i]`, `model.model.layers[i]`: one block of a model's list of blocks."""
    return isinstance(node, ast.Subscript) and bool(_LAYERS.search(name_of(node.value) or ""))


def dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()." + ".".join(reversed(parts)) if parts else dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):   # events[i].elapsed_time -> events[].elapsed_time
        return dotted(node.value) + "[]" + ("." + ".".join(reversed(parts)) if parts else "")
    return ""


@lru_cache(maxsize=65536)
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
    return head in _MODEL_WORDS or (head.endswith(("net", "model", "former")) and len(head) > 4) \
        or (len(head) == 4 and head.endswith("net") and head != "inet")   # nnet, gnet; not an inet address


def is_env_name(name: str) -> bool:
    return bool(_ENV.search(name))


def own_level(body: list[ast.stmt], skip=None):
    """Every node of these statements except inside nested loops (their iterable or test is in),
    definitions, and the bodies of the `if`s that `skip` names. A def made here and called or handed to a call
    here (`def train_step(): ...` in a loop body, then `gpu_timer(train_step)`: I-JEPA) runs at this level:
    its own level comes last (not one only returned: `def custom_forward(*inputs)` for a checkpoint)."""
    stack, defs, names = list(body), [], set()
    while stack:
        node = stack.pop()
        if isinstance(node, DEFS):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.append(node)
            continue
        if isinstance(node, LOOPS):
            stack.append(node.test if isinstance(node, ast.While) else node.iter)
            continue
        if isinstance(node, ast.Call):   # called, or handed to a call: not a def only returned (a checkpoint wrapper's)
            names.update(a.id for a in (node.func, *node.args) if isinstance(a, ast.Name))
        yield node
        if isinstance(node, ast.If) and skip is not None and skip(node):
            stack += [node.test, *node.orelse]   # `if epoch % 10 == 0: sample = model(z)` does not step
            continue
        stack.extend(ast.iter_child_nodes(node))
    for d in defs:
        if d.name in names:
            yield from own_level(d.body, skip)


def local_def(scope: ast.AST, name: str, cache: dict | None = None) -> ast.AST | None:
    """The def `name` made directly in `scope`'s body, else in its loops, branches, withs and trys
    (`for batch in loader: def train_step(): ...`), not inside other defs. `cache`: the file's
    (project.per_file), where each scope's table of them is kept."""
    table = cache.setdefault("local_defs", {}) if cache is not None else {}
    if id(scope) not in table:
        body, fns = getattr(scope, "body", []), (ast.FunctionDef, ast.AsyncFunctionDef)
        found = {d.name: d for d in reversed(body) if isinstance(d, fns)} if isinstance(body, list) else {}
        stack = [st for st in body if not isinstance(st, DEFS)] if isinstance(body, list) else []
        while stack:
            st = stack.pop()
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(st, field, None) or ():
                    if isinstance(child, fns):
                        found.setdefault(child.name, child)
                    elif isinstance(child, ast.AST) and not isinstance(child, DEFS):
                        stack.append(child)
        table[id(scope)] = (scope, found)
    return table[id(scope)][1].get(name)


def partial_target(node: ast.AST) -> ast.AST | None:
    """The function a `functools.partial(f, ...)` call binds (f), or None for any other node."""
    if isinstance(node, ast.Call) and name_of(node.func) == "partial" and node.args:
        return node.args[0]
    return None


def collate_defs(nodes: list[ast.AST]) -> set[str]:
    """The names of defs handed to a DataLoader as `collate_fn`, directly or through `functools.partial`
    (`collate = partial(custom_collate_fn, device=device)`, then `collate_fn=collate`): the loader calls
    them once per batch, in the main process when it has no workers, which is the only way one can move
    the batch to the GPU (a forked worker cannot touch CUDA)."""
    partials: dict[str, str] = {}
    for n in nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and (bound := partial_target(n.value)) is not None:
            partials[n.targets[0].id] = name_of(bound)
    out = set()
    for n in nodes:
        if isinstance(n, ast.keyword) and n.arg == "collate_fn":
            v = partial_target(n.value) or n.value
            name = name_of(v) if isinstance(v, (ast.Name, ast.Attribute)) else ""
            out.add(partials.get(name, name))
    return out - {""}


class Facts:
    """What a file (and the project around it) says about names: modules, optimizers, and the
    functions that update (by name, across the project)."""

    def __init__(self, nodes: list[ast.AST], module_classes=frozenset(), stepping=frozenset()):
        self.models: set[str] = set()
        self.evaled: set[str] = set()   # names put in eval mode (`rnn.eval()`): modules when called, nowhere else
        self.optimizers: set[str] = set()
        self.stepping: set[str] = set(stepping)
        self.forwarding: set[str] = set()   # defs (by name, across the project) that call a module
        self.defined: frozenset[str] = frozenset()   # every def name of the project (set by the driver)
        self.looping: set[str] = set()      # defs (by name, across the project) that hold a step loop
        self.every_step: set[str] = set()   # options whose project default is 1 (`logging_steps: int = 1`)
        self.aliases: dict[str, set[str]] = {}   # sample_fn = d.p_sample_loop if c else d.ddim_sample_loop
        self.instances: dict[str, str] = {}   # trainer = TD3_BC(**kwargs): name -> the class it was made from
        self.updaters: frozenset[tuple[str, str]] = frozenset()   # (class, method) whose own body updates
        self.collates: frozenset[str] = frozenset()   # defs a DataLoader calls per batch (collate_defs, project-wide)
        self.env_stepping: frozenset[str] = frozenset()   # defs that step an environment (env_stepping_defs)
        for node in nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Attribute, ast.IfExp)) \
                    and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = node.value
                options = [v.body, v.orelse] if isinstance(v, ast.IfExp) else [v]
                if all(isinstance(o, ast.Attribute) for o in options):
                    self.aliases.setdefault(node.targets[0].id, set()).update(o.attr for o in options)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) \
                    and isinstance(node.value.value, ast.Dict) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):   # sample_fn = {"heun": sample_heun, ...}[name]
                self.aliases.setdefault(node.targets[0].id, set()).update(
                    name_of(v) for v in node.value.value.values if isinstance(v, (ast.Name, ast.Attribute)))
            if isinstance(node, ast.Expr) and isinstance(c := node.value, ast.Call) and not (c.args or c.keywords) \
                    and isinstance(f := c.func, ast.Attribute) and f.attr == "eval" and isinstance(v := f.value, ast.Name) \
                    and v.id != "self":
                self.evaled.add(v.id)   # `rnn.eval()`: a module (GraphRNN's handed `rnn` and `output`), not `self.eval()`
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                made = name_of(node.value.func)
                if made[:1].isupper() and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.instances[node.targets[0].id] = made
                kind = self._made(node.value, module_classes)
                if kind:
                    for t in node.targets:
                        if isinstance(t, (ast.Name, ast.Attribute)):
                            (self.models if kind == "model" else self.optimizers).add(name_of(t))

    @staticmethod
    def _made(value: ast.Call, module_classes) -> str | None:
        call = value
        while isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda", "train", "eval") \
                and isinstance(call.func.value, ast.Call):
            call = call.func.value   # QNetwork(envs).to(device)
        made = dotted(call.func)
        last = made.rsplit(".", 1)[-1]
        if made.endswith("deepcopy"):   # ema = copy.deepcopy(model); not a copy of a dict
            a = call.args[0] if call.args else None
            return "model" if isinstance(a, (ast.Name, ast.Attribute)) and is_model_name(name_of(a)) else None
        if _OPTIM_MAKERS.search(made) and not made.startswith("torch.optim.lr_scheduler"):
            return "optimizer"
        if _NOT_A_MODEL.search(made):
            return None   # AutoTokenizer.from_pretrained(path): a tokenizer (its encode makes host ids), not a module
        if _MODEL_MAKERS.search(made) and not re.search(r"(^|\.)nn\.(functional|init|utils)|Loss$", made):
            return "model"
        if last in module_classes:
            return "model"
        if call is not value and last[:1].isupper() and not made.startswith("torch") and not _TENSOR_WRAPS.search(last):
            return "model"   # Foo(...).to(device): a module moved to the device; not `Variable(torch.rand(n)).cuda()`
        return None

    def is_optimizer(self, node: ast.AST) -> bool:
        n = name_of(node) or ""
        return bool(OPTIM.search(n)) or n in self.optimizers

    def step_kind(self, call: ast.Call, strict: bool = False) -> str | None:
        """'update' for backward / an optimizer step / a function that does one, 'forward' for a
        module's call (`model(x)`, `self.net(x)`, `agent.get_value(obs)`), 'env' for an
        environment's step, else None. `strict`: only direct evidence (a module called, this object's
        own defs that update or run one), for the project-wide closures."""
        if strict:
            return self._strict_kind(call)
        func = call.func
        if name_of(func) == "Thread":   # Thread(target=model.generate, kwargs=...).start(): streaming generation
            target = next((k.value for k in call.keywords if k.arg == "target"), None)
            if isinstance(target, ast.Attribute) and target.attr == "generate" \
                    and (is_model_name(name_of(target.value)) or name_of(target.value) in self.models):
                return "forward"
        if isinstance(func, ast.Attribute):
            if func.attr == "backward" or _autograd_grad(func):
                return "update"
            if func.attr in ("step", "optimizer_step"):
                if self.is_optimizer(func.value):
                    return "update"
                if call.args and is_env_name(name_of(func.value)):
                    return "env"
                if func.attr == "step" and any(is_env_name(name_of(a)) for a in call.args[:1]):
                    return "env"   # algo.step(self.env, state, t): the algorithm acts and steps the env it is handed
            receiver = name_of(func.value)
            args = bool(call.args or call.keywords)
            if func.attr in self.stepping and func.attr != "step" and (
                    func.attr not in HOUSEKEEPING or (args and is_model_name(receiver))
                    or (args and receiver == "self" and func.attr not in ("train", "eval"))):
                return "update"   # agent.learn(batch), policy.train(buffer, 256), self.update(i): a def that updates
            if args and (self.instances.get(receiver), func.attr) in self.updaters:
                return "update"   # trainer.train(batch), algo.update(batch): the project class's method updates
            if func.attr == "eval" and func.attr in self.forwarding and any(not isinstance(a, ast.Constant) for a in call.args):
                return "forward"  # engine.eval(x, y): a trainer's evaluation step (Graph WaveNet), not module.eval()
            if func.attr in HOUSEKEEPING or func.attr.startswith(("register_", "set_", "save", "load")):
                return None
            if receiver != "self" and (is_model_name(receiver) or receiver in self.models) \
                    and (call.args or call.keywords):
                return "forward"  # model.decode(memory, ys), agent.get_action_and_value(obs)
            if (is_model_name(func.attr) or func.attr in self.models) and (call.args or call.keywords):
                return "forward"
            if func.attr in self.forwarding and args and (func.attr not in COMMON_METHODS or receiver == "self"):
                return "forward"  # self.get_action_values(obs): a project def that runs the model
            return "forward" if self._runs_model(call, func.attr) else None
        if isinstance(func, ast.Name):
            if func.id in self.stepping:
                return "update"
            if (is_model_name(func.id) or func.id in self.models or func.id in self.evaled) and (call.args or call.keywords):
                return "forward"   # a module is called on a batch; `item_generator()` is not one
            if func.id in self.forwarding and (call.args or call.keywords) and func.id not in COMMON_METHODS:
                return "forward"
            return "forward" if self._runs_model(call, func.id) else None
        if isinstance(func, ast.Call) and name_of(func.func)[:1].isupper() and (call.args or call.keywords) \
                and "transform" not in dotted(func.func).lower():   # not `transforms.ToTensor()(img)`: a host transform
            return "forward"   # RoIAlignFunction(7, 7, sc)(bl_in, rois): a module (or Function) made and run on its input
        return None

    def _strict_kind(self, call: ast.Call) -> str | None:
        func, args = call.func, bool(call.args or call.keywords)
        if isinstance(func, ast.Attribute):
            if func.attr == "backward" or _autograd_grad(func) \
                    or func.attr in ("step", "optimizer_step") and self.is_optimizer(func.value):
                return "update"
            if func.attr in _STEPS_WITH and call.args and self.is_optimizer(call.args[0]):
                return "update"   # self.mp_trainer.optimize(self.opt), scaler.step(optimizer): it steps the optimizer
            own = isinstance(func.value, ast.Name) and func.value.id == "self"
            if own and func.attr in self.stepping and func.attr not in ("train", "eval", "step") \
                    and (args or func.attr not in HOUSEKEEPING):
                return "update"   # self.calc_gradients(batch), self.update(step)
            receiver = name_of(func.value)
            if args and func.attr not in HOUSEKEEPING and (
                    self._module(func.attr) or func.attr in self.forwarding and (own or is_model_name(receiver))
                    or func.attr in ("forward", "generate") and (is_model_name(receiver) or receiver in self.models)):
                return "forward"  # self.model(x), self.actor(obs), self.get_action_values(obs), self.score_model.score(x)
            return None
        if isinstance(func, ast.Name) and args and (self._module(func.id) or func.id in self.forwarding):
            return "forward"   # a plain function that updates may run a whole training: not followed here
        return None

    def _module(self, name: str) -> bool:
        """A module by its name or assignment, and not a def of the project (`self._runs_model(...)`,
        `ddp(model, ...)` are functions)."""
        return (is_model_name(name) or name in self.models) and name not in self.defined

    def _runs_model(self, call: ast.Call, callee: str) -> bool:
        """`self.p_sample(model, x, t)`, `criterion(model=net, ...)`: a call handed the model runs it."""
        if _NOT_RUNNING.search(callee) or isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Constant):
            return False   # '{}_dm{}'.format(args.data, args.d_model): a string's method, and `args.d_model` a setting
        for a in [*call.args, *(k.value for k in call.keywords)]:
            if isinstance(a, (ast.Name, ast.Attribute)) and (is_model_name(name_of(a)) or name_of(a) in self.models) \
                    and not (isinstance(a, ast.Attribute) and CONFIG_NAME.search(name_of(a.value))):
                return name_of(a) not in ("self", "module")
        return False


def _autograd_grad(func: ast.Attribute) -> bool:
    """`torch.autograd.grad(loss, params)`: the gradients of a hand-written update (TRPO's natural gradient, MAML's
    adaptation step), as a backward is."""
    return func.attr == "grad" and name_of(func.value) == "autograd"


def env_steps(node: ast.AST) -> bool:
    """`obs, r, done, info = env.step(a)` (or `self.env_step(a)`): a step call whose result unpacks
    into 4-5 names, or 3 from a receiver named for an environment (`obs, reward, done = env.step(a)`, a wrapper
    that drops the info: PlaNet's and Dreamer's `Env`)."""
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, (ast.Attribute, ast.Name)) and _ENV_STEP.match(name_of(node.value.func))
            and node.value.args and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple)):
        return False
    n = len(node.targets[0].elts)
    return n in (4, 5) or n == 3 and isinstance(node.value.func, ast.Attribute) \
        and is_env_name(name_of(node.value.func.value))


def env_stepping_defs(nodes: list[ast.AST]) -> set[str]:
    """The names of defs that step an environment at their own level (`def conduct_action(self, action):
    self.next_state, self.reward, self.done, _ = self.environment.step(action)`): a loop calling one steps the
    environment once per iteration. Names every class has (`step`, `run`) are left out: an env wrapper's
    `def step` would make every `opt.step()` loop an environment loop; so is `reset` (an Atari wrapper's no-op
    reset steps its env, but `env.reset()` starts an episode, once per episode loop)."""
    return {n.name for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.name not in COMMON_METHODS | HOUSEKEEPING | {"reset"} and any(env_steps(s) for s in own_level(n.body))}


def _fors_just_inside(loop: ast.AST):
    """The `for` loops just inside this one (through with / if / try), not deeper."""
    stack = list(loop.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.For):
            yield n
        elif isinstance(n, ast.stmt) and not isinstance(n, (*LOOPS, *DEFS)):
            stack += [c for c in ast.iter_child_nodes(n) if isinstance(c, ast.stmt)]


def steps_each_env(loop: ast.AST) -> bool:
    """`while not dones.all(): ... for i in range(env_nums): obs, r, done, info = envs[i].step(a[i])`: a loop just
    inside goes over the environments and steps each one; the loop around it is the step (one move of them all)."""
    return any(any(isinstance(x, (ast.Name, ast.Attribute)) and _ENV_COUNT.search(name_of(x)) for x in ast.walk(f.iter))
               and any(env_steps(s) for s in own_level(f.body)) for f in _fors_just_inside(loop))


def sends_step(loop: ast.AST) -> bool:
    """`worker.child.send(("step", action))` in a loop over the workers just inside: environments stepped
    in worker processes through pipes (recurrent-ppo, SubprocVecEnv-style code); the loop around it is
    the step, not the loop over the workers."""
    inner = [n for f in _fors_just_inside(loop) for n in own_level(f.body)]
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "send" and n.args
               and isinstance(n.args[0], ast.Tuple) and n.args[0].elts and isinstance(n.args[0].elts[0], ast.Constant)
               and n.args[0].elts[0].value == "step" for n in inner)


def stepping_defs(nodes: list[ast.AST], facts: Facts, strict: bool = False) -> set[str]:
    """Names of the defs among `nodes` whose own level updates (backward / optimizer step, or a call
    of a def that does)."""
    marks = {n.lineno for n in nodes if isinstance(n, ast.Attribute) and (
        n.attr in ("backward", "step", "optimizer_step") or n.attr in facts.stepping)
             or isinstance(n, ast.Name) and n.id in facts.stepping}
    if not marks:
        return set()
    out = set()
    for fn in nodes:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and any(fn.lineno <= m <= (fn.end_lineno or fn.lineno) for m in marks) and any(
                isinstance(n, ast.Call) and facts.step_kind(n, strict) == "update" for n in own_level(fn.body)) \
                and not (strict and holds_updating_loop(fn, facts)):
            out.add(fn.name)
    return out


def updating_methods(nodes: list[ast.AST], facts: Facts) -> set[tuple[str, str]]:
    """(class, method) of the methods among `nodes` whose own level updates (an optimizer's step, a
    backward): `TD3_BC.train(self, batch)`, `SAC.update(self, batch)`, whose common names (`train`,
    `update`) say nothing on their own; not one whose loop runs a whole training."""
    out = set()
    for cls in nodes:
        if isinstance(cls, ast.ClassDef):
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in HOUSEKEEPING \
                        and any(isinstance(n, ast.Call) and facts.step_kind(n, True) == "update" for n in own_level(fn.body)) \
                        and not holds_updating_loop(fn, facts):
                    out.add((cls.name, fn.name))
    return out


def holds_updating_loop(fn: ast.AST, facts: Facts) -> bool:
    """A def with a loop that updates (a trainer): calling it runs many steps, not one."""
    for node in ast.walk(fn):
        if isinstance(node, LOOPS) and any(isinstance(n, ast.Call) and facts.step_kind(n, True) == "update"
                                           for n in own_level(node.body)):
            return True
    return False


def forwarding_defs(nodes: list[ast.AST], facts: Facts, calls: dict[str, set[str]] | None = None) -> set[str]:
    """Names of the defs among `nodes` whose own level runs a module on an input (`res =
    self.model(input_dict)`, or a call of a def that does), outside loops of their own. `calls` (def
    name -> the names it calls) skips the defs that call nothing module-like."""
    out = set()
    for fn in nodes:
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not fn.name.startswith("__") \
                and fn.name not in facts.forwarding and (fn.name not in HOUSEKEEPING or _own_eval(fn)) \
                and (calls is None or any(is_model_name(n) or n in facts.models or n in facts.forwarding
                                          or n in ("forward", "generate") for n in calls.get(fn.name, ()))) \
                and any(isinstance(n, ast.Call) and facts.step_kind(n, True) == "forward" for n in own_level(fn.body)):
            out.add(fn.name)
    return out


def _own_eval(fn: ast.AST) -> bool:
    """`def eval(self, input, real_val)`: a trainer's evaluation step, not torch's `Module.eval(self)`."""
    return fn.name == "eval" and len([a for a in fn.args.args if a.arg != "self"]) >= 1


__all__ = ["Facts", "updating_methods", "stepping_defs", "forwarding_defs", "holds_updating_loop", "own_level", "name_of",
           "one_block", "dotted", "is_model_name", "is_env_name", "env_steps", "sends_step",
           "steps_each_env", "HOUSEKEEPING", "OPTIM", "LOADER_NAME", "LOOPS", "DEFS", "COMMON_METHODS"]
