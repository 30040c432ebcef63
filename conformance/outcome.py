"""Verdicts -> one test outcome, for every face (pytest plugin, absltest, CLI).

A case evaluated for one (implementation, runtime, world size) gives several verdicts
(one per check). A face reports one outcome for them:

=========  ======================================================================
outcome    when
=========  ======================================================================
fail       some verdict is ``fail`` or ``vacuous`` (a check that could not fail
           is a failure of the run, never a pass)
xfail      no verdict is bad and some verdict is ``xfail`` (listed as expected)
skip       every verdict is ``unsupported`` or ``skip`` (the reason is the first one's)
pass       otherwise (at least one verdict passed)
=========  ======================================================================

pytest maps them to ``pytest.fail`` / ``pytest.xfail`` / ``pytest.skip``; absltest, which
has no run-time expected failure, reports ``xfail`` as a skip whose reason starts with
``expected failure``. Every ``fail`` message ends with the command that reproduces it.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from conformance.settings import Settings
from conformance.verdict import BAD, Verdict
from conformance.cases.usermodel import is_model_spec

OUTCOMES = ("pass", "fail", "xfail", "skip")


@dataclass(frozen=True)
class Outcome:
    """``kind`` is one of :data:`OUTCOMES`; ``message`` is what the face prints."""

    kind: str
    message: str = ""


def repro_command(v: Verdict, settings: Settings | None = None) -> str:
    """The main command that reruns the case of ``v`` alone, for its implementation, runtime
    and world size (shell-quoted); with the run's ``settings``, also the replica timeout and
    profile where they differ from the defaults (a hang reproduced at its bound)."""
    args = ["python", "-m", "conformance", "run", "--ddp", v.impl, "--runtime", v.runtime,
            "--world-size", str(v.world_size), "--only", v.case]
    if is_model_spec(v.model):  # a case of the user's model (--model)
        args += ["--model", v.model]
    if settings is not None:
        default = Settings()
        if settings.replica_timeout != default.replica_timeout:
            args += ["--replica-timeout", f"{settings.replica_timeout:g}"]
        if settings.profile != default.profile:
            args += ["--profile", settings.profile]
        if settings.backend != default.backend:
            args += ["--backend", settings.backend]
    return " ".join(shlex.quote(a) for a in args)


def outcome(verdicts: list[Verdict]) -> Outcome:
    """The one outcome of a case's verdicts (table in the module docstring).

    Raises:
        ValueError: no verdicts (a case always gives at least one).
    """
    if not verdicts:
        raise ValueError("a case gave no verdicts")
    bad = [v for v in verdicts if v.status in BAD]
    if bad:
        details = "\n".join(dict.fromkeys(v.diagnosis for v in bad if v.diagnosis))
        repro = "\n".join(dict.fromkeys(repro_command(v) for v in bad))
        return Outcome("fail", "\n".join(v.summary() for v in bad) + ("\n\n" + details if details else "")
                       + "\nreproduce: " + repro)
    if any(v.status == "xfail" for v in verdicts):
        return Outcome("xfail", "expected failure: " + "; ".join(v.summary() for v in verdicts
                                                                 if v.status == "xfail"))
    if all(v.status in ("unsupported", "skip") for v in verdicts):
        return Outcome("skip", f"{verdicts[0].status}: {verdicts[0].reason}")
    return Outcome("pass")
