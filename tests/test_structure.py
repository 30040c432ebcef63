"""Structure of the kit: no import cycles among its modules (function-level imports
included), and the installed packages do not contain the meta-tests."""
import ast
import os
import re
import subprocess
import sys

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


def _package_files():
    return {m: p for m, p in _modules().items() if not m.startswith(("conformance.tests",))}


def _string_constants(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


ENV_NAME = re.compile(r"^(CONFORMANCE|DDP_IMPL)_[A-Z_]+$")


def test_configuration_variables_are_read_in_settings_only():
    """A ``CONFORMANCE_*`` variable name appears in code of ``conformance.settings`` only
    (everything else receives a Settings), and no module reads the environment at import."""
    offenders = []
    for m, path in _package_files().items():
        if m != "conformance.settings" and m.startswith("conformance"):
            offenders += [f"{m}: {s}" for s in _string_constants(path) if ENV_NAME.match(s)]
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in tree.body:  # module level only: reads at import freeze a value forever
            for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
                if isinstance(sub, ast.Attribute) and sub.attr in ("environ", "getenv") and \
                        isinstance(sub.value, ast.Name) and sub.value.id == "os":
                    offenders.append(f"{m}:{sub.lineno}: reads os.{sub.attr} at import")
    assert not offenders, "\n".join(offenders)


def test_every_variable_the_code_reads_is_documented():
    from conformance.settings import ENVIRONMENT
    names = {var for var, _ in ENVIRONMENT.values()}
    for path in _package_files().values():
        names |= {s for s in _string_constants(path) if ENV_NAME.match(s)}
    with open(os.path.join(REPO, "docs", "configuration.md")) as f:
        doc = f.read()
    missing = sorted(n for n in names if n not in doc)
    assert not missing, f"docs/configuration.md does not document: {', '.join(missing)}"


def test_importing_the_plugin_imports_no_torch():
    """The pytest11 entry point loads into every pytest session of the environment."""
    code = "import sys, conformance.plugin; print(sorted(m for m in ('torch', 'torch_xla', 'numpy', " \
           "'hypothesis', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_top_level_names_the_layers():
    entries = set(os.listdir(os.path.join(REPO, "conformance")))
    assert {"cli", "cases", "impls", "worlds", "report", "settings.py", "plugin.py", "absltest.py",
            "evaluate.py"} <= entries
    flat = sorted(e for e in entries if e.endswith(".py"))
    assert len(flat) <= 12, f"the top level is filling up again: {flat}"


#: The case kinds, from the registry (conformance.cases.kinds.REGISTRY): kind -> its package.
#: A kind may import the shared room (conformance.cases.shared: checks, search, the training
#: loop, its reference and state reading) and the row modules, never another kind.
def _kind_packages():
    from conformance.cases.kinds import REGISTRY
    return {name: line.package for name, line in REGISTRY.items()}


KINDS = _kind_packages()
#: The module that imports the registry's kind modules (by name, importlib): its edges to them
#: join the import graph, so a kind importing it back is a cycle.
KIND_LOADER = "conformance.cases.validation"


def _kind(module):
    return next((k for k, pkg in KINDS.items() if module == pkg or module.startswith(pkg + ".")), None)


def _full_graph():
    """The import graph with the registry's edges (the loader imports every kind module)."""
    from conformance.cases.kinds import REGISTRY
    graph = _graph(_modules())
    graph[KIND_LOADER] |= {line.module for line in REGISTRY.values()}
    return graph


def test_kinds_do_not_import_each_other():
    graph = _graph(_modules())
    bad = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
           if _kind(m) and _kind(t) and _kind(m) != _kind(t)]
    assert not bad, bad


def test_the_registry_edges_make_no_cycle():
    cycle = _cycle(_full_graph())
    assert cycle is None, " -> ".join(cycle)


def test_every_registered_module_declares_its_kind():
    from conformance.cases.kinds import REGISTRY, Kind
    from conformance.cases.validation import kinds
    loaded = kinds()
    assert list(loaded) == list(REGISTRY)
    for name, line in REGISTRY.items():
        assert line.module in _modules(), line.module
        assert isinstance(loaded[name], Kind) and loaded[name].name == name and callable(loaded[name].evaluate)


#: The floors, bottom up: a module may import its own floor and those below, never one above
#: (function-level imports included). Unlisted modules of ``conformance`` are not placed.
#: ``row``: the row type, data only (under the kinds it describes); ``kinds``: the Kind type
#: and the registry, read by the implementation layer too; the kinds; then what uses them.
FLOOR_ROW = ("conformance.cases.row", "conformance.cases.kinds")
FLOOR_ABOVE_KINDS = ("conformance.cases.validation", "conformance.cases.table", "conformance.evaluate",
                     "conformance.cli", "conformance.plugin", "conformance.absltest", "conformance.outcome",
                     "conformance.report", "conformance.__main__")


def _floor(module):
    """0: a leaf of the cases (row, kinds); 1: the implementation and world layers; 2: a kind;
    3: what loads or evaluates the kinds; None: not placed."""
    if module in FLOOR_ROW:
        return 0
    if module.startswith(("conformance.impls", "conformance.worlds")):
        return 1
    if _kind(module):
        return 2
    if any(module == p or module.startswith(p + ".") for p in FLOOR_ABOVE_KINDS):
        return 3
    return None


def _upward(graph):
    """Every ``importer -> imported`` edge of ``graph`` that runs up the floors (:func:`_floor`)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if _floor(m) is not None and _floor(t) is not None and _floor(t) > _floor(m))


def test_no_import_runs_back_up():
    bad = _upward(_full_graph())
    assert not bad, "\n".join(bad)


def test_the_floor_rule_finds_an_upward_import():
    assert _upward({"conformance.cases.train.kind": {"conformance.evaluate"},
                    "conformance.cases.row": {"conformance.cases.invariant.kind"},
                    "conformance.impls.builtin": {"conformance.cases.task.kind"},
                    "conformance.evaluate": {"conformance.cases.row"}}) == [
        "conformance.cases.row -> conformance.cases.invariant.kind",
        "conformance.cases.train.kind -> conformance.evaluate",
        "conformance.impls.builtin -> conformance.cases.task.kind"]


# Modules that import no torch, numpy, torch_xla, hypothesis or matplotlib: the faces' parsing
# paths (bad input is reported before torch loads), the pytest plugin (it loads into every
# project's pytest), the parent side of a world (torch lives in its replica hosts), reports.
# Their function-level imports of heavier kit modules are the reason for deferral.
LIGHT = (
    "conformance",
    "conformance.cases",
    "conformance.cases.kinds",
    "conformance.cases.property",
    "conformance.cases.invariant.kind",
    "conformance.cases.row",
    "conformance.cases.scenario",
    "conformance.cases.shared.search",
    "conformance.cases.train",
    "conformance.cases.shared.setups",
    "conformance.cases.validation",
    "conformance.cli",
    "conformance.cli.calibrate",
    "conformance.cli.output",
    "conformance.cli.parity",
    "conformance.cli.ranks",
    "conformance.cli.repeat",
    "conformance.cli.report",
    "conformance.errors",
    "conformance.impls",
    "conformance.impls.mutants",
    "conformance.impls.mutants.claims",
    "conformance.impls.row",
    "conformance.impls.torch_paths",
    "conformance.impls.xla_paths",
    "conformance.options",
    "conformance.outcome",
    "conformance.plugin",
    "conformance.report",
    "conformance.report.expected",
    "conformance.report.html",
    "conformance.report.junit",
    "conformance.report.kills",
    "conformance.report.plots",
    "conformance.report.runs",
    "conformance.report.terminal",
    "conformance.report.text",
    "conformance.report.writers",
    "conformance.settings",
    "conformance.tolerances",
    "conformance.verdict",
    "conformance.worlds",
    "conformance.worlds.blame",
    "conformance.worlds.diagnosis",
    "conformance.worlds.launched",
    "conformance.worlds.procmem",
    "conformance.worlds.registry",
    "conformance.worlds.runtimes",
    "conformance.worlds.runtimes.base",
    "conformance.worlds.runtimes.cpu",
    "conformance.worlds.runtimes.pjrt",
    "conformance.worlds.runtimes.pjrt_spmd",
    "conformance.worlds.runtimes.xrt",
    "conformance.worlds.spawned",
)
# Modules that defer every kit import, and why.
DEFERS_ALL = {"conformance.plugin": "it loads into every pytest session of the environment (pytest11); "
                                    "it imports the kit only when the kit's options or fixtures are used"}
HEAVY_LIBRARIES = ("torch", "numpy", "torch_xla", "hypothesis", "matplotlib")
# Libraries imported where used even in heavy modules: optional, slow, or global-state ones.
DEFERRED_LIBRARIES = ("torch_xla", "hypothesis", "matplotlib", "absl", "jinja2", "tqdm", "torch", "numpy",
                      # the engines' optional extras (conformance/impls/engines/): absent where not installed
                      "fairscale", "accelerate", "lightning_fabric", "deepspeed", "torchft",
                      "transformers")


def test_light_modules_import_no_heavy_library():
    code = ("import importlib, sys\n"
            f"for m in {LIGHT!r}:\n    importlib.import_module(m)\n"
            f"print(sorted(x for x in {HEAVY_LIBRARIES!r} if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def _import_targets(node, m, path, mods):
    pkg = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    parts = pkg.split(".")
    base = (".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if node.level else (node.module or ""))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]


def _top_level_graph(mods):
    graph = {}
    for m, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        graph[m] = {t for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                    for t in _import_targets(node, m, path, mods) if t in mods}
    return graph


def _reaches(graph, a, b):
    seen, stack = set(), [a]
    while stack:
        x = stack.pop()
        if x == b:
            return True
        if x not in seen:
            seen.add(x)
            stack.extend(graph.get(x, ()))
    return False


def test_imports_sit_at_the_top_unless_deferral_has_a_reason():
    """A function-level import must pull a heavy library (DEFERRED_LIBRARIES, or a heavier kit
    module from a LIGHT one), or close an import cycle if it moved to the top; anything else
    belongs at the top of the file, where a reader sees what the file uses."""
    mods = {m: p for m, p in _modules().items() if not m.startswith("conformance.tests")}
    graph = _top_level_graph(mods)
    offenders = []
    for m, path in mods.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or node in tree.body:
                continue
            if m in DEFERS_ALL or not isinstance(parents.get(node), (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # inside try/if/with: an optional or guarded import
            targets = _import_targets(node, m, path, mods)
            if any(t.split(".")[0] in DEFERRED_LIBRARIES for t in targets):
                continue
            kit = [t for t in targets if t in mods]
            if m in LIGHT and any(t not in LIGHT for t in kit):
                continue
            if m in LIGHT and any(t.split(".")[0] == "ddp_impl" for t in targets):
                continue  # ddp_impl imports torch: a light module (a runtime's facts) defers it
            if any(t == m or _reaches(graph, t, m) for t in kit):
                continue
            offenders.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, "move to the top of the file:\n" + "\n".join(offenders)
