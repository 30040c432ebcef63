"""tests/README.md indexes the meta-tests by the module(s) they test (issue 28 item 5): every
``tests/test_*.py`` is listed, every listed file exists, and every module it names exists."""
import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def index_rows() -> dict[str, str]:
    """``{file: module cell}`` of the README's table."""
    rows = re.findall(r"^\| `(test_\w+\.py)` \| ([^|]+) \|", (TESTS / "README.md").read_text(), re.M)
    return dict(rows)


def test_every_test_file_is_listed():
    on_disk = {p.name for p in TESTS.glob("test_*.py")}
    assert sorted(on_disk - set(index_rows())) == []


def test_every_listed_file_exists():
    assert sorted(f for f in index_rows() if not (TESTS / f).exists()) == []


def test_every_named_module_exists():
    """A dotted ``conformance.``/``ddp_impl`` name in the module column is a module (or an
    attribute of one: ``conformance.Strategy``)."""
    bad = []
    for f, cell in index_rows().items():
        for name in re.findall(r"`((?:conformance|ddp_impl)(?:\.\w+)*)`", cell):
            if importlib.util.find_spec(name) is not None:
                continue
            parent, _, attr = name.rpartition(".")
            spec = importlib.util.find_spec(parent) if parent else None
            if spec is None or not re.search(rf"^(class|def) {attr}\b|^{attr} =|import .*\b{attr}\b",
                                             pathlib.Path(spec.origin).read_text(), re.M):
                bad.append(f"{f}: {name}")
    assert bad == []
