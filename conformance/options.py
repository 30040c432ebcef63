"""Validation of the options every face shares (CLI, pytest plugin, absltest):
runtimes, world sizes, implementations. Bad input raises
:class:`~conformance.errors.UsageError` with the one line to print."""
from __future__ import annotations

import importlib.util
import os
import sys

from conformance.errors import UsageError, split_list
from conformance.settings import default_impls, default_world_sizes, max_world_size
from conformance.tolerances import MIN_WORLD_SIZE
from conformance.worlds.runtimes import get_runtime, RUNTIMES, RuntimeUnavailable


def parse_world_sizes(value: str | None, runtime: str = "cpu") -> list[int]:
    """World sizes of ``value`` (a comma list), else the runtime's defaults
    (:func:`conformance.settings.default_world_sizes`, the adapter's)."""
    if not value:
        return list(default_world_sizes(runtime))
    try:
        sizes = [int(w) for w in split_list(value)]
    except ValueError:
        raise UsageError(f"--world-size: not a comma list of integers: {value!r}") from None
    if not sizes or min(sizes) < MIN_WORLD_SIZE:
        raise UsageError(f"--world-size: parity checks need world size >= {MIN_WORLD_SIZE}, got {value!r}")
    return sizes


def check_world_size_range(sizes, runtime: str) -> None:
    """Refuse a world size above what ``runtime`` runs, naming the range the faces accept.

    Raises:
        UsageError: a size above the runtime's :func:`conformance.settings.max_world_size`.
    """
    top = max_world_size(runtime)
    big = [w for w in sizes if top is not None and w > top]
    if big:
        raise UsageError(f"--world-size {big[0]}: runtime {runtime} runs world sizes "
                         f"{MIN_WORLD_SIZE}..{top}")


def case_world_sizes(case, runtime: str) -> list[int]:
    """The world sizes ``case`` runs at by default on ``runtime``: its own
    (``Case.world_sizes``, e.g. ``feature.subgroups`` at W=3 and 4 on cpu), else
    the runtime's (:func:`conformance.settings.default_world_sizes`)."""
    return list(case.world_sizes.get(runtime, default_world_sizes(runtime)))


def cases_world_sizes(cases, runtime: str) -> list[int]:
    """Every world size some of ``cases`` runs at by default on ``runtime`` (sorted; empty
    without cases)."""
    return sorted({w for c in cases for w in case_world_sizes(c, runtime)})


def case_runs_at(case, runtime: str, world_size: int, explicit) -> bool:
    """Whether ``case`` runs at ``world_size`` on ``runtime``: always when world sizes were
    given (``explicit`` true: the ``--world-size`` value, or a launcher's world), else at its
    :func:`case_world_sizes`."""
    return bool(explicit) or world_size in case_world_sizes(case, runtime)


def parse_impl_names(value: str | None, runtime: str) -> list[str]:
    """Implementation specs (default: the runtime's); each resolved once to validate it."""
    from conformance.impls.builtin import ImplSpecError, parse_impls
    try:
        return [i.name for i in parse_impls(value or ",".join(default_impls(runtime)), runtime)]
    except ImplSpecError as exc:
        raise UsageError(str(exc)) from None


def parse_runtime_names(value: str | None) -> list[str]:
    """Runtime names of a comma list (names only: whether one runs here is :func:`parse_runtimes`).

    Raises:
        UsageError: empty, or a name no runtime has.
    """
    runtimes = split_list(value)
    if not runtimes:
        raise UsageError("--runtime is empty")
    for rt in runtimes:
        if rt not in RUNTIMES:
            raise UsageError(f"--runtime: unknown runtime {rt!r}; known: {', '.join(RUNTIMES)}")
    return runtimes


def parse_runtimes(value: str | None, sizes: list[int], strict: bool = True) -> list[str]:
    """Runtime names; with ``strict`` a runtime that cannot run here is a usage error."""
    runtimes = parse_runtime_names(value)
    for rt in runtimes:
        if strict:
            for w in sizes:
                try:
                    get_runtime(rt).check(w)
                except RuntimeUnavailable as exc:
                    raise UsageError(f"--runtime {rt}: {exc}") from None
    return runtimes


def parse_matrix(runtime: str | None, world_size: str | None, ddp: str | None,
                  launcher: str = "spawn", cases=None) -> list[tuple[str, int, list[str]]]:
    """``[(runtime, world_size, [impl, ...])]`` for the CLI and absltest faces.

    Without ``world_size`` and with ``cases`` (rows of the case table), the world sizes are
    every one some case runs at by default (:func:`case_world_sizes`); a face then runs a
    case only at its own (:func:`case_runs_at`).

    With ``launcher="env"`` the world is the launcher's processes: the world size
    is ``WORLD_SIZE`` and only runtimes that run under a launcher are accepted.

    Raises:
        UsageError: any bad value (one line).
    """
    runtimes = split_list(runtime)
    if launcher == "env":
        from conformance.worlds.launched import LauncherEnvError, external_runtimes, launcher_world_size
        from conformance.worlds.runtimes import RUNTIMES
        try:
            launched = launcher_world_size()
        except LauncherEnvError as exc:
            raise UsageError(f"--launcher env: {exc}") from None
        if world_size is None:
            world_size = str(launched)
        elif split_list(world_size) != [str(launched)]:
            raise UsageError(f"--launcher env: --world-size {world_size}: the launcher started "
                             f"{launched} processes (WORLD_SIZE={launched}); omit --world-size")
        for rt in runtimes:
            if rt in RUNTIMES and rt not in external_runtimes():
                raise UsageError(f"--launcher env: runtime {rt} cannot run under an external launcher "
                                 f"(only {', '.join(external_runtimes())})")
    out = []
    for rt in parse_runtime_names(runtime):
        sizes = parse_world_sizes(world_size, rt)
        check_world_size_range(sizes, rt)
        if not world_size and cases:
            sizes = cases_world_sizes(cases, rt)
        parse_runtimes(rt, sizes)
        impls = parse_impl_names(ddp, rt)
        out += [(rt, w, impls) for w in sizes]
    return out


def folder_on_path(folder: str) -> None:
    """Put ``folder`` first on ``sys.path`` unless it is there, as ``python -m`` does with the
    current folder: ``package.module:Class`` specs then resolve against the folder a face was
    started in, also from the ``ddp-conformance`` and ``pytest`` scripts (which do not add it).
    Spawned replicas inherit the path."""
    here = os.path.realpath(folder)
    if not any(os.path.realpath(p or os.getcwd()) == here for p in sys.path):
        sys.path.insert(0, here)


def check_model_spec(spec: str, flag: str = "--model") -> None:
    """What can be checked of a user model spec without torch: its form and that its top-level
    package exists (the rest: :func:`parse_model`).

    Raises:
        UsageError: not ``package.module:factory``, or no such top-level module.
    """
    mod_name, colon, attr = spec.partition(":")
    if not (colon and mod_name and attr):
        raise UsageError(f"{flag} {spec!r}: give package.module:factory (a conformance.UserModel or a "
                         "zero-argument factory of one)")
    top = mod_name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        raise UsageError(f"{flag} {spec!r}: cannot import {mod_name!r}: ModuleNotFoundError: No module named {top!r}")


def parse_model(spec: str, world_sizes, flag: str = "--model") -> tuple[list, list[str]]:
    """``(cases, notes)`` of user model ``spec`` (``package.module:factory``, every face's
    ``--model``): the cases run on it (:mod:`conformance.cases.train.usercases`) after the
    model is checked on one CPU device; ``notes`` are lines worth printing.

    Raises:
        UsageError: the one line of the first problem (module not importable, not a
            ``conformance.UserModel``, a build or forward that fails, ...).
    """
    check_model_spec(spec, flag)
    from conformance.cases.train.usercases import check_model, model_cases  # imports torch
    try:
        notes = check_model(spec, list(world_sizes))
    except UsageError as exc:
        raise UsageError(str(exc).replace("--model ", f"{flag} ", 1)) from None
    return model_cases(spec), notes
