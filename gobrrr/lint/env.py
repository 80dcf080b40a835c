"""GB014: a CPU environment stepped every iteration of a loop, reported once per loop.

An RL rollout loop over a CPU environment (gym, gymnasium, a numpy simulator) has to sync: the
action goes to the host (`action.cpu().numpy()`) and the observation and reward come back
(`torch.tensor(obs).to(device)`). Reported as separate GB002/GB001/GB010 findings they are
several lines of advice that cannot be followed one at a time; what removes them is the
environment, so the loop gets one finding at its `env.step(...)` that names the lines of the
round trip, in its file and in the project's functions it calls for the action, and those lines
are not reported again.

    CPU environment   the step's action is read to the host (`.cpu()`, `.numpy()`, `.item()`,
                      `.tolist()`, a numpy value, but not a fresh `np.random` draw: nothing is
                      read back), or the env was made by gym/gymnasium/envpool
    GPU environment   the action stays a device tensor: the step's results are device tensors,
                      so `if done.any():` on them is a GB007 like any other

A mixin of rules.Checker: it relies on `kind()`, `flag()`, `findings`, `names_at`.
"""
from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from gobrrr.lint.loops import env_steps, is_env_name, name_of, own_level
from gobrrr.lint.names import TENSORISH

_READS = {"cpu", "numpy", "item", "tolist"}
_ROUND_TRIP = {"GB001", "GB002", "GB005", "GB009", "GB010"}
_ENVISH = re.compile(r"make|Env|vec|env", re.I)
_CPU_ENV_MAKERS = ("gym.make", "gymnasium.make", "gym.vector.", "gymnasium.vector.", "envpool.make",
                   "gym.wrappers.", "gymnasium.wrappers.", "SyncVectorEnv", "AsyncVectorEnv", "DummyVecEnv",
                   "SubprocVecEnv", "make_vec_env")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _reads(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _READS
               for n in ast.walk(node))


def env_calls(loop: ast.AST) -> list[tuple[ast.Call, list[ast.AST]]]:
    """The `env.step(action)` calls at a loop's own level, each with the names its result goes to."""
    out = []
    for n in own_level(loop.body):
        if isinstance(n, ast.Assign) and env_steps(n):
            out.append((n.value, list(n.targets[0].elts)))
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
                and n.value.func.attr == "step" and n.value.args and is_env_name(name_of(n.value.func.value)):
            out.append((n.value, list(n.targets)))
    return out


class EnvRules:
    """GB014 per loop, and the kinds of a GPU environment's results."""

    def env_results(self, node: ast.Assign) -> str | None:
        """The kind to give `obs, r, done, info = env.step(a)`'s names: 'tensor' when the action is a
        device tensor (a GPU simulator), 'numpy' when it is read to the host first, else None."""
        call = node.value
        action = call.args[0]
        if _reads(action) or self.kind(action) in ("num", "numpy", "host") \
                or isinstance(call.func, ast.Attribute) and self.cpu_env(call.func.value):   # not step_env(env, a)
            return "numpy"
        return "tensor" if self.kind(action) in TENSORISH else None

    def _drawn(self, action: ast.AST, loop: ast.AST) -> bool:
        """The action is a fresh random draw, at the step or assigned at the loop's level (`action =
        np.random.uniform(...)`, `env.action_space.sample()`): nothing was read back from the device."""
        calls = [action] if isinstance(action, ast.Call) else [
            n.value for n in own_level(loop.body) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and _names(action) & set().union(*(_names(t) for t in n.targets))]
        return bool(calls) and all((self.dotted(c.func) or "").startswith("numpy.random.")
                                   or name_of(c.func) == "sample" and "action_space" in ast.unparse(c.func) for c in calls)

    def _in_wrapper(self, loop: ast.AST) -> bool:
        fn = self.defs[-1] if self.defs else None
        return any(_wrapped_step(fn, call) for call, _ in env_calls(loop))

    def cpu_env(self, receiver: ast.AST) -> bool:
        made = self.env_makers.get(name_of(receiver))
        return bool(made) and any(made.startswith(m) or m in made for m in _CPU_ENV_MAKERS)

    def env_loop(self, loop: ast.AST) -> None:
        """After the loop's body was visited: one GB014 per CPU-environment step, absorbing the
        round trip's own findings inside the loop (`covers`); those in the project's functions that its
        policy call runs are absorbed after every walk (`absorb_round_trips`, `covers_at`). A helper that
        acts and steps once is the loop's step (`_helper_steps`); an env wrapper's own repeat loop is none."""
        if self.silent or self._in_wrapper(loop):
            return
        if not env_calls(loop):
            self._helper_steps(loop)
        for call, targets in env_calls(loop):
            action = call.args[0]
            action_names = _names(action)
            policy = _policy_calls(loop, action_names)
            obs_names = set().union(*(_names(t) for t in targets)) if targets else set()
            for n in own_level(loop.body):   # act = policy(obs).cpu().numpy(); next_obs = torch.tensor(obs)
                if isinstance(n, ast.Assign):
                    got = set().union(*(_names(t) for t in n.targets))
                    if got & action_names:
                        action_names |= _names(n.value)
                    if _names(n.value) & obs_names:
                        obs_names |= got
            drawn = self._drawn(action, loop)
            host_action = _reads(action) or self.kind(action) in ("num", "numpy") and not drawn \
                or isinstance(call.func, ast.Attribute) and self.cpu_env(call.func.value) \
                or any(_reads(n.value) for n in own_level(loop.body) if isinstance(n, ast.Assign)
                       and set().union(*(_names(t) for t in n.targets)) & action_names) \
                or any(_host_copy(self.dotted(c.func) or "") and c.args for c in policy)
            # (`policy.select_action(np.array(state))`: the observation is a host array, so the env is a CPU
            # one, and the action the policy returns reaches it through the host: `int(q.argmax(1))` in BCQ)
            if not host_action:
                continue
            span = range(loop.lineno, (loop.end_lineno or loop.lineno) + 1)
            absorbed = []
            for key, f in list(self.findings.items()):
                if f.path != self.path or f.line not in span or f.rule not in _ROUND_TRIP or f.chain:
                    continue
                names = self.names_at.get(key, set())
                if (f.rule == "GB002" and names & action_names) or (f.rule != "GB002" and names & obs_names):
                    absorbed.append(f.line)
                    del self.findings[key]
            where = f" (the round trip's copies at line{'s' if len(absorbed) > 1 else ''} " \
                    f"{', '.join(map(str, sorted(set(absorbed))))})" if absorbed else ""
            self.flag(call, "GB014", what=ast.unparse(call.func), where=where)
            f = self.findings.get(("GB014", call.lineno))
            if f is not None:
                f.covers = sorted(set(absorbed))
                for c in policy:   # what the policy call does in the project's code is the round trip too (absorb)
                    self.round_trips.setdefault(f"{self.src.name}:{c.lineno}", []).append((f, None))

    def _helper_steps(self, loop: ast.AST) -> None:
        """`..., obs, r, done = update_belief_and_act(env, planner, ..., obs.to(dev))`: a loop whose own call runs a
        project def that steps a CPU env once, the action read back in its `env.step(...)`: that call is the loop's
        env step. One GB014 at it, standing for the read-back in the helper's step (absorbed) and the call's line."""
        scope = self.defs[-1] if self.defs else None
        for n in own_level(loop.body):
            if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)):
                continue
            for target_src, fn in self.project.resolve(self.src, n.value, scope, self.types)[:2]:
                steps = [c for c, _ in env_calls(fn) if _reads(c.args[0])]
                if not steps:
                    continue
                self.flag(n.value, "GB014", what=name_of(n.value.func), where="")
                f = self.findings.get(("GB014", n.value.lineno))
                if f is not None:
                    only = {(str(target_src.path), i) for c in steps for i in range(c.lineno, (c.end_lineno or c.lineno) + 1)}
                    self.round_trips.setdefault(f"{self.src.name}:{n.value.lineno}", []).append((f, only))
                return


def _wrapped_step(fn: ast.AST | None, call: ast.Call) -> bool:
    """`self.env.step(action)` inside an env wrapper's own `step`/`reset` (frame skip, action repeat): the wrapper
    is stepped by the rollout loop, which is where the round trip is reported; its inner loop is not one."""
    return getattr(fn, "name", "") in ("step", "reset") and fn.args.args[:1] and fn.args.args[0].arg == "self" \
        and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Attribute) \
        and isinstance(call.func.value.value, ast.Name) and call.func.value.value.id == "self"


def _host_copy(name: str) -> bool:
    """`np.array(obs)`, `np.asarray(obs)`, `np.float32(obs)`: host data made from what the env returned (not a
    fresh `np.random` draw)."""
    return name.startswith("numpy.") and not name.startswith("numpy.random.")


def _policy_calls(loop: ast.AST, action: set[str]) -> list[ast.Call]:
    """The calls whose result becomes the env step's action, at the loop's own level: `a = agent.act(obs)`, also
    through renames (`a_next, q = agent.act(s_next)` ... `s, a = s_next, a_next`)."""
    names, own = set(action), [n for n in own_level(loop.body) if isinstance(n, ast.Assign)]
    for _ in range(2):   # a rename after the call (the next step's action) reaches it on the second pass
        for n in own:
            if isinstance(n.value, (ast.Name, ast.Tuple)) and set().union(*(_names(t) for t in n.targets)) & names:
                names |= _names(n.value)
    return [c for n in own if isinstance(n.value, ast.Call) and set().union(*(_names(t) for t in n.targets)) & names
            for c in ast.walk(n.value) if isinstance(c, ast.Call)]


def absorb_round_trips(checkers) -> None:
    """After every hot walk: a copy or read-back that a GB014 loop's policy call makes in the project's code
    (`a = agent.select_action(s)` -> `torch.FloatTensor(s).to(dev)`, `.argmax().item()` in agent.py) is that
    environment's round trip, not a finding of its own: the GB014 names it (`covers_at`). A call site is
    `file.py:line` by the file's name; of several such files, the one nearest the helper's folder."""
    trips: dict[str, list] = {}
    for c in checkers:
        for key, found in c.round_trips.items():
            trips.setdefault(key, []).extend(found)
    if not trips:
        return
    for c in checkers:
        for key, f in list(c.findings.items()):
            owners = [g for g, only in trips.get(f.chain[0], []) if only is None or (f.path, f.line) in only] \
                if f.chain and f.rule in _ROUND_TRIP else None   # only: a helper's own env step, not its model
            if not owners:
                continue
            here = Path(f.path).parent.parts
            env = max(owners, key=lambda g: len(os.path.commonprefix([Path(g.path).parent.parts, here])))
            env.covers_at.append(f"{f.path}:{f.line}")
            del c.findings[key]
    for c in checkers:
        for found in c.round_trips.values():
            for g, _ in found:
                if g.covers_at and "in the calls it makes" not in g.message:
                    g.covers_at = sorted(set(g.covers_at))
                    g.message += f" (the round trip's copies in the calls it makes: {', '.join(map(_short, g.covers_at))})"


def _short(at: str) -> str:
    path, line = at.rsplit(":", 1)
    return f"{Path(path).name}:{line}"


def env_makers(nodes: list[ast.AST]) -> dict[str, str]:
    """name -> the call that made it, for `env = gym.make(...)`-like assignments (CPU environments)."""
    out = {}
    for n in nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _ENVISH.search(name_of(n.value.func)):
            made = ast.unparse(n.value.func)
            if any(made.startswith(m) or m in made for m in _CPU_ENV_MAKERS):
                for t in n.targets:
                    if isinstance(t, (ast.Name, ast.Attribute)):
                        out[name_of(t)] = made
    return out


__all__ = ["EnvRules", "absorb_round_trips", "env_calls", "env_makers"]
