"""Expected-failures files: which ``fail`` and ``vacuous`` verdicts a run reports as ``xfail``
(the format and the warnings: docs/configuration.md, "Expected-failures files").

One entry a line, ``#`` starts a comment: a case, ``case:check``, one verdict id, or any of these
with the wildcards ``*`` (any text, ``:`` and brackets included) and ``?`` (one character);
brackets are literal (the id's own: ``fnmatch``'s ``[seq]`` classes would clash with them). A line
that is no entry at all (:func:`malformed`) makes :func:`read_expected_failures` refuse the file.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

from conformance.cases.row import FAMILIES
from conformance.errors import UsageError
from conformance.verdict import BAD, Verdict

# <case>[:<check>[<impl>-<runtime>-w<W>]], each part may hold * and ?; a wildcard case part may
# stand alone (``*``, ``parity.*``, ``*[ref-cpu-w2]``: ``*`` spans ``:``).
_ENTRY = re.compile(r"(?P<case>[\w.*?-]+)(?::(?P<check>[\w.*?-]+))?(?:\[(?P<id>[^\[\]\s]+)\])?")
_ID = re.compile(r".+-[a-z0-9_*?]+-w[\d?]+")  # <impl>-<runtime>-w<W> without a *


def malformed(entry: str) -> str | None:
    """Why ``entry`` can name no verdict id at all (random words, binary junk), else ``None``.
    Well-formed entries that match nothing in a run are warnings, not errors."""
    m = _ENTRY.fullmatch(entry)
    if not m:
        return "not <case>[:<check>[<impl>-<runtime>-w<W>]]"
    case, wild = m["case"], "*" in m["case"] or "?" in m["case"]
    family = case.split(".", 1)[0]
    if not wild and ("." not in case or family not in FAMILIES):
        return f"a case name is <family>.<name>, family one of {', '.join(FAMILIES)}"
    if m["id"] is not None:
        if m["check"] is None and not wild:
            return "a verdict id is <case>:<check>[...]"
        if "*" not in m["id"] and not _ID.fullmatch(m["id"]):
            return "the bracket holds <impl>-<runtime>-w<W>"
    return None


def _regex(entry: str) -> re.Pattern:
    pattern = entry
    if "[" not in pattern:  # a case or a case:check names every verdict under it
        pattern += "[*]" if ":" in pattern else ":*"
    return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern),
                      re.DOTALL)


class ExpectedFailures:
    """The entries of one expected-failures file; ``vid in expected`` tells whether an
    entry covers verdict id ``vid``. Iterating gives the entries (strings).

    ``notes``: entry -> its line's comment (the xfail reason names it, e.g. the finding);
    ``shipped``: entries the kit ships (:mod:`conformance.report.findings`), which are not
    warned about when a run has no verdict they match (most runs select few cases)."""

    def __init__(self, entries=(), notes=None, shipped=()):
        self.entries = list(dict.fromkeys(e.strip() for e in entries if e and e.strip()))
        self._regexes = [(e, _regex(e)) for e in self.entries]
        self.notes = dict(notes or {})
        self.shipped = frozenset(shipped)

    def __add__(self, other: "ExpectedFailures") -> "ExpectedFailures":
        listed = (set(self.entries) - self.shipped) | (set(other.entries) - other.shipped)  # a user's own
        return ExpectedFailures(self.entries + other.entries, {**other.notes, **self.notes},
                                (self.shipped | other.shipped) - listed)

    def note(self, vid: str) -> str:
        """The comment of the first entry covering ``vid`` that has one (``""``: none)."""
        return next((self.notes[e] for e in self.matching(vid) if self.notes.get(e)), "")

    def matching(self, vid: str) -> list[str]:
        """The entries that cover verdict id ``vid``."""
        return [e for e, rx in self._regexes if rx.fullmatch(vid)]

    def __contains__(self, vid) -> bool:
        return any(rx.fullmatch(vid) for _, rx in self._regexes)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"ExpectedFailures({self.entries!r})"


def _as_expected(expected) -> ExpectedFailures:
    return expected if isinstance(expected, ExpectedFailures) else ExpectedFailures(expected or ())


def parse_expected_failures(text: str, shipped: bool = False) -> ExpectedFailures:
    """The entries of a file's text, each with its line's comment as its note (blank lines
    and comment lines dropped); ``shipped``: the kit's own findings."""
    pairs = [(a.strip(), b.strip()) for a, _, b in (ln.partition("#") for ln in text.splitlines())]
    entries = [e for e, _ in pairs if e]
    return ExpectedFailures(entries, {e: n for e, n in pairs if e and n}, entries if shipped else ())


def read_expected_failures(path: str) -> ExpectedFailures:
    """The entries of the file at ``path``.

    Raises:
        UsageError: the file cannot be read, is not UTF-8 text, or has a line that is no
            entry (:func:`malformed`) (one line).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"--expected-failures {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--expected-failures {path}: not a text file (byte 0x{data[exc.start]:02x} at "
                         f"offset {exc.start} is not UTF-8); list verdict ids, one a line") from None
    if "\x00" in text:
        raise UsageError(f"--expected-failures {path}: not a text file (NUL byte at offset "
                         f"{text.index(chr(0))}); list verdict ids, one a line")
    entries = [(n, ln.split("#", 1)[0].strip()) for n, ln in enumerate(text.splitlines(), 1)]
    bad = [(n, e, why) for n, e in entries if e and (why := malformed(e))]
    if bad:
        n, e, why = bad[0]
        shown = e if len(e) <= 60 else e[:57] + "..."
        more = f" (and {len(bad) - 1} more malformed line(s))" if len(bad) > 1 else ""
        raise UsageError(f"--expected-failures {path}: line {n}: {shown!r} is not an entry ({why}){more}; "
                         "list cases, case:checks, verdict ids or * patterns, one a line")
    return parse_expected_failures(text)


def mark_expected_failures(verdicts: list[Verdict], expected) -> None:
    """Turn every listed ``fail`` / ``vacuous`` verdict into ``xfail`` (in place)."""
    expected = _as_expected(expected)
    if not expected:
        return
    for v in verdicts:
        if v.status in BAD and v.id in expected:
            was, note = v.status, expected.note(v.id)
            v.status = "xfail"
            why = ", ".join(x for x in (was if was != "fail" else "", note) if x)
            v.reason = f"expected failure{f' ({why})' if why else ''}: " + v.reason


def note_inherited(verdicts: list[Verdict], expected, parent: str) -> None:
    """Name, on every ``fail`` / ``vacuous`` verdict whose id under implementation ``parent`` (the
    row whose code the DDP under test inherits, ``builtin.inherits_from``) is a listed failure,
    that finding (in place). The status stays: the DDP under test has the inherited defect."""
    expected = _as_expected(expected)
    for v in verdicts:
        pid = replace(v, impl=parent).id
        if v.status in BAD and v.impl != parent and pid in expected:
            v.reason = (f"inherited from {parent}, which fails it too ({expected.note(pid) or pid}; list it "
                        "in --expected-failures to expect it): " + v.reason)


def expected_failure_warnings(verdicts: list[Verdict], expected) -> list[str]:
    """One warning per entry that matches no verdict, or whose verdicts all ran without
    failing (an ``xfail`` verdict counts as failing: it was listed and failed)."""
    expected = _as_expected(expected)
    statuses: dict[str, Counter] = {e: Counter() for e in expected}
    for v in verdicts:
        for e in expected.matching(v.id):
            statuses[e][v.status] += 1
    warnings = []
    for e, st in statuses.items():
        what = (f"the kit's finding {e} ({expected.notes[e]})" if e in expected.shipped and expected.notes.get(e)
                else f"expected failure {e}")
        if not st:
            if e not in expected.shipped:
                warnings.append(f"{what} matches no verdict of this run")
        elif not any(st[s] for s in BAD + ("xfail",)):
            if sum(st.values()) == 1:
                warnings.append(f"{what} no longer fails (status {next(iter(st))})")
            else:
                warnings.append(f"{what} no longer fails (its {sum(st.values())} verdicts: "
                                + ", ".join(f"{n} {s}" for s, n in sorted(st.items())) + ")")
    return warnings


def apply_expected_failures(verdicts: list[Verdict], expected) -> list[str]:
    """:func:`mark_expected_failures`, then :func:`expected_failure_warnings` for these verdicts."""
    mark_expected_failures(verdicts, expected)
    return expected_failure_warnings(verdicts, expected)
