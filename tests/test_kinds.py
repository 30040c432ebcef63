"""conformance.cases.kinds: the Kind objects and their one registry. docs/extending.md lists the
kinds as the registry has them; a kind added by its module and one registry line is validated
and evaluated with no other change."""
import os
import re
import sys
import textwrap

import pytest

from conformance.cases.kinds import KINDS, REGISTRY, Kind, Registration
from conformance.cases.row import Case
from conformance.impls.row import STRATEGY_KINDS
from conformance.worlds.pool import Pool

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROW = re.compile(r"^\s*\| `(\w+)` \| `([\w/]+\.py)` \| (yes|no) \| (yes|no) \|\s*$")


def _doc_kinds(text):
    """``{kind: (module path, needs an implementation, searches)}`` of the doc's kind table."""
    return {m[1]: (m[2], m[3] == "yes", m[4] == "yes") for m in map(_ROW.match, text.splitlines()) if m}


def test_the_doc_lists_the_registry():
    from conformance.cases.validation import kinds
    with open(os.path.join(REPO, "docs", "extending.md")) as f:
        doc = _doc_kinds(f.read())
    loaded = kinds()
    want = {name: (line.module.replace(".", "/") + ".py", line.needs_impl, loaded[name].searches)
            for name, line in REGISTRY.items()}
    assert doc == want


def test_the_doc_reader_reads_a_row():
    assert _doc_kinds("  | `x` | `a/b.py` | no | yes |\n| kind | module |") == {"x": ("a/b.py", False, True)}


def test_strategy_kinds_are_the_kinds_that_need_an_implementation():
    assert STRATEGY_KINDS == tuple(k for k in KINDS if REGISTRY[k].needs_impl)
    assert Registration("conformance.cases.invariant.kind").package == "conformance.cases.invariant"
    assert Registration("conformance.cases.train.kind").package == "conformance.cases.train"


def test_a_registered_module_without_its_kind_is_refused(monkeypatch):
    from conformance.cases import validation
    monkeypatch.setattr(validation, "_KINDS", {})
    monkeypatch.setitem(REGISTRY, "nothing", Registration("conformance.verdict"))
    with pytest.raises(ValueError, match="conformance.verdict must declare KIND = Kind"):
        validation.kinds()


_PROBE = '''
from conformance.cases.kinds import Kind
from conformance.verdict import Verdict


def evaluate_probe(case, impl, runtime, w, session, overrides):
    return [Verdict(case.name, c, impl, runtime, case.model, w, "pass", reason=repr(sorted(overrides)))
            for c in case.checks]


KIND = Kind("probe", evaluate_probe, validate=lambda case: None if case.args.get("ok") else "not ok",
            requires=lambda case: ("no_sync",), searches=True)
'''


class NoPool(Pool):
    """A pool the test never asks for a world."""

    def get(self, world):
        raise AssertionError(f"no world is needed here, asked for {world}")

    def close(self):
        pass


@pytest.mark.cpu
def test_a_new_kind_is_its_module_and_one_registry_line(tmp_path, monkeypatch):
    """The module and the registry line are all validation and evaluate need."""
    import conformance.evaluate as ev
    from conformance.cases import validation
    (tmp_path / "probe_kind.py").write_text(textwrap.dedent(_PROBE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(validation, "_KINDS", {})
    monkeypatch.setitem(REGISTRY, "probe", Registration("probe_kind"))
    monkeypatch.delitem(sys.modules, "probe_kind", raising=False)
    loaded = validation.kinds()
    assert isinstance(loaded["probe"], Kind)
    row = Case("feature.probe", "feature", "a probe", "probe", "linear", checks=("seen",), args={"ok": True})
    assert list(validation.validate([row], mutants={})) == ["feature.probe"]
    with pytest.raises(ValueError, match="row 'feature.probe': not ok"):
        validation.validate([Case("feature.probe", "feature", "-", "probe", "linear", checks=("seen",))], mutants={})
    monkeypatch.setattr(ev, "KINDS", loaded)
    session = ev.Session(pool=NoPool())
    verdicts = ev.evaluate(row, "ref", "cpu", 2, session=session)
    # searches=True: evaluate hands the evaluator its shrink flag
    assert [(v.check, v.status, v.reason) for v in verdicts] == [("seen", "pass", "['shrink']")]
