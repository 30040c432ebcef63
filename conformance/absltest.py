"""absltest face of the kit: the case table as ``absltest`` tests (pytorch/xla's own
tests are ``absltest`` + ``parameterized`` files run as ``python test_x.py``).

Run the kit::

    python -m conformance.absltest --runtime=pjrt --ddp=mypkg:MyDDP [--world_size=2,4]
        [--only=parity,no_sync] [--skip=property] [--profile=ci] [--expected_failures=FILE]
        [--backend=gloo|mypkg.backend:register] [--model=mypkg.models:factory]

or subclass it in your own test file and run that file::

    from conformance.absltest import ConformanceTestCase, main

    class MyDDPConformance(ConformanceTestCase):
        DDP = "mypkg.ddp:MyDDP"      # the default of --ddp for this class

    if __name__ == "__main__":
        main()

One test method per case of the table (``test_parity_linear``,
``test_feature_no_sync``, ...); each runs the case for every (runtime, world
size, implementation) the flags select, as a ``subTest``, through
:func:`conformance.evaluate.evaluate` - the same verdicts as the CLI and the
pytest plugin. A fail or vacuous verdict fails the subtest with every verdict's
summary and the replicas' diagnosis; unsupported / skip verdicts skip it with the
reason; an expected failure (``--expected_failures``) is a skip whose reason starts with
``expected failure`` (the mapping of every face: :mod:`conformance.outcome`).
Bad flag values print one ``error:`` line and exit with code 2. With ``--model`` (a
``conformance.UserModel``) the methods of the model's cases (``test_parity_user_model``, ...)
run and the table's skip.
"""
from __future__ import annotations

import atexit
import sys

from absl import flags
from absl.testing import absltest, parameterized

from conformance.cases.kinds import REGISTRY
from conformance.cases.row import select_rows
from conformance.cases.table import CASES, select
from conformance.cases.train.usercases import user_case_rows
from conformance.errors import UsageError, split_list
from conformance.cases.property.kind import profile_examples
from conformance.evaluate import evaluate
from conformance.options import parse_matrix, parse_model, runtimes_text
from conformance.outcome import outcome
from conformance.settings import Settings, default_help, use_hypothesis_cache
from conformance.worlds.runtimes.cpu import resolve_backend
from conformance.report.expected import mark_expected_failures, read_expected_failures
from conformance.report.findings import run_expectations

FLAGS = flags.FLAGS
flags.DEFINE_string("runtime", "cpu", f"comma list of runtimes: {runtimes_text()}")
flags.DEFINE_string("ddp", None, "comma list of DDP implementations (default: the class's DDP, "
                    "else the runtime's)")
flags.DEFINE_string("world_size", None, "comma list of world sizes >= 2 (default: the runtime's, "
                    "its adapter's default_world_sizes)")
flags.DEFINE_string("only", None, "comma list of tags: run only cases carrying one")
flags.DEFINE_string("skip", None, "comma list of tags: leave out cases carrying one")
flags.DEFINE_string("profile", None, "example budget of property cases: dev, ci, ci-pjrt, thorough")
flags.DEFINE_string("expected_failures", None, "file of verdict ids whose failure is expected")
flags.DEFINE_bool("strict_findings", False, "do not apply the kit's own findings in torch, torch_xla and gloo")
flags.DEFINE_string("backend", None, "torch.distributed backend of the CPU worlds: a name (default gloo) or "
                    "module:function registering one (env CONFORMANCE_BACKEND)")
flags.DEFINE_string("model", None, "package.module:factory of your own model (a conformance.UserModel): "
                    "its parity, agreement and loop-program cases run instead of the table's, at a bound measured on it")
flags.DEFINE_float("replica_timeout", None, "seconds one task may take on a world "
                   f"({default_help('replica_timeout')})")

_SESSION = None
_MODEL_CASES: dict = {}  # --model: the model's cases by name (built by validate_flags)


def _session():
    global _SESSION
    if _SESSION is None:
        from conformance.evaluate import Session
        _SESSION = Session(settings=settings())
        atexit.register(_SESSION.close)
    return _SESSION


def settings():
    """The run's :class:`~conformance.settings.Settings`: the environment, then the flags."""
    return Settings.from_env(replica_timeout=FLAGS.replica_timeout, profile=FLAGS.profile, backend=FLAGS.backend)


class ConformanceTestCase(parameterized.TestCase):
    """Base class: one test method per case of the table. Set ``DDP`` (a ``--ddp``
    spec) in a subclass to make it the default implementation under test."""

    DDP: str | None = None

    def _targets(self, case=None):
        """The (runtime, W, impls) matrix; with ``case``, at that case's own world sizes."""
        return parse_matrix(FLAGS.runtime, FLAGS.world_size, FLAGS.ddp or self.DDP,
                            cases=[case] if case is not None else None)

    def _run_case(self, name: str):
        if FLAGS.model and name not in _MODEL_CASES:
            self.skipTest(f"--model runs the model's cases, not {name}")
        if not FLAGS.model and name not in CASES:
            self.skipTest(f"{name} runs on your model: give --model")
        case = _MODEL_CASES[name] if FLAGS.model else CASES[name]
        rows = list(_MODEL_CASES.values()) if FLAGS.model else CASES.values()
        if case not in select_rows(rows, split_list(FLAGS.only), split_list(FLAGS.skip)):
            self.skipTest(f"{name} not selected by --only/--skip")
        expected, _ = run_expectations(read_expected_failures(FLAGS.expected_failures) if FLAGS.expected_failures
                                       else None, FLAGS.strict_findings)
        backend = REGISTRY[case.kind].subject == "backend"
        for runtime, w, impls in self._targets(case):
            # a backend's case once per world: its verdicts do not depend on the DDP above it
            for impl in impls[:1] if backend else impls:
                with self.subTest(impl="backend" if backend else impl, runtime=runtime, world_size=w):
                    verdicts = evaluate(case, impl, runtime, w, _session())
                    mark_expected_failures(verdicts, expected)
                    got = outcome(verdicts)
                    if got.kind == "fail":
                        self.fail(got.message)
                    if got.kind in ("xfail", "skip"):  # unittest has no run-time expected failure
                        self.skipTest(got.message)


def _add_methods(cls):
    rows = [(name, case.description) for name, case in CASES.items()] + user_case_rows()
    for name, description in rows:
        def test(self, _name=name):
            self._run_case(_name)
        test.__name__ = "test_" + name.replace(".", "_")
        test.__doc__ = f"{name}: {description}"
        setattr(cls, test.__name__, test)


# Test methods go on subclasses only: the base class, imported into a user's test
# module, must not run the table a second time.
ConformanceTestCase.__init_subclass__ = classmethod(lambda cls, **kw: _add_methods(cls))


def validate_flags(argv: list[str]) -> list[str]:
    """Parse and check the flags; return the arguments left for unittest.

    Raises:
        UsageError: bad input (one line).
    """
    try:
        rest = FLAGS(argv, known_only=False)
    except flags.Error as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    if FLAGS.model:
        targets = parse_matrix(FLAGS.runtime, FLAGS.world_size, FLAGS.ddp or _default_ddp())
        cases, notes = parse_model(FLAGS.model, sorted({w for _, w, _ in targets}))
        _MODEL_CASES.update((c.name, c) for c in cases)
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        select_rows(cases, split_list(FLAGS.only), split_list(FLAGS.skip))
    else:
        select(split_list(FLAGS.only), split_list(FLAGS.skip))
    if settings().backend != "gloo":
        resolve_backend(settings().backend)
    profile_examples(FLAGS.profile)
    if FLAGS.expected_failures:
        read_expected_failures(FLAGS.expected_failures)
    parse_matrix(FLAGS.runtime, FLAGS.world_size, FLAGS.ddp or _default_ddp())
    return rest


def _default_ddp():
    """``DDP`` of the ConformanceTestCase subclasses in ``__main__`` (first one), if any."""
    main_mod = sys.modules.get("__main__")
    for obj in vars(main_mod).values() if main_mod else ():
        if isinstance(obj, type) and issubclass(obj, ConformanceTestCase) and obj.DDP:
            return obj.DDP
    return None


def main(argv=None) -> None:
    """Validate the flags (one ``error:`` line, exit 2, on bad input), then ``absltest.main()``."""
    argv = list(sys.argv if argv is None else argv)
    use_hypothesis_cache()  # no .hypothesis/ in the folder it runs from, as the CLI
    try:
        rest = validate_flags(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    absltest.main(argv=rest)


class KitConformance(ConformanceTestCase):
    """The kit's table for ``python -m conformance.absltest --ddp=...``."""


if __name__ == "__main__":
    main()
