"""Validation of the options every face shares (CLI, pytest plugin, absltest) - runtimes, world
sizes, implementations, models - and of the subcommands' own (:func:`parse_calibration`,
:func:`parse_ranks_world`), done here once. Bad input raises
:class:`~conformance.errors.UsageError` with the one line to print."""
from __future__ import annotations

import importlib.util
import os
import sys

from conformance.cases.usermodel import ZOO_PREFIX
from conformance.errors import UsageError, split_list
from conformance.settings import default_impls, default_world_sizes, max_world_size
from conformance.tolerances import MIN_WORLD_SIZE, lookup
from conformance.worlds.runtimes import RUNTIMES, RuntimeUnavailable, WorldKey, check_world


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


def case_runs_at(case, runtime: str, world_size: int, explicit) -> bool:
    """Whether ``case`` runs at ``world_size`` on ``runtime``: always when world sizes were
    given (``explicit`` true: the ``--world-size`` value, or a launcher's world), else at its
    :func:`case_world_sizes`."""
    return bool(explicit) or world_size in case_world_sizes(case, runtime)


def parse_impl_names(value: str | None, runtime: str | None, default: bool = True) -> list[str]:
    """Implementation specs, each resolved once to validate it (``all``: every row, or every row
    that runs on ``runtime``); with ``default``, none given names the runtime's."""
    from conformance.impls.builtin import ImplSpecError, parse_impls
    try:
        return [i.name for i in parse_impls(value or ",".join(default_impls(runtime)) if default else value,
                                            runtime)]
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
        check_runtime_name(rt)
    return runtimes


def check_runtime_name(name: str) -> str:
    """``name`` if a runtime is registered under it (:data:`conformance.worlds.runtimes.RUNTIMES`).

    Raises:
        UsageError: no runtime has that name (the known ones listed).
    """
    if name not in RUNTIMES:
        raise UsageError(f"--runtime: unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    return name


def runtimes_text(last: str = ", ") -> str:
    """The registered runtimes as help text lists them: ``cpu, pjrt, xrt``; ``last`` joins the
    last two (``" or "``: ``cpu, pjrt or xrt``)."""
    names = list(RUNTIMES)
    return ", ".join(names[:-1]) + last + names[-1] if len(names) > 1 else "".join(names)


def check_runs_here(runtime: str, world_size: int) -> None:
    """Refuse a world of ``world_size`` replicas of ``runtime`` that cannot run here
    (:func:`conformance.worlds.runtimes.check_world`), in a face's words.

    Raises:
        UsageError: ``--runtime RT: <the runtime's one-line reason>``.
    """
    try:
        check_world(WorldKey(runtime, world_size))
    except RuntimeUnavailable as exc:
        raise UsageError(f"--runtime {runtime}: {exc}") from None


def parse_runtimes(value: str | None, sizes: list[int]) -> list[str]:
    """Runtime names of a comma list, each checked to run here at every size of ``sizes``."""
    runtimes = parse_runtime_names(value)
    for rt in runtimes:
        for w in sizes:
            check_runs_here(rt, w)
    return runtimes


def world_matrix(runtimes, world_size: str | None, cases=None) -> list[tuple[str, int]]:
    """``[(runtime, W)]`` of every face (:func:`parse_matrix`; the pytest plugin's tests): for
    each of ``runtimes``, the sizes of ``world_size`` (a comma list); without it, every size some
    of ``cases`` runs at by default (:func:`case_world_sizes`, sorted), else the runtime's defaults.

    Raises:
        UsageError: ``world_size`` is not a comma list of sizes >= 2.
    """
    out = []
    for rt in runtimes:
        sizes = parse_world_sizes(world_size, rt)
        if not world_size and cases:
            sizes = sorted({w for c in cases for w in case_world_sizes(c, rt)})
        out += [(rt, w) for w in sizes]
    return out


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
        check_world_size_range(parse_world_sizes(world_size, rt), rt)
        sizes = [w for _, w in world_matrix([rt], world_size, cases)]
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
                         "zero-argument factory of one) or zoo:NAME")
    if spec.startswith(ZOO_PREFIX):  # the kit's zoo: the name is checked when the zoo loads
        return
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
    from fixtures.zoo import unavailable
    try:
        missing = unavailable(spec)
        if missing:  # its cases are skipped with the reason (conformance.evaluate)
            return model_cases(spec), [missing]
        notes = check_model(spec, list(world_sizes))
    except UsageError as exc:
        raise UsageError(str(exc).replace("--model ", f"{flag} ", 1)) from None
    return model_cases(spec), notes


def parse_calibration(runtime: str, model: str, ddp: str, seeds: int,
                      world_size: str) -> tuple[list[str], list[str], list[str], int]:
    """``(runtimes, models, impls, W)`` of ``python -m conformance calibrate``: correct
    implementations only, one world size, models of the zoo with a tolerance row on each runtime.

    Raises:
        UsageError: the first bad value (one line).
    """
    from fixtures.models import MODELS  # the model zoo imports torch

    runtimes, models = split_list(runtime), split_list(model)
    impls = parse_impl_names(ddp, None, default=False)
    if any(i.startswith("mutant:") for i in impls):
        raise UsageError("--ddp: calibrate measures the noise of a correct implementation, not a mutant")
    try:
        w = int(world_size)
    except ValueError:
        raise UsageError(f"--world-size: not an integer: {world_size!r}") from None
    if w < MIN_WORLD_SIZE:
        raise UsageError(f"--world-size: parity checks need world size >= {MIN_WORLD_SIZE}, got {w}")
    if seeds < 1:
        raise UsageError(f"--seeds: need at least 1 seed, got {seeds}")
    if not runtimes or not models:
        raise UsageError("--runtime and --model must name at least one value")
    for m in models:
        if m not in MODELS:
            raise UsageError(f"--model: unknown model {m!r}; known: {', '.join(MODELS)}")
    for rt in runtimes:
        check_runtime_name(rt)
        check_runs_here(rt, w)
        for m in models:
            try:
                lookup(rt, m)
            except KeyError as exc:
                raise UsageError(str(exc.args[0])) from None
    return runtimes, models, impls, w


def parse_ranks_world(runtime: str, world_size: str | None, launcher: str) -> int:
    """The world size of ``python -m conformance ranks``: one runtime, one size (default 2, or
    the launcher's with ``launcher="env"``), that runs here.

    Raises:
        UsageError: the first bad value (one line).
    """
    check_runtime_name(runtime)
    sizes = split_list(world_size) if world_size else []
    try:
        size = int(sizes[0]) if len(sizes) == 1 else None
    except ValueError:
        size = None
    if world_size and size is None:
        raise UsageError(f"--world-size: one integer, got {world_size!r}")
    if launcher == "env":
        from conformance.worlds.launched import LauncherEnvError, WorldSizeMismatch, check_external
        try:
            return check_external(runtime, size)
        except (LauncherEnvError, WorldSizeMismatch, RuntimeUnavailable) as exc:
            raise UsageError(f"--launcher env: {exc}") from None
    size = size or 2
    check_runs_here(runtime, size)
    return size
