"""Every ``__all__`` of the kit's modules (the public façades: ``conformance``,
``conformance.cases``, ``conformance.worlds.runtimes``, ...) names what exists (issue 28
item 5): each name resolves on a fresh import and ``from <module> import *`` works."""
import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def modules_with_all() -> dict[str, list[str]]:
    """``{module: its __all__}`` of every module under conformance/ assigning a literal
    ``__all__`` (a list or ``sorted(<dict name>)`` of a literal dict) at module level."""
    out = {}
    for path in sorted((ROOT / "conformance").rglob("*.py")):
        tree = ast.parse(path.read_text())
        consts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Name)}
        value = consts.get("__all__")
        if value is None:
            continue
        if isinstance(value, ast.Call) and isinstance(value.args[0], ast.Name):
            value = consts[value.args[0].id]
            names = [k.value for k in value.keys]
        else:
            names = [e.value for e in value.elts]
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = names
    return out


def test_the_facades_are_found():
    mods = modules_with_all()
    assert {"conformance", "conformance.cases", "conformance.worlds.runtimes"} <= set(mods)
    assert mods["conformance"] == ["Strategy", "UserModel"]


def test_every_name_in_all_exists_and_imports():
    """In a fresh interpreter: ``getattr`` of each name, ``from m import *`` binding all of
    them, no name listed twice."""
    script = (
        "import importlib, json, sys\n"
        "mods = json.loads(sys.argv[1]); bad = []\n"
        "for m, names in mods.items():\n"
        "    mod = importlib.import_module(m)\n"
        "    if sorted(mod.__all__) != sorted(names) or len(set(names)) != len(names):\n"
        "        bad.append(f'{m}: __all__ {mod.__all__!r}')\n"
        "    bad += [f'{m}.{n}: missing' for n in names if not hasattr(mod, n)]\n"
        "    ns = {}\n"
        "    exec(f'from {m} import *', ns)\n"
        "    bad += [f'{m}.{n}: not bound by import *' for n in names if n not in ns]\n"
        "print(json.dumps(bad))\n")
    r = subprocess.run([sys.executable, "-c", script, json.dumps(modules_with_all())], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
