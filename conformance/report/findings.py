"""The defects the kit measured in torch, torch_xla and gloo (docs/findings.md), shipped as data
and applied by every run: a verdict they name that fails is ``xfail`` naming the finding, and a
warning says when one stops failing on the installed version.

Each file under ``findings/`` holds expected-failure entries (:mod:`conformance.report.expected`)
measured on one runtime and one release line of one package (:data:`FILES`); a file applies only
where that package's installed version starts with the release it names, so a finding measured
on torch 2.13 does not hide a failure on 2.14. ``strict`` (``--strict-findings``) applies none.

Reads package metadata only: no torch import (the pytest plugin loads it).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from conformance.report.expected import ExpectedFailures, parse_expected_failures

FOLDER = Path(__file__).with_name("findings")


@dataclass(frozen=True)
class FindingsFile:
    """One file of findings: ``name`` under :data:`FOLDER`, measured on ``package`` at release
    ``release`` (a version prefix, ``"2.13"`` matches 2.13.0 and 2.13.1, not 2.130)."""

    name: str
    package: str
    release: str

    def installed(self) -> str | None:
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return None

    def applies(self) -> bool:
        v = self.installed()
        return v is not None and (v == self.release or v.startswith(self.release + "."))

    def entries(self) -> ExpectedFailures:
        return parse_expected_failures((FOLDER / self.name).read_text(encoding="utf-8"), shipped=True)


#: Every file of findings the kit ships.
FILES = (
    FindingsFile("cpu-torch-2.13.txt", "torch", "2.13"),
    FindingsFile("cpu-torch-2.13-shipped-paths.txt", "torch", "2.13"),
    FindingsFile("pjrt-torch_xla-2.9.txt", "torch_xla", "2.9"),
    FindingsFile("cpu-fairscale-0.4.13.txt", "fairscale", "0.4.13"),
    FindingsFile("cpu-accelerate-1.16.txt", "accelerate", "1.16"),
    FindingsFile("cpu-deepspeed-0.19.8.txt", "deepspeed", "0.19.8"),
    FindingsFile("cpu-lightning-fabric-2.6.txt", "lightning-fabric", "2.6"),
    FindingsFile("cpu-torchft-0.2.0.txt", "torchft", "0.2.0"),
)


@dataclass(frozen=True)
class KitFindings:
    """What a run applies: ``expected`` (the entries), ``applied`` / ``not_applied`` (file
    names, the latter with why), ``strict`` (``--strict-findings``)."""

    expected: ExpectedFailures
    applied: tuple
    not_applied: tuple
    strict: bool

    def to_json(self) -> dict:
        return {"strict": self.strict, "applied": list(self.applied),
                "not_applied": [{"file": f, "why": why} for f, why in self.not_applied]}


def kit_findings(strict: bool = False) -> KitFindings:
    """The findings this installation applies (none when ``strict``)."""
    expected, applied, skipped = ExpectedFailures(), [], []
    for f in FILES:
        if strict:
            skipped.append((f.name, "--strict-findings"))
        elif f.applies():
            expected = expected + f.entries()
            applied.append(f.name)
        else:
            skipped.append((f.name, f"measured on {f.package} {f.release}, installed "
                                    f"{f.installed() or 'none'}"))
    return KitFindings(expected, tuple(applied), tuple(skipped), strict)


def run_expectations(user: ExpectedFailures | None, strict: bool = False) -> tuple[ExpectedFailures, KitFindings]:
    """The expected failures of a run: the user's own file (``--expected-failures``) and the
    kit's findings (:func:`kit_findings`)."""
    kit = kit_findings(strict)
    return (user or ExpectedFailures()) + kit.expected, kit
