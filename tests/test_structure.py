"""Structure of the kit: no import cycles among its modules (function-level imports
included), and the installed packages do not contain the meta-tests."""
import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("conformance", "ddp_impl", "fixtures")


def _modules():
    mods = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(REPO, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                    mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _graph(mods):
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    if target in mods and target != m:
                        graph[m].add(target)
            elif isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names if a.name in mods and a.name != m)
    return graph


def _cycle(graph):
    """One import cycle as a list of modules, or None (depth-first search)."""
    state, path = {}, []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        path.pop()
        return None
    for v in sorted(graph):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_graph(_modules()))
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("pkg", PACKAGES)
def test_meta_tests_are_not_in_the_installed_packages(pkg):
    assert not os.path.exists(os.path.join(REPO, pkg, "tests", "test_world.py"))


#: The case kinds (conformance.cases): a kind may import the shared modules (checks, search,
#: row, the training loop's helpers and state reading in train/), never another kind.
KINDS = {"train": "conformance.cases.train", "task": "conformance.cases.features",
         "property": "conformance.cases.properties", "scenario": "conformance.cases.scenarios",
         "invariant": "conformance.cases.ranks"}
SHARED = {"conformance.cases.train.loop", "conformance.cases.train.readback"}


def _kind(module):
    return next((k for k, pkg in KINDS.items() if module == pkg or module.startswith(pkg + ".")), None)


def test_kinds_do_not_import_each_other():
    graph = _graph(_modules())
    bad = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
           if _kind(m) and _kind(t) and _kind(m) != _kind(t) and t not in SHARED]
    assert not bad, bad


def test_every_kind_is_covered():
    from conformance.cases.row import KINDS as TABLE_KINDS
    assert set(KINDS) == set(TABLE_KINDS)
