"""docs/glossary.md and the code use the same words (issue 28 item 5): a term the glossary
marks *not used* appears nowhere in the kit's code, and the glossary's lists of replica
states and kill results are the code's."""
import ast
import dataclasses
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
GLOSSARY = (ROOT / "docs" / "glossary.md").read_text()
CODE_DIRS = ("conformance", "ddp_impl", "fixtures", "benchmarks")


def _code_files():
    return sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py"))


def not_used_terms(text: str) -> list[str]:
    """The terms of every ``*Not used: a, b (why).*`` of the glossary."""
    terms = []
    for group in re.findall(r"\*Not used: ([^*]+)\*", text):
        for term in re.sub(r"\([^)]*\)", "", group).rstrip(". ").split(","):
            terms.append(term.strip())
    return [t for t in terms if t]


def uses(term: str, files) -> list[str]:
    """``path:line`` of every whole-word, case-sensitive use of ``term`` in ``files``."""
    pat = re.compile(r"(?<![\w.])" + r"\s+".join(map(re.escape, term.split())) + r"(?!\w)")
    return [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{i}" for p in files
            for i, line in enumerate(p.read_text().splitlines(), 1) if pat.search(line)]


def listed_after(text: str, lead: str) -> list[str]:
    """The backticked words of ``text`` after ``lead``, up to the first ``(`` or ``;``."""
    tail = re.split(r"[(;]", text.split(lead, 1)[1], maxsplit=1)[0]
    return re.findall(r"`([^`]+)`", tail)


def test_the_glossary_marks_terms_not_used():
    assert {"target row", "SearchWorld", "harness"} <= set(not_used_terms(GLOSSARY))


def test_no_term_marked_not_used_appears_in_the_code():
    files = _code_files()
    found = {t: uses(t, files) for t in not_used_terms(GLOSSARY)}
    assert {t: u for t, u in found.items() if u} == {}


def test_the_not_used_check_finds_a_use(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("x = 1  # the harness runs it\nSearchWorldly = 2\n")
    assert [u.rsplit(":", 1)[1] for u in uses("harness", [f])] == ["1"]
    assert uses("SearchWorld", [f]) == []
    assert not_used_terms("*Not used: a, b c (why).* and *Not used: d.*") == ["a", "b c", "d"]


def test_replica_states_are_the_codes():
    from conformance.worlds.diagnosis import REPLICA_STATES
    assert listed_after(GLOSSARY, "*replica state* is one of") == list(REPLICA_STATES)


def test_every_replica_state_is_explained_by_blame():
    from conformance.worlds.blame import Blame
    from conformance.worlds.diagnosis import REPLICA_STATES
    assert [s for s in REPLICA_STATES if f"``{s}``" not in Blame.__doc__] == []


def test_kill_results_are_the_codes():
    from conformance.report.kills import KILL_RESULTS
    assert listed_after(GLOSSARY, "**kill result** is one of") == list(KILL_RESULTS)


def test_no_string_in_the_code_spells_a_kill_result_otherwise():
    """``KILL``/``SURVIVED``/``Killed``...: a kill result is spelled from ``KILL_RESULTS`` only."""
    from conformance.report.kills import KILL_RESULTS
    bad = []
    for p in _code_files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.lower() in ("kill", "killed", "survived") and node.value not in KILL_RESULTS:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert bad == []


def test_tolerance_fields_are_documented_and_are_the_report_keys():
    """A renamed ``Tolerance`` field would change the JSON report's ``tolerances`` keys: the
    recorded report's keys are the fields, each named in the class docstring; the glossary
    names the setup and bound fields a tolerance row holds."""
    from conformance.tolerances import Tolerance
    fields = [f.name for f in dataclasses.fields(Tolerance)]
    doc = json.loads((ROOT / "tests" / "data" / "report-keys.json").read_text())
    assert list(doc["tolerances"][0]) == fields
    assert [f for f in fields if not re.search(rf"\b{f}\b", Tolerance.__doc__)] == []
    entry = GLOSSARY.split("**tolerance row**", 1)[1].split("\n- ", 1)[0]
    assert [f for f in ("lr", "steps", "global_batch", "seed", "atol", "rtol", "loss_atol")
            if f"`{f}`" not in entry] == []


def test_the_search_runner_is_named_as_the_glossary_says():
    from conformance.cases.shared import search
    assert "SearchRunner" in GLOSSARY and hasattr(search, "SearchRunner")
    assert not hasattr(search, "SearchWorld")
