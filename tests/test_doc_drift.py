"""Docs that state facts of the code say them as the code does (issue 29 item 7f)."""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def report_keys_undocumented(doc: dict) -> list[str]:
    """Keys of a run report (top level and per verdict) that docs/report-format.md does not name:
    top-level keys as words of its layout block, verdict keys as `key` cells of its table."""
    text = (ROOT / "docs" / "report-format.md").read_text()
    block = text.split("```", 2)[1]
    table = text.split("A verdict (", 1)[1]
    missing = [k for k in doc if not re.search(rf"(?<![\w.]){re.escape(k)}(?![\w])", block)]
    for v in doc.get("verdicts", [])[:1] + [v for k in doc.get("kill_matrix", []) for v in k["verdicts"]][:1]:
        missing += [f"verdicts[].{k}" for k in v if f"`{k}`" not in table]
    return sorted(set(missing))


def test_report_format_names_every_key_of_a_recorded_report():
    """A report the CLI wrote (parity, W=2, issue 29's run) has no key the page leaves out."""
    doc = json.loads((ROOT / "tests" / "data" / "report-keys.json").read_text())
    assert report_keys_undocumented(doc) == []


def test_the_key_check_finds_a_missing_key():
    assert report_keys_undocumented({"kit": 1, "no_such_key": 2, "verdicts": [{"id": 1, "nope": 2}]}) \
        == ["no_such_key", "verdicts[].nope"]


def test_extending_states_the_subgroups_world_sizes():
    from conformance.cases.table import CASES
    sizes = repr(CASES["feature.subgroups"].world_sizes).replace("'", '"')
    assert f"`feature.subgroups`: `{sizes}`" in (ROOT / "docs" / "extending.md").read_text()


def test_tox_messages_point_to_sections_that_exist():
    """A ``see <file>, <section>`` in tox.ini names a file of the repository and a heading in it."""
    refs = re.findall(r"see ([\w./-]+\.md), ([A-Za-z][\w ]*?)[)'\"]", (ROOT / "tox.ini").read_text())
    assert refs, "tox.ini has no 'see <file>, <section>' reference any more: drop this test"
    for path, section in refs:
        assert (ROOT / path).is_file(), path
        headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.M)
        assert section in headings, (path, section, headings)


def test_no_install_hint_names_the_kit_on_pypi():
    """The kit is installed from a clone (README), so a hint ``pip install 'ddp-conformance[...]'``
    cannot work (issue 29 item 7e): hints say ``pip install -e '.[extra]'``."""
    bad = [f"{p.relative_to(ROOT)}:{n}" for top in ("conformance", "ddp_impl") for p in (ROOT / top).rglob("*.py")
           for n, line in enumerate(p.read_text().splitlines(), 1) if "ddp-conformance[" in line]
    assert bad == []
