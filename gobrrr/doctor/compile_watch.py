"""Tell the doctor when torch.compile starts compiling, without importing torch._dynamo ourselves.

The doctor records from the script's start (a script that never steps still gets a time window). A
compiled script compiles in its first step: tens of seconds of dynamo and inductor Python, which the
profiler's Python tracer would record call by call (slowing the compile several times over and filling
memory) for a window that the first step boundary throws away anyway. So when compilation starts before
any step, the session drops the start-up recording and records its steps with a fresh profiler
(session.py, `_on_compile_start`).

torch._dynamo takes seconds to import, so it is never imported here: if the script already imported it,
the callback is registered at once (torch._dynamo.callback's `register_start_callback`); otherwise a
meta-path finder waits for the script's own import of `torch._dynamo.callback` and registers it right
after that module runs. `unwatch()` removes both.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

MODULE = "torch._dynamo.callback"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after MODULE is first imported; otherwise finds nothing."""

    def __init__(self, then):
        self.then = then

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)  # let the normal finders find it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec


class CompileWatch:
    """Calls `on_start()` at each compilation start of torch.compile, from `watch()` until `unwatch()`."""

    def __init__(self, on_start):
        self.on_start = on_start
        self._finder: _AfterImport | None = None
        self._module = None

    def _callback(self, *args, **kwargs) -> None:
        self.on_start()

    def _register(self, module) -> None:
        handler = getattr(module, "callback_handler", None)
        if handler is not None and hasattr(handler, "register_start_callback"):
            handler.register_start_callback(self._callback)
            self._module = module

    def watch(self) -> None:
        if MODULE in sys.modules:
            self._register(sys.modules[MODULE])
        else:
            self._finder = _AfterImport(self._register)
            sys.meta_path.insert(0, self._finder)

    def unwatch(self) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        if self._module is not None:
            try:
                self._module.callback_handler.remove_start_callback(self._callback)
            except (AttributeError, ValueError):
                pass
            self._module = None
