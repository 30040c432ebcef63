"""The layout page (docs/layout.md, linked from the README) matches the tree: every package of
``conformance/`` and ``conformance/cases/`` is named there, and every folder and module it names
exists."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"


def layout_block(text: str) -> str:
    """The code block under the layout page's ``## Layout`` heading."""
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def named(block: str) -> tuple[set[str], set[str]]:
    """``(folders, modules)`` the block names: ``name/`` and ``name.py`` tokens."""
    folders = set(re.findall(r"(?<![\w.])([a-z_]+)/", block))
    modules = set(re.findall(r"(?<![\w/])([a-z_]+\.py)\b", block))
    return folders, modules


def packages(base: pathlib.Path) -> set[str]:
    return {p.name for p in base.iterdir() if (p / "__init__.py").is_file()}


def test_every_package_is_named():
    folders, _ = named(layout_block(LAYOUT.read_text()))
    for base in (ROOT / "conformance", ROOT / "conformance" / "cases"):
        missing = packages(base) - folders - {"tests"}
        assert not missing, f"{base.relative_to(ROOT)}: {sorted(missing)} not in docs/layout.md"


def test_every_name_exists():
    folders, modules = named(layout_block(LAYOUT.read_text()))
    dirs = {p.name for p in ROOT.rglob("*") if p.is_dir() and ".tox" not in p.parts}
    files = {p.name for p in (ROOT / "conformance").rglob("*.py")}
    assert not folders - dirs, sorted(folders - dirs)
    assert not modules - files, sorted(modules - files)


def test_the_reader_finds_a_stale_name():
    folders, modules = named("conformance/  cases/  gone/  old.py  kind.py\n")
    assert {"gone", "cases"} <= folders and "old.py" in modules
    assert "gone" not in {p.name for p in (ROOT / "conformance").iterdir()}


def test_the_readme_links_the_layout_and_fits_on_a_screen_or_two():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/layout.md)" in readme
    assert len(readme.encode()) <= 5000, f"README.md is {len(readme.encode())} bytes: move detail to docs/"
