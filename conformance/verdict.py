"""The verdict: what every case of the table produces, whatever its family.

A status is one of ``pass``, ``fail``, ``vacuous`` (the check could not have
failed), ``unsupported`` (the implementation lacks what the case needs; the
reason says what), ``skip`` (the case cannot run here; the reason says why) and
``xfail`` (a ``fail`` the user listed in an expected-failures file).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

STATUSES = ("pass", "fail", "vacuous", "unsupported", "skip", "xfail")
#: Statuses that make a run fail (exit code 1, a failed pytest test).
BAD = ("fail", "vacuous")


@dataclass
class Verdict:
    """Outcome of one check of one case on one (implementation, runtime, world size).

    Attributes:
        case: the case table row (``parity.linear``, ``feature.no_sync``, ...).
        check: the comparison inside the case (``param_parity``, ``agreement``, ...).
        max_dev: the deviation at the worst element (absolute, same unit as the
            compared values): the element with the largest deviation / bound.
            With rtol 0 the largest deviation.
        atol: the bound the verdict used at that element, ``atol + rtol * |reference|``
            (the name is kept for the JSON layout).
        margin: ``atol / max_dev`` (>= 1 within the bound, < 1 out of it; ``inf``
            when the deviation is 0); a ``pass`` never has margin < 1.
        movement: how far the reference moved (the vacuity guard's measure).
        first_bad_step: 1-based training step of the first violation, if any.
        replica: the first deviating replica (rank), where known.
        per_step: max deviation per step (plots; entry ``i`` is step ``i + 1``).
        diagnosis: full text of a failure (replica exceptions, stacks, the
            shrunk counterexample, the tensors out of bound); the table shows
            ``reason`` (its first sentence when long).
        example: the minimal failing scenario (JSON) of a scenario case.
        replicas: on a replica failure, one dict per replica (rank, host, pid,
            status, step, phase, last collective, exception, traceback, stacks,
            exit code, log tail: ``conformance.worlds.spawned.ReplicaError.diagnosis``).
        subject: ``"ddp"`` (the implementation under test, ``impl``) or ``"backend"``
            (the collectives beneath it; ``impl`` then names the backend, e.g. ``gloo``).
        programs: of a generated-scenario case, ``{"run": n, "left_out": {cause: count}}``: the
            scenarios judged and those not run (refused by the DDP, or holding a statement a
            replica crashed on); empty for the other cases. The coverage line counts them.
    """

    case: str
    check: str
    impl: str
    runtime: str
    model: str
    world_size: int
    status: str
    reason: str = ""
    max_dev: float = float("nan")
    atol: float = float("nan")
    margin: float = float("nan")
    movement: float = float("nan")
    first_bad_step: int | None = None
    replica: int | None = None
    per_step: list = field(default_factory=list)
    diagnosis: str = ""
    family: str = ""
    example: dict | None = None
    replicas: list = field(default_factory=list)
    subject: str = "ddp"
    programs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    @property
    def id(self) -> str:
        """Stable id: ``<case>:<check>[<impl>-<runtime>-w<W>]`` (expected-failures files use it)."""
        return f"{self.case}:{self.check}[{self.impl}-{self.runtime}-w{self.world_size}]"

    def summary(self) -> str:
        s = f"{self.id}: {self.status}"
        if not math.isnan(self.max_dev):
            s += f" (max dev {self.max_dev:.3g}, bound {self.atol:.3g}, margin {self.margin:.3g}x"
            if self.first_bad_step is not None:
                s += f", first bad step {self.first_bad_step}"
            if self.replica is not None:
                s += f", replica {self.replica}"
            s += ")"
        return s + (f": {self.reason}" if self.reason else "")

    def to_json(self) -> dict:
        d = asdict(self)
        d["id"] = self.id
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        """Inverse of :meth:`to_json` (``None`` numbers come back as NaN)."""
        nums = ("max_dev", "atol", "margin", "movement")
        fields = cls.__dataclass_fields__
        return cls(**{k: (float("nan") if k in nums and v is None else v)
                      for k, v in d.items() if k in fields})
