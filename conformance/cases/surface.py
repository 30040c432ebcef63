"""The map of torch's ``DistributedDataParallel`` surface: every public keyword and method, the
value classes the kit draws for it, and the cases that cover each (or why none does).

The surface is read from torch itself (:func:`torch_surface`), so a torch that grows a keyword
fails ``tests/test_surface.py`` until the keyword has a row here. docs/transparency.md publishes
the map (:func:`render`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

from conformance.cases.scenario.buckets import CAP_CLASSES
from conformance.cases.scenario.dimensions import LOOPS, MODULES
from conformance.cases.scenario.format import DDP_DEFAULTS
from conformance.cases.scenario.generate import KEYWORD_VALUES


@dataclass(frozen=True)
class Cell:
    """One keyword or method of the surface.

    Attributes:
        name: the keyword or method name.
        kind: ``"keyword"`` or ``"method"``.
        values: the value classes the kit draws or fixes (``True``/``False``, a cap class, ...).
        covered: the case names that exercise them.
        reason: why the value classes not in ``values`` are not drawn ('' when all are).
    """

    name: str
    kind: str
    values: tuple
    covered: tuple
    reason: str = ""


BOTH = ("True", "False")
NOT_HERE = "no CUDA device on the machines the kit runs on"

#: The surface, one row per keyword and method of torch's DDP (torch 2.13's signature).
SURFACE = {c.name: c for c in [
    Cell("module", "keyword", ("every model of fixtures.models", "the drawn scenario module", "--model"),
         ("parity.linear", "parity.mlp", "scenario.loop", "scenario.core")),
    Cell("device_ids", "keyword", ("None",), ("parity.linear",), "a device list is for one CUDA device per process: "
         + NOT_HERE),
    Cell("output_device", "keyword", ("None",), ("parity.linear",), NOT_HERE),
    Cell("dim", "keyword", ("0",), ("parity.linear",), "scatter dimension of device_ids' single-process "
         "multi-device mode, deprecated upstream"),
    Cell("broadcast_buffers", "keyword", BOTH + ("None",), ("feature.broadcast_buffers_on",
                                                         "feature.broadcast_buffers_off", "scenario.core",
                                                         "scenario.loop", "scenario.keywords")),
    Cell("init_sync", "keyword", BOTH, ("feature.state_sync", "scenario.keywords")),
    Cell("process_group", "keyword", ("None", "a subgroup of two ranks"), ("feature.subgroups",)),
    Cell("bucket_cap_mb", "keyword", ("None",) + CAP_CLASSES + ("0.25 MiB",),
         ("scenario.buckets", "scenario.workload", "feature.bucket_view", "parity.mlp")),
    Cell("find_unused_parameters", "keyword", BOTH, ("feature.unused_parameters", "parity.structured_output_unused",
                                                     "scenario.core", "scenario.loop")),
    Cell("check_reduction", "keyword", ("False",), ("parity.linear",), "deprecated upstream, ignored by torch"),
    Cell("gradient_as_bucket_view", "keyword", BOTH, ("feature.bucket_view", "scenario.buckets")),
    Cell("static_graph", "keyword", BOTH, ("feature.static_graph", "parity.checkpoint_reentrant",
                                           "scenario.workload")),
    Cell("delay_all_reduce_named_params", "keyword", ("None",), ("parity.linear",),
         "private to torch's FSDP+DDP composition (named parameters reduced after backward)"),
    Cell("param_to_hook_all_reduce", "keyword", ("None",), ("parity.linear",),
         "goes with delay_all_reduce_named_params"),
    Cell("mixed_precision", "keyword", ("None",), ("parity.linear",),
         "torch's _MixedPrecision is private; bfloat16 autocast is covered by feature.mixed_precision"),
    Cell("device_mesh", "keyword", ("None",), ("parity.linear",),
         "a 1-D mesh is the default group; HSDP-style meshes are covered through process_group"),
    Cell("skip_all_reduce_unused_params", "keyword", BOTH, ("feature.unused_parameters", "scenario.keywords"),
         "True only with the same unused parameters on every replica throughout, as torch requires "
         "(other plans desynchronise or hang)"),
    Cell("bucket_cap_mb_list", "keyword", ("None", "1-3 caps, each a class of bucket_cap_mb (the first: the "
                                           "first bucket's size)"), ("scenario.keywords",),
         "the default first bucket (1 MiB with bucket_cap_mb=None) is larger than every fixture model, "
         "so its boundary is drawn through the list's first cap"),
    Cell("batched_grad_copy", "keyword", BOTH, ("scenario.keywords",)),
    Cell("forward_sync_buffers", "keyword", ("None",) + BOTH, ("scenario.keywords",)),
    Cell("forward", "method", ("positional", "keyword arguments", "structured outputs"),
         ("parity.structured_output", "scenario.loop")),
    Cell("no_sync", "method", ("accumulation windows of 1-3 micro-steps",), ("feature.no_sync", "scenario.core",
                                                                           "scenario.loop")),
    Cell("join", "method", ("uneven inputs",), ("feature.join",)),
    Cell("join_hook", "method", ("through join()",), ("feature.join",)),
    Cell("register_comm_hook", "method", ("allreduce", "fp16", "bf16", "out of place"),
         ("feature.comm_hook", "feature.comm_hook_fp16", "feature.comm_hook_out_of_place", "scenario.comm_hook")),
    Cell("train", "method", BOTH, ("scenario.loop",)),
    Cell("will_sync_module_buffers", "method", ("read",), (),
         "an introspection helper: the buffer broadcast it predicts is checked by buffer_parity"),
    Cell("gather", "method", ("-",), (), "single-process multi-device mode: " + NOT_HERE),
    Cell("scatter", "method", ("-",), (), "single-process multi-device mode: " + NOT_HERE),
    Cell("to_kwargs", "method", ("-",), (), "single-process multi-device mode: " + NOT_HERE),
]}


def keyword_classes() -> list[tuple[str, object]]:
    """``(keyword, value class)`` of every keyword ``scenario.keywords`` draws
    (``scenarios.generate.KEYWORD_VALUES``, ``bucket_cap_mb_list`` absent or a list,
    ``skip_all_reduce_unused_params`` both ways)."""
    out = [(k, v) for k, vs in KEYWORD_VALUES.items() for v in vs]
    return out + [("bucket_cap_mb_list", None), ("bucket_cap_mb_list", "list"),
                  ("skip_all_reduce_unused_params", False), ("skip_all_reduce_unused_params", True)]


def dimension_values() -> list[tuple[str, str]]:
    """``("module.<dim>" | "loop.<dim>", value)`` of every module and loop dimension a loop
    program draws (``scenarios.format.MODULES``, ``LOOPS``)."""
    return ([(f"module.{d}", v) for d, vs in MODULES.items() for v in vs]
            + [(f"loop.{d}", v) for d, vs in LOOPS.items() for v in vs])


def cells_of(sc) -> set:
    """The (keyword class, module/loop value) cells scenario ``sc`` exercises: one value of each
    keyword times one value of each dimension."""
    keys = []
    for k in dict.fromkeys(k for k, _ in keyword_classes()):
        v = sc.ddp.get(k, DDP_DEFAULTS[k])
        keys.append((k, "list" if k == "bucket_cap_mb_list" and v else v))
    dims = [(f"module.{d}", v) for d, v in sc.module.items()] + [
        (f"loop.{d}", v) for d, v in sc.loop.items() if d != "lr_drop_at"]
    return {(a, b) for a in keys for b in dims}


def joint_cells() -> int:
    """How many (keyword class, module/loop value) cells there are."""
    return len(keyword_classes()) * len(dimension_values())


def torch_surface() -> dict[str, str]:
    """``{name: "keyword" | "method"}`` of the installed torch's ``DistributedDataParallel``:
    the keywords of ``__init__`` (after ``self``) and the public callables its class defines."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    out = {n: "keyword" for n in list(inspect.signature(DDP.__init__).parameters)[1:]}
    out.update({n: "method" for n, v in vars(DDP).items() if not n.startswith("_") and callable(v)})
    return out


def render() -> str:
    """The map as a Markdown table (docs/transparency.md)."""
    rows = ["| name | kind | value classes | covered by | not drawn, and why |", "|---|---|---|---|---|"]
    for c in SURFACE.values():
        rows.append(f"| `{c.name}` | {c.kind} | {', '.join(c.values)} | "
                    f"{', '.join(f'`{x}`' for x in c.covered) or '-'} | {c.reason or '-'} |")
    return "\n".join(rows)


def summary(cases_tested=None) -> str:
    """One line: how many of the surface's names a case covers; with ``cases_tested`` (case names
    with a tested verdict in this run), how many of those cases ran, and the first uncovered."""
    names = [c for c in SURFACE.values() if c.covered and (cases_tested is None or set(c.covered) & set(cases_tested))]
    left = [c.name for c in SURFACE.values() if c not in names]
    where = "by the cases run" if cases_tested is not None else "by a case"
    joint = "" if cases_tested is not None and "scenario.keywords" not in set(cases_tested) else (
        f"; {joint_cells()} keyword class x module/loop value cells drawn together by scenario.keywords")
    return (f"coverage DDP surface: {len(names)} of {len(SURFACE)} keywords and methods covered {where}"
            + (f"; not covered: {', '.join(left[:6])}{' ...' if len(left) > 6 else ''}" if left else "")
            + joint + " (docs/transparency.md)")
