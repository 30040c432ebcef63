"""Every face's help text takes a default from ``conformance.settings`` instead of restating it
(issue 28 item 5): change the default there and every help text follows."""
import pathlib
import re

import pytest

from conformance import settings as S

ROOT = pathlib.Path(__file__).resolve().parent.parent
FACES = ("conformance/cli/__init__.py", "conformance/plugin.py", "conformance/absltest.py")


def _run_help(parser) -> str:
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["run"].format_help()


def test_default_help_reads_settings():
    assert S.default_help("replica_timeout") == f"default {S.Settings().replica_timeout:g}; env CONFORMANCE_TIMEOUT"
    assert S.default_help("profile") == f"default {S.Settings().profile}; env CONFORMANCE_PROFILE"


def test_cli_help_follows_the_settings_default(monkeypatch):
    from conformance.cli import build_parser
    monkeypatch.setitem(S.ENVIRONMENT, "replica_timeout", ("CONFORMANCE_TIMEOUT", 77.0))
    text = " ".join(_run_help(build_parser()).split())
    assert "(default 77; env CONFORMANCE_TIMEOUT)" in text and "default 120" not in text


def test_cli_help_shows_the_settings_default():
    from conformance.cli import build_parser
    text = " ".join(_run_help(build_parser()).split())
    assert f"({S.default_help('replica_timeout')})" in text
    assert f"({S.default_help('profile')})" in text
    assert f"({S.default_help('lanes')})" in text


def test_plugin_help_follows_the_settings_default(monkeypatch):
    from conformance.plugin import pytest_addoption
    helps = {}

    class Group:
        def addoption(self, name, *a, **k):
            helps[name] = k.get("help", "")

    class Parser:
        def getgroup(self, *a, **k):
            return Group()

        def addini(self, *a, **k):
            pass

    monkeypatch.setitem(S.ENVIRONMENT, "replica_timeout", ("CONFORMANCE_TIMEOUT", 77.0))
    pytest_addoption(Parser())
    assert "(default 77; env CONFORMANCE_TIMEOUT)" in helps["--conformance-timeout"]


def test_absltest_help_shows_the_settings_default():
    pytest.importorskip("absl")
    from absl import flags
    import conformance.absltest  # noqa: F401  (defines the flags)
    assert f"({S.default_help('replica_timeout')})" in flags.FLAGS["replica_timeout"].help


@pytest.mark.parametrize("face", FACES)
def test_no_face_restates_a_numeric_default(face):
    """No help or docstring of a face spells a Settings default in numbers ("default 120", "[120]")."""
    text = (ROOT / face).read_text()
    for name, (_env, default) in S.ENVIRONMENT.items():
        if isinstance(default, float):
            n = re.escape(f"{default:g}")
            assert not re.search(rf"default {n}\b|\[{n}\]", text), (face, name)


def test_the_settings_table_states_the_defaults():
    """The one place a default is written in words, the table of conformance.settings, matches."""
    rows = {m[0]: m[2] for m in re.findall(r"``(\w+)``[^`\n]*``(\w+)``\s+(\S+)", S.__doc__)}
    assert {k: rows.get(k) for k in S.ENVIRONMENT} == \
        {k: (f"{d:g}" if isinstance(d, float) else str(d)) for k, (_e, d) in S.ENVIRONMENT.items()}
