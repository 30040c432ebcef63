"""No module of ``conformance/`` is over ~500 lines without a reason in its docstring: a module
longer than :data:`LIMIT` says "Long because ..." (a data table, a single template renderer,
...) in its module docstring, or is split."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMIT = 500
MARKER = "Long because"


def long_modules() -> dict[str, int]:
    """``{path: lines}`` of every module under conformance/ longer than :data:`LIMIT`."""
    out = {}
    for p in sorted((ROOT / "conformance").rglob("*.py")):
        n = len(p.read_text().splitlines())
        if n > LIMIT:
            out[p.relative_to(ROOT).as_posix()] = n
    return out


def unexplained(paths) -> list[str]:
    return [p for p in paths if MARKER not in (ast.get_docstring(ast.parse((ROOT / p).read_text())) or "")]


def test_every_long_module_says_why():
    assert unexplained(long_modules()) == []


def test_the_split_modules_are_short():
    """The modules that were split stay split, without a reason to be long."""
    long = long_modules()
    for p in ("conformance/worlds/spawned.py", "conformance/worlds/host.py", "conformance/worlds/failure.py",
              "conformance/cases/scenario/format.py", "conformance/impls/mutants/catalog.py",
              "conformance/report/html.py"):
        assert (ROOT / p).is_file() and p not in long, p
