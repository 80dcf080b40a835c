"""The sync detective, statically: AST rules for the anti-patterns of the host-device model.

    gobrrr lint train.py src/ [--format text|json] [--select GB002,GB004] [--all] [--tests]
                              [--exclude GLOB] [--assume-gpu]

GB001  tensor built on the host then moved (`torch.randn(...).to(dev)`)       -> pass device=
GB002  `.item()/.cpu()/.tolist()/.numpy()`, `float/int/bool(t)` in a loop     -> keep on device, read once
       (also a device scalar as a count, size, slice bound or index: `topk(k=ks[i])`, `x[:, :h]`;
       torch.equal/allclose; the builtin max/min of tensors)
GB003  printing or formatting a tensor in a loop                             -> log every N steps
GB004  `torch.cuda.synchronize()` / stream or event synchronize, empty_cache() -> order with events
GB005  `non_blocking=True` copy from pageable (unpinned) host memory         -> pin the source
GB006  `DataLoader` without `pin_memory=True` whose batches go to CUDA        -> pin_memory=True
GB007  a tensor as a Python condition in a loop (`if t > 0:`, `while t:`)    -> torch.where on device
GB008  data-dependent shapes in a loop (nonzero, x[mask], x[mask] = t, unique, bincount) -> fixed-shape ops
GB009  blocking `.to(device)` / `.cuda()` of every batch in the step loop       -> pin + non_blocking, Prefetcher
GB010  host data copied per step (`torch.tensor(x, device=dev)`, `host_t.to(dev)`) -> build it on the device once
GB011  a device tensor indexed by host indices (numpy, CPU arange, range, list) -> indices on the device
GB012  `dist.barrier()` / `accelerator.wait_for_everyone()` every step        -> drop it from the step
GB013  a sync inside torch: distributions with validation, torch.normal(m, t), Normal.sample()
                                                                             -> validate_args=False, rsample
GB014  a CPU environment stepped per iteration (once per loop)               -> a GPU env or batched envs

Few false positives by design (a finding a user must dismiss costs more than a missed one): a
rule needs evidence that the value is a tensor (kinds), and by default only code that runs
every step is reported: step loops, recognised by what they do (loops), per-step hooks, a
module's forward and an optimizer's step (hot), loops that sync on each element, and the
project functions they call, across files and a few calls deep (graph: the project is
indexed once per run; a finding reached through calls shows the chain
`train.py:120 -> utils.py:44 -> here`). Rate-limited, error and timing code is left alone;
`--all` adds the findings in other loops. Files that never name a device are taken as CPU-only
and skipped (said in the summary; `--assume-gpu` checks them). Files under tests/ and test_*.py
are skipped when a directory is walked (`--tests` keeps them); `--exclude GLOB` skips more.
Suppress one line with `# gobrrr: ignore[GB002]` (or `# gobrrr: ignore` for every rule); a line
carrying the project's `# sync: why` comment is a deliberate sync, exempt from the sync rules.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from pathlib import Path

from gobrrr.lint.calls import host_attrs
from gobrrr.lint.env import absorb_round_trips
from gobrrr.lint.files import inside_project, python_files, read_text
from gobrrr.lint.findings import RULES, SYNC_RULES, TITLES, Finding
from gobrrr.lint.graph import Project
from gobrrr.lint.hot import HotMap, may_use_gpu
from gobrrr.lint.inside import validation_off_globally
from gobrrr.lint.loops import (
    HOUSEKEEPING,
    Facts,
    collate_defs,
    env_stepping_defs,
    forwarding_defs,
    holds_updating_loop,
    stepping_defs,
    updating_methods,
)
from gobrrr.lint.placed import gpu_reach, hands_the_device, imported_files, moved_classes, own_program, runs_default_cuda
from gobrrr.lint.rates import defaults_of_one, switches
from gobrrr.lint.rewalk import fewer_constants, retyping, types_more
from gobrrr.lint.rules import Checker
from gobrrr.lint.source import Source, parse
from gobrrr.lint.steploops import looping_closure

__all__ = ["RULES", "Finding", "lint_source", "lint_paths", "lint_file", "check_sources", "main"]

_IGNORE = re.compile(r"#\s*gobrrr:\s*ignore(?:\[([A-Za-z0-9_,\s]+)\])?")
_SYNC_NOTE = re.compile(r"#\s*sync:")
_COMPUTES = re.compile(r"\btorch\.(?!utils\.tensorboard)\w|\.backward\(")   # torch compute, not only its SummaryWriter
# torch.set_default_tensor_type("torch.cuda.FloatTensor"): torch's factories make CUDA tensors everywhere
_ANY_NOTE = re.compile(r"#\s*(gobrrr:|sync:)")


def _suppressions(text: str) -> dict[int, set[str]]:
    """line -> rule ids suppressed there ('*' for all), read from real comments only."""
    out: dict[int, set[str]] = {}
    if not _ANY_NOTE.search(text):
        return out   # tokenizing is the slow part: only when a note may be there
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type != tokenize.COMMENT:
                continue
            m = _IGNORE.search(tok.string)
            if m:
                ids = {s.strip().upper() for s in m.group(1).split(",")} if m.group(1) else {"*"}
                out.setdefault(tok.start[0], set()).update(ids)
            if _SYNC_NOTE.search(tok.string):
                out.setdefault(tok.start[0], set()).update(SYNC_RULES)
    except (tokenize.TokenError, SyntaxError):
        pass
    return out


# ------------------------------------------------------------------------------------------- API

def check_sources(sources: list[Source], assume_gpu: bool = False,
                  errors: list[str] | None = None) -> tuple[list[Finding], list[Source]]:
    """Every finding (hot or not) of these parsed files, checked as one project, and the files
    skipped as CPU-only (they never name a device; `assume_gpu` checks them). The project is
    indexed once; calls from hot code are followed breadth-first, each function walked once."""
    project = Project(sources)
    off, on = set(), set()
    for s in sources:
        o, x = switches(s.nodes)
        off, on = off | o, on | x
    flags = {"no_validation": any(validation_off_globally(s, on - off) for s in sources)}
    facts = {id(s): Facts(s.nodes, project.module_classes) for s in sources}
    stepping, forwarding = _closures(sources, facts)
    collates = frozenset(c for s in sources if "collate_fn" in s.text for c in collate_defs(s.nodes))
    env_stepping = frozenset(n for s in sources if "step(" in s.text for n in env_stepping_defs(s.nodes))
    updaters = frozenset(m for s in sources if "class " in s.text for m in updating_methods(s.nodes, facts[id(s)]))
    ones, others, own = set(), set(), {}
    for s in sources:
        o, x = defaults_of_one(s.nodes)
        ones, others, own[id(s)] = ones | o, others | x, (o, x)
    every_step = ones - others   # `completed_steps % args.logging_steps` with `logging_steps: int = 1`
    looping: set[str] = set()
    called: dict[str, set[str]] = {}
    hotmaps = {}
    inside = dict(zip(map(id, sources), inside_project([s.path for s in sources])))
    for s in sources:
        f = facts[id(s)]
        o, x = own[id(s)]   # a script's own parser decides for its own branches (`--log_interval` 1 here, 100 there)
        f.stepping, f.forwarding, f.updaters = set(stepping), set(forwarding), updaters
        f.every_step = (every_step | (o - x)) - (x - o)
        f.collates, f.env_stepping = collates, env_stepping
        hotmaps[id(s)] = project.hotmaps[id(s)] = HotMap(s.tree, inside[id(s)], s.nodes, project.module_classes, f)
        looping |= hotmaps[id(s)].looping
        for name, names in s.calls.items():
            called.setdefault(name, set()).update(names)
    project.housekeeping_looping = looping & HOUSEKEEPING   # `def train(self, replay_buffer, iterations)`
    looping = looping_closure(called, looping)
    for s in sources:   # a loop that calls another file's def holding a step loop is an outer loop
        hm = hotmaps[id(s)]
        if (looping - hm.looping) & (set(called_names(s)) | {a for v in hm.facts.aliases.values() for a in v}):
            hm.facts.looping |= looping
            hm.restep()
    project.looping = looping
    gpu = {id(s): assume_gpu or may_use_gpu(s.text) for s in sources}
    moved = moved_classes(project, [s for s in sources if gpu[id(s)]])   # `Translator(model).to(device)` elsewhere
    gpu.update({id(s): True for s in sources if any(id(c) in moved for c in s.classes.values())})
    gpu_project = any(gpu.values())
    project.default_cuda = runs_default_cuda(sources)
    project.host_attrs = host_attrs(Checker, project, flags)   # after: torch.zeros(n) is on the device under it
    checkers: dict[int, Checker] = {}
    queue = []
    reach = gpu_reach(project, sources, gpu)
    for s in sources:
        c = checkers[id(s)] = Checker(s, project, hotmaps[id(s)], flags)
        _guarded(c.check_module, s, errors)
        # a file that names no device but trains (an update loop) in a project that uses the GPU runs on it: its
        # trainer is handed the model and the batches (decision-transformer's Trainer names no device, its script does);
        # not a script whose only torch is a SummaryWriter (tabular Q-learning in numpy beside the project's DQNs)
        if not gpu[id(s)] and gpu_project and c.hotmap.update_loops and _COMPUTES.search(s.text) \
                and not own_program(s) and id(s) in reach:
            gpu[id(s)] = True
        elif not gpu[id(s)]:
            _hold_back(c, gpu_project, own_program(s) and not imported_files(project, s))
        queue += c.pending
        c.pending = []
    queue = _seeded(checkers, sources, gpu, errors) + queue
    seen = {h for c in checkers.values() for h in c.hotmap.hooks}   # step_fns may come again, typed
    consts: dict[int, dict] = {}      # id(def) -> the parameter constants it was walked with (flow.static_truth)
    hooks, typed = set(seen), set()   # a hook walked again once, when a call types a parameter its name did not
    walked, retyped = {}, set()      # id(def) -> the kinds of its last walk: walked again once when a later call hands
    #                                   device tensors (or once a batch) where that walk had none (rewalk.retyping)
    while True:
        for c in checkers.values():   # a CPU-only file whose step loop calls into a GPU file runs on the GPU (a
            mine = imported_files(project, c.src) if c.waiting and own_program(c.src) else None   # script: one it
            if c.waiting and any(gpu[id(p[0])] and (mine is None or id(p[0]) in mine) for p in c.waiting):   # imports
                queue += _wake(c, gpu)
            c.waiting = []
        if not queue:
            break
        nxt = []
        for target, fn, kinds, types, chain, functions in queue:
            again = fewer_constants(consts[id(fn)], kinds) if id(fn) in consts else None
            why = retyping(fn, walked.get(id(fn)), kinds)   # once per call (it reads no "#val" key `again` changes)
            if again is not None:   # another call passes other constants: walk it with only those both share
                kinds = {k: v for k, v in kinds.items() if "#val" not in k} | again
            elif id(fn) in seen and not (types_more(fn, kinds) and id(fn) in hooks and id(fn) not in typed
                                         or why - retyped):
                continue
            retyped |= why
            typed.add(id(fn))
            walked[id(fn)] = kinds
            consts[id(fn)] = {k: v for k, v in kinds.items() if "#val" in k}
            seen.add(id(fn))
            c = checkers[id(target)]
            _guarded(lambda: c.check_hot(fn, kinds, types, chain, functions), target, errors)
            nxt += c.pending
            c.pending = []
        queue = nxt
    absorb_round_trips(checkers.values())
    found: list[Finding] = []
    for s in sources:
        c = checkers.get(id(s))
        if c is None:
            continue
        quiet = _suppressions(s.text)
        for key, f in c.findings.items():
            if not any(f.rule in quiet.get(i, ()) or "*" in quiet.get(i, ()) for i in c.spans[key]):
                found.append(f)
    skipped = [s for s in sources if not gpu[id(s)] and not any(f.path == str(s.path) for f in found)]
    return sorted(found, key=lambda f: (f.path, f.line, f.col, f.rule)), skipped


def _seeded(checkers: dict, sources: list[Source], gpu: dict, errors) -> list:
    """Walk again each def holding a step loop that the project calls with known argument kinds
    (a sampler in a library module, called from a script): the kinds agreed on by its call sites
    seed its parameters. Returns the hot calls its loops make, to follow first."""
    seeds: dict[int, tuple] = {}
    for s in sources:
        for target, fn, kinds, types in checkers[id(s)].seeds:
            if gpu[id(s)] and not gpu[id(target)] and hands_the_device(checkers[id(s)].project, kinds, types):
                checkers[id(target)].pending += _wake(checkers[id(target)], gpu)   # evaluate(model, data) handed
                #   the script's module, in a file naming no device (SASRec's utils.py): it runs where the model is
            _, _, old, classes = seeds.setdefault(id(fn), (target, fn, dict(kinds), {}))
            for k, v in kinds.items():
                if old.get(k, v) != v:
                    old[k] = None   # the call sites disagree: unknown
                else:
                    old.setdefault(k, v)
            for k, v in types.items():   # the classes any call site hands a parameter (`replay_buffer`)
                classes.setdefault(k, []).extend(c for c in v if c not in classes[k])
    queue = []
    for target, fn, kinds, types in seeds.values():
        c = checkers[id(target)]
        kinds = {k: v for k, v in kinds.items() if v is not None}
        if (kinds or types) and gpu[id(target)]:
            _guarded(lambda: c.check_seeded(fn, kinds, types), target, errors)
            queue += c.pending
            c.pending = []
    return queue


def _wake(c: Checker, gpu: dict) -> list:
    """A held-back file (_hold_back) found to run on the GPU: its dropped findings back; returns its waiting calls."""
    gpu[id(c.src)] = True
    c.findings.update(c.dropped)
    c.dropped, waiting, c.waiting = {}, c.waiting, []
    return waiting


def _closures(sources: list[Source], facts: dict) -> tuple[set[str], set[str]]:
    """What the project says about names: the defs that update (backward, an optimizer step) and
    the defs that run a module, each directly or through the project's defs they call at their own
    level, to a fixed point (a few rounds: train_actor_critic -> calc_gradients -> backward)."""
    stepping: set[str] = set()
    forwarding: set[str] = set()
    defined = frozenset(name for s in sources for name in s.calls)   # s.calls is keyed by def name
    for s in sources:
        f = facts[id(s)]
        f.defined = defined
        if "backward" in s.text or "step(" in s.text:   # a def that updates says one of them
            stepping |= stepping_defs(s.nodes, f)
        forwarding |= forwarding_defs(s.nodes, f, s.calls)
    trainers = {fn.name for s in sources if "backward" in s.text or "step(" in s.text for fn in s.nodes
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in stepping
                and holds_updating_loop(fn, facts[id(s)])}
    stepping -= trainers   # a call of a def with a training loop of its own is an outer loop's, not a step
    new = stepping | forwarding
    for _ in range(4):
        if not new:
            break
        grown: set[str] = set()
        for s in sources:
            if not any(names & new for names in s.calls.values()):
                continue
            f = facts[id(s)]
            f.stepping, f.forwarding = set(stepping), set(forwarding)
            more_s = stepping_defs(s.nodes, f, strict=True) - stepping
            more_f = forwarding_defs(s.nodes, f, s.calls) - forwarding - more_s
            stepping |= more_s
            forwarding |= more_f
            grown |= more_s | more_f
        new = grown
    return stepping, forwarding - stepping


def _guarded(step, s: Source, errors: list[str] | None) -> None:
    """Run one walk; a bug of the linter on this file becomes one line (or ValueError), not a traceback."""
    try:
        step()
    except (RecursionError, MemoryError) as e:
        _fail(f"{s.path}:0: cannot check this file: an expression too deeply nested ({e.__class__.__name__}); "
              f"split it or skip the file with --exclude", errors, e)
    except Exception as e:  # noqa: BLE001 - one file must not stop the others
        _fail(f"{s.path}:0: gobrrr lint failed on this file ({e.__class__.__name__}: {e}); skip it with "
              f"--exclude and report the bug with the file", errors, e)


def _fail(message: str, errors: list[str] | None, cause: BaseException) -> None:
    if errors is None:
        raise ValueError(message) from cause
    errors.append(message)


def _hold_back(c: Checker, gpu_project: bool, alone: bool = False) -> None:
    """A file that never names a device: keep only the findings of its per-step hooks (a module's
    forward runs on the device the project uses elsewhere); the rest wait in `dropped`, and the
    calls of its step loops in `waiting`, until a call is seen to reach a file that names one.
    `alone`: a script of its own that imports no file picking CUDA (pydreamer's generator.py steps its
    envs with a CPU copy of the model): only the forwards of its modules are kept, not the other hooks
    (a policy object's `__call__`)."""
    spans = [range(n.lineno, (n.end_lineno or n.lineno) + 1) for n in c.src.nodes
             if id(n) in c.hotmap.hooks and not (alone and getattr(n, "name", "") != "forward")] if gpu_project else []
    c.dropped = {k: f for k, f in c.findings.items() if not any(f.line in r for r in spans)}
    for k in c.dropped:
        del c.findings[k]
    keep, wait = [], []
    for p in c.pending:
        line = int(p[4][0].rsplit(":", 1)[1])
        (keep if any(line in r for r in spans) else wait).append(p)
    c.pending, c.waiting = keep, wait


def called_names(s: Source):
    return (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id for n in s.nodes
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)))


def lint_source(text: str, path: str = "<string>", select=None, everything: bool = False,
                assume_gpu: bool = False) -> list[Finding]:
    """Findings for one file's source text, sorted by line: those that run every step, or all of
    them with `everything`. Raises SyntaxError if it does not parse, RecursionError if too deep."""
    wanted = _select(select)
    found, _ = check_sources([parse(Path(path), text)], assume_gpu)
    return [f for f in found if f.rule in wanted and (everything or f.hot)]


def read_sources(files: list[Path], errors: list[str] | None) -> list[Source]:
    """Parse each file once; a file that cannot be read or parsed raises ValueError with one line,
    or, if `errors` is a list, is described there and left out."""
    out = []
    for file in files:
        try:
            out.append(_read(file))
        except ValueError as e:
            if errors is None:
                raise
            errors.append(str(e))
    return out


def _read(file: Path) -> Source:
    try:
        return parse(file, read_text(file))
    except (SyntaxError, UnicodeDecodeError, OSError) as e:
        line = getattr(e, "lineno", None)
        if isinstance(e, SyntaxError) and sys.version_info < (3, 12) \
                and re.match(r"\s*((async\s+)?def|class)\s+\w+\s*\[|\s*type\s+\w+.*=", e.text or ""):
            raise ValueError(f"{file}:{line}: cannot check this file: it uses Python 3.12 syntax (type parameters) that "
                             f"Python {sys.version_info.major}.{sys.version_info.minor} cannot parse; run gobrrr under "
                             "Python 3.12 or newer, or skip it with --exclude") from e   # lerobot's generic defs
        raise ValueError(f"{file}:{line or 0}: cannot check this file: {e.__class__.__name__}: "
                         f"{getattr(e, 'msg', e)}; fix it or skip it with --exclude") from e
    except (RecursionError, MemoryError) as e:
        raise ValueError(f"{file}:0: cannot check this file: an expression too deeply nested to parse "
                         f"({e.__class__.__name__}); split it or skip the file with --exclude") from e


def lint_paths(paths, select=None, errors: list | None = None, *, everything: bool = False,
               exclude=(), tests: bool = False, assume_gpu: bool = False) -> list[Finding]:
    """Findings for files and directories (every *.py below; hidden, build and test folders skipped),
    checked as one project.

    A path or file that cannot be found, read or parsed raises ValueError (FileNotFoundError for a
    missing path), unless `errors` is a list: then a line describing the problem is appended to it
    and the other files are still checked.
    """
    wanted = _select(select)
    files, problems, _ = python_files(paths, exclude, tests)
    if problems and errors is None:
        raise FileNotFoundError(problems[0]) if "no such file" in problems[0] else ValueError(problems[0])
    if errors is not None:
        errors += problems
    found, _ = check_sources(read_sources(files, errors), assume_gpu, errors)
    return [f for f in found if f.rule in wanted and (everything or f.hot)]


def lint_file(file: Path, select=None, everything: bool = False, assume_gpu: bool = False) -> list[Finding]:
    """One file's findings, the file taken alone; ValueError with a one-line reason if it cannot be
    read or parsed."""
    wanted = _select(select)
    found, _ = check_sources([_read(Path(file))], assume_gpu)
    return [f for f in found if f.rule in wanted and (everything or f.hot)]


def _select(select) -> set[str]:
    if select is None:
        return set(RULES)
    ids = {s.strip().upper() for s in (select.split(",") if isinstance(select, str) else select) if s.strip()}
    if not ids:
        raise ValueError("--select names no rule; give rule ids such as GB002,GB004, or leave it out to check all")
    unknown = ids - set(RULES)
    if unknown:
        raise ValueError(f"unknown rule id(s) {', '.join(sorted(unknown))}; choose from {', '.join(RULES)}")
    return ids


def main(argv: list[str] | None = None) -> int:
    """`gobrrr lint PATH... [--format text|json] [--select IDS] [--all] [--tests] [--exclude GLOB]
    [--assume-gpu]`: 0 clean, 1 findings, 2 usage error, a path that could not be checked, or nothing to check."""
    parser = argparse.ArgumentParser(
        prog="gobrrr lint", description="Static check for host-device anti-patterns (GB001-GB014) in the code "
        "that runs every training step.",
        epilog="Rules (each in the code that runs every step):\n" + "\n".join(f"  {k}  {t}" for k, t in TITLES.items())
        + "\n\nSuppress a line with `# gobrrr: ignore[GB002]`.", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to check")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--select", metavar="IDS", help="comma-separated rule ids to check, e.g. GB002,GB004")
    parser.add_argument("--all", action="store_true", dest="everything",
                        help="also report loops that do not step (set-up, epoch-level, other loops)")
    parser.add_argument("--tests", action="store_true", help="also check tests/ folders and test_*.py files")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="skip files or folders matching GLOB (repeatable), e.g. --exclude 'examples/*'")
    parser.add_argument("--assume-gpu", action="store_true",
                        help="also check files that never name a device (taken as CPU-only and skipped otherwise)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code in (0, None) else 2
    try:
        wanted = _select(args.select)
    except ValueError as e:
        print(f"gobrrr lint: error: {e}", file=sys.stderr)
        return 2
    files, errors, tests_skipped = python_files(args.paths, args.exclude, args.tests)
    sources = read_sources(files, errors)
    found, cpu_only = check_sources(sources, args.assume_gpu, errors)
    found = [f for f in found if f.rule in wanted]
    shown = [f for f in found if args.everything or f.hot]
    hidden = len(found) - len(shown)
    if args.format == "json":
        print(json.dumps([f.to_dict() for f in shown], indent=2))
    else:
        for f in shown:
            print(f)
        if shown:
            print("how to fix:")
            for rule in sorted({f.rule for f in shown}):
                print(f"  {rule}: {shown[[g.rule for g in shown].index(rule)].fix}")
    sys.stdout.flush()
    if not files and not errors:
        why = f"all {tests_skipped} Python files are tests (--tests checks them)" if tests_skipped else \
            "every Python file was excluded (see --exclude)"
        errors.append(f"nothing to check: {why}")
    for e in errors:  # before the summary, so a file that was not checked is never hidden under "clean"
        print(f"gobrrr lint: error: {e}", file=sys.stderr)
    sys.stderr.flush()
    if args.format == "text":
        print(summary(len(shown), len(sources), errors, hidden, tests_skipped, cpu_only))
    return 2 if errors else (1 if shown else 0)


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def summary(n: int, n_files: int, errors: list[str], hidden: int, skipped: int, cpu_only=()) -> str:
    """The last line of the text output: findings (or clean) over the files checked, and what was not."""
    head = f"{_n(n, 'finding')} in {_n(n_files, 'file')}" if n or errors else f"clean ({_n(n_files, 'file')})"
    if errors:
        head += f"; {_n(len(errors), 'path')} not checked (see the errors above)"
    extra = []
    if hidden:
        extra.append(f"{hidden} more outside the step loops (--all shows them)")
    if cpu_only:
        names = ", ".join(s.path.name for s in list(cpu_only)[:3]) + (", ..." if len(cpu_only) > 3 else "")
        one = len(cpu_only) == 1
        extra.append(f"{len(cpu_only)} of them never {'names' if one else 'name'} a device and "
                     f"{'was' if one else 'were'} skipped as CPU-only code, where loops sync nothing "
                     f"({names}; --assume-gpu checks {'it' if one else 'them'})")
    if skipped:
        extra.append(f"{_n(skipped, 'test file')} skipped (--tests checks them)")
    return "gobrrr lint: " + head + (f"; {'; '.join(extra)}" if extra else "")


if __name__ == "__main__":
    raise SystemExit(main())
