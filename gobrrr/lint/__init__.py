"""gobrrr.lint: `gobrrr lint PATH`, the static check for host-device anti-patterns (Part 1).

Open check.py first (files in, findings out, the CLI). hot.py decides which code runs per step;
rules.py holds the rules GB001-GB009 and their fixes; kinds.py and sync.py say which values are
tensors on the device and which calls sync. Reads source only: never imports the user's code.
"""
from gobrrr.lint.check import Finding, lint_file, lint_paths, lint_source, main

__all__ = ["lint_paths", "lint_file", "lint_source", "Finding", "main"]
