"""The kit's import graph: longest import chain, layer count, imports inside functions.

Reads the source of the kit's packages (``conformance``, ``ddp_impl``, ``fixtures``; not
``tests``) with :mod:`ast`, nothing is imported. An edge ``a -> b`` is an import in module
``a`` of kit module ``b`` (``from pkg import name`` counts ``pkg.name`` when that is a module,
else ``pkg``; the implicit imports of parent packages are not edges). Two graphs:

* ``all``: every import, at the top of a file or inside a function (what the flat package's
  "17-module chain, 13 layers" counted);
* ``top``: imports at module level only (what a file's head shows; ``if TYPE_CHECKING``
  blocks left out in both).

For each: the longest chain (modules on the longest path, the path itself) and the layers (the
longest path counted in strongly connected components, so an import cycle counts once; the
cycles are listed). ``imports``: import statements of the kit's modules, all and inside
functions (every imported name's statement counted once, stdlib and third party included).

    python benchmarks/import_graph.py --out benchmarks/results/import-graph.json
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("conformance", "ddp_impl", "fixtures")


def modules(root: str = ROOT) -> dict[str, str]:
    """``{dotted module name: path}`` of the kit's packages."""
    out = {}
    for pkg in PACKAGES:
        for dirpath, dirnames, files in os.walk(os.path.join(root, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(files):
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].replace(os.sep, ".")
                    out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def _type_checking(node) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
           (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(name: str, path: str, mods) -> list[tuple[str, bool]]:
    """``[(kit module imported, inside a function)]`` of one module, plus ``(None, inside)``
    for each import statement of anything else (counted, not an edge)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - child.level + 1] + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in child.names]
            else:
                visit(child, fn)
                continue
            kit = sorted({t for t in targets if t in mods and t != name})
            out.append((kit, in_function))
    visit(tree, False)
    return out


def _sccs(graph):
    """Tarjan's strongly connected components (iterative)."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(sorted(comp))
    return comps


def measure(graph: dict[str, set[str]]) -> dict:
    """Longest chain (simple path over the component DAG, a cycle entered once) and layers."""
    comps = _sccs(graph)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    dag = {i: {comp_of[t] for m in c for t in graph[m]} - {i} for i, c in enumerate(comps)}
    memo = {}

    def longest(i):  # (components on the longest path from i, modules on it, the path)
        if i not in memo:
            best = (1, len(comps[i]), [i])
            for j in dag[i]:
                n, mods_n, path = longest(j)
                if (n + 1, mods_n + len(comps[i])) > best[:2]:
                    best = (n + 1, mods_n + len(comps[i]), [i] + path)
            memo[i] = best
        return memo[i]
    sys.setrecursionlimit(10000)
    layers, _, path = max((longest(i) for i in dag), key=lambda t: (t[0], t[1]))
    chain = [" | ".join(comps[i]) for i in path]
    return {"layers": layers, "chain_modules": sum(len(comps[i]) for i in path), "chain": chain,
            "edges": sum(len(v) for v in graph.values()),
            "cycles": [c for c in comps if len(c) > 1]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the JSON here (default: stdout only)")
    args = ap.parse_args(argv)
    mods = modules()
    graphs = {"all": {m: set() for m in mods}, "top": {m: set() for m in mods}}
    counts = {p: {"statements": 0, "in_functions": 0} for p in PACKAGES + ("kit",)}
    for m, path in mods.items():
        for kit, in_function in imports_of(m, path, mods):
            for key in (m.split(".")[0], "kit"):
                counts[key]["statements"] += 1
                counts[key]["in_functions"] += in_function
            graphs["all"][m].update(kit)
            if not in_function:
                graphs["top"][m].update(kit)
    doc = {"modules": len(mods), "packages": list(PACKAGES), "imports": counts,
           "graphs": {k: measure(g) for k, g in graphs.items()}}
    text = json.dumps(doc, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
