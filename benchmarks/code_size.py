"""The size of the kit's package: files, lines, long functions and modules, private imports.

Reads the source of ``conformance/`` with :mod:`ast` (nothing is imported):

* ``files``, ``lines``: ``.py`` files and their lines;
* ``functions_over``: functions (and methods) longer than 50 and 60 lines, the longest named;
* ``modules_over_500``: modules longer than 500 lines;
* ``private_imports``: ``from kit.module import _name`` of another kit module's private name;
* ``history_comments``: comments and docstrings naming an issue number or a measurement
  machine, which belong in git, docs/ and benchmarks/.

    python benchmarks/code_size.py --out benchmarks/results/code-size-REV.json
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HISTORY = re.compile(r"\bissue \d+|\bissues? #?\d+|measured on the|\(measured", re.I)


def _sources(root: str, package: str):
    for dirpath, dirnames, files in os.walk(os.path.join(root, package)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, root), open(path, encoding="utf-8").read()


def measure(root: str = ROOT, package: str = "conformance") -> dict:
    """The figures above for ``root/package``, as a JSON-ready dict."""
    files = lines = 0
    functions: list[tuple[int, str]] = []
    long_modules: dict[str, int] = {}
    private: list[str] = []
    history: list[str] = []
    for rel, text in _sources(root, package):
        files += 1
        n = len(text.splitlines())
        lines += n
        if n > 500:
            long_modules[rel] = n
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == package):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        private.append(f"{rel}: {node.module} {alias.name}")
        for i, line in enumerate(text.splitlines(), 1):
            if HISTORY.search(line):
                history.append(f"{rel}:{i}")
    functions.sort(reverse=True)
    return {
        "package": package, "files": files, "lines": lines,
        "functions_over": {str(k): sum(1 for n, _ in functions if n > k) for k in (50, 60)},
        "longest_functions": [f"{name} {n}" for n, name in functions[:10]],
        "modules_over_500": long_modules,
        "private_imports": private,
        "history_comments": len(history), "history_comment_sites": history,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=ROOT, help="checkout to measure (default: this one)")
    p.add_argument("--out", help="write the JSON here (default: stdout only)")
    args = p.parse_args(argv)
    result = measure(args.root)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    summary = {k: v for k, v in result.items() if k not in ("history_comment_sites",)}
    summary["private_imports"] = len(result["private_imports"])
    summary["modules_over_500"] = len(result["modules_over_500"])
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
