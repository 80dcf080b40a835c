"""gobrrr.lint: `gobrrr lint PATH`, the static check for host-device anti-patterns (Part 1).

Open check.py first (files in, findings out, the CLI). source.py parses and indexes each file once,
index.py gathers them into the project's modules and classes, and graph.py says which def a call runs;
loops.py recognises step loops by what they do; hot.py decides which code runs per step; calls.py follows
calls from it across files; findings.py lists the rules GB001-GB014 as the user reads them; rules.py
holds the walk (the Checker), with scopes.py binding names as it goes, the rules by concept in sync.py,
moves.py, inside.py (with cpuparams.py and dists.py), env.py and elements.py, and flow.py walking loops,
branches and error paths; kinds.py says which values are tensors on the device, callkinds.py what a call
returns, from the tables of names.py. Reads source only: never imports the user's code.
"""
from gobrrr.lint.check import Finding, lint_file, lint_paths, lint_source, main

__all__ = ["lint_paths", "lint_file", "lint_source", "Finding", "main"]
