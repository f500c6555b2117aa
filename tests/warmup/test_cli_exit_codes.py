"""Every error the command line names ends with the exit code of its class (2 bad input,
1 the work failed), one line on stderr; ``--debug`` adds the traceback. A class moved to
another module keeps its code: the code follows its base, not its module's name."""

import importlib
import pkgutil
import warnings

import pytest

import registry
import warmup
from registry.core.errors import BadInput, BundleRejected, RegistryError, ReportedError, WorkFailed
from registry.core.volume import MissingFolder
from registry.locks import LockServerUnreachable
from registry.trust.signing import KeyFileError, Untrusted
from tests.conftest import DEMO, error_line
from warmup.cli import exit_code, main
from warmup.core.manifest import ManifestError
from warmup.run.launch import RunError
from warmup.sidecar.probe_server import SidecarError

# Each error the command line classified by name before (and a few of the registry's own
# that exit 1), as raised, with the code the command ends with.
EXIT_CODES = {
    "SidecarError": (SidecarError("cannot listen on 127.0.0.1:9400: in use"), 2),
    "MissingFolder": (MissingFolder("volume '/v' does not exist; check --volume"), 2),
    "BundleRejected": (BundleRejected("b.tgz", "unsigned"), 2),
    "KeyFileError": (KeyFileError("Key file k.pub cannot be read: gone"), 2),
    "registry.cli.main.BadInput": (BadInput("--fingerprint 'x' is unusable"), 2),
    "RegistryError": (RegistryError("the store refused the write"), 1),
    "Untrusted": (Untrusted("value k", "signed by no trusted key"), 1),
    "LockServerUnreachable": (LockServerUnreachable("redis://r:1/0", "refused"), 1),
}


@pytest.mark.parametrize(("error", "code"), EXIT_CODES.values(), ids=EXIT_CODES.keys())
@pytest.mark.parametrize("command", ["validate", "status"])  # without settings, and with
def test_each_named_error_ends_with_its_code_and_its_message_alone(
    isolated, capsys, monkeypatch, error, code, command
):
    def raises(*args, **kwargs):
        raise error

    monkeypatch.setattr(f"warmup.cli._{command}", raises)
    argv = ["validate", str(DEMO)] if command == "validate" else ["status"]
    assert exit_code(error) == code
    assert main(argv) == code
    err = capsys.readouterr().err
    assert error_line(err) == f"triton-warmup: error: {error}"  # no type, no hint: its words


def test_a_manifest_error_is_bad_input_with_each_of_its_lines(isolated, capsys, monkeypatch):
    error = ManifestError("m.yaml", ["entries.0.dtype: bad", "entries.1.shapes: bad"])

    def raises(args):
        raise error

    monkeypatch.setattr("warmup.cli._validate", raises)
    assert exit_code(error) == 2 and main(["validate", str(DEMO)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"triton-warmup: error: {line}" for line in error.lines()]


def test_a_run_error_is_bad_input(isolated, capsys, monkeypatch):
    (isolated / "volume").mkdir()

    def refuses(settings, manifest, early):
        raise RunError("device cuda: 2 rank(s) need 2 GPU(s), this machine has 0")

    monkeypatch.setattr("warmup.run.launch.run", refuses)
    assert main(["run", "--manifest", str(DEMO)]) == 2
    line = error_line(capsys.readouterr().err)
    assert line == "triton-warmup: error: device cuda: 2 rank(s) need 2 GPU(s), this machine has 0"


def test_any_other_error_is_a_failure_named_by_its_type():
    assert exit_code(ValueError("x")) == 1 and exit_code(KeyError("k")) == 1


def test_bad_input_wins_over_a_failure_whatever_the_order_of_the_bases():
    class Both(WorkFailed, BadInput):
        """Listed as a failure first, bad input second."""

    assert exit_code(Both("x")) == 2 and exit_code(BundleRejected("b", "r")) == 2


def _project_modules():
    """Every module of registry and warmup that imports here (``__main__`` runs the
    program; a module that needs what this machine lacks is passed)."""
    for package in (registry, warmup):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue
            try:
                with warnings.catch_warnings():  # an old name's module says it moved
                    warnings.simplefilter("ignore", DeprecationWarning)
                    importlib.import_module(info.name)
            except ImportError:
                continue
    return ReportedError


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_reported_error_of_the_project_is_bad_input_or_a_failure():
    root = _project_modules()
    unclassified = [
        f"{c.__module__}.{c.__qualname__}"
        for c in _subclasses(root)
        if c not in (BadInput, WorkFailed) and not issubclass(c, (BadInput, WorkFailed))
    ]
    assert not unclassified
    assert issubclass(RegistryError, WorkFailed) and not issubclass(RegistryError, BadInput)


@pytest.mark.parametrize("how", ["--debug", "TRITON_WARMUP_DEBUG"])
def test_debug_shows_the_traceback_of_a_registry_command_that_fails(
    isolated, capsys, monkeypatch, how
):
    missing = isolated / "missing"
    argv = ["registry", "--store", str(missing), "ls"]
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err
    if how == "--debug":
        argv = ["--debug", *argv]
    else:
        monkeypatch.setenv("TRITON_WARMUP_DEBUG", "true")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "_store_root" in err  # where it was raised
    assert err.strip().splitlines()[-1].startswith(f"triton-warmup: error: --store '{missing}'")


def test_debug_reaches_the_runs_settings(isolated, monkeypatch):
    (isolated / "volume").mkdir()
    seen = []

    class Stop(Exception):
        """The run's own work would start here."""

    def run(settings, manifest, early):
        seen.append(settings.logs.debug)
        raise Stop

    monkeypatch.setattr("warmup.run.launch.run", run)
    assert main(["run", "--manifest", str(DEMO)]) == 1
    assert main(["--debug", "run", "--manifest", str(DEMO)]) == 1
    assert seen == [False, True]  # the rank processes read these settings (settings.json)
