"""The ``triton-warmup`` command line.

triton-warmup run       warm every manifest shape (init container); exit 0 when ready
triton-warmup serve     the sidecar: /healthz /readyz /metrics, bundle hot reload
triton-warmup status    the last run: state, sources, time by phase
triton-warmup validate  check a manifest, write nothing
triton-warmup doctor    check this host for what a run needs
triton-warmup explain   predict each cache family's hit or miss here, and why
triton-warmup registry  inspect and move tuned configs and compiled models

``--volume``, ``--debug`` and ``-v`` are accepted before or after any command. ``run``,
``serve`` and ``explain`` need a manifest and a volume (``--manifest``, ``--volume`` or
TRITON_WARMUP_MANIFEST, TRITON_WARMUP_VOLUME): there are no demo defaults.

Exit codes: 0 done, 1 the work failed (the status names why), 2 bad input or settings,
refused before any work. An error is one line on stderr; ``--debug``
(TRITON_WARMUP_DEBUG) adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core.errors import BadInput, ReportedError, named
from warmup.core.manifest import Manifest, ManifestError, load_manifest

if TYPE_CHECKING:
    from pydantic import ValidationError  # pydantic loads after the parse: --help stays fast

    from warmup.core.results import RunStatus  # only status loads it
    from warmup.core.settings import Settings  # pydantic loads after the parse
    from warmup.run.early import EarlyRanks

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
TRUST_NOTES = {  # what ``status`` adds to the run's trust mode (registry.trust.signing)
    "code-refused": " (no trusted keys: code from bundles and the remote tier refused)",
    "unsigned-allowed": " (TRITON_WARMUP_ALLOW_UNSIGNED=true: unsigned code accepted)",
}
# Imported here: the manifest (and pydantic) and the error classes (registry.core.errors, no
# torch). ``validate`` needs nothing else, not even the settings; every other command
# imports what it uses when it runs.


def build_parser(settings: Settings) -> argparse.ArgumentParser:
    """Every command's parser; ``settings`` (the environment's) give the defaults shown."""
    from registry.cli import main as registry_cli  # each command loads only its own modules
    from warmup import doctor, explain  # each command loads only its own modules

    parser, sub = _top_parser()
    run = sub.add_parser("run", help="warm every manifest shape, then exit")
    _common(run, settings)
    run.add_argument("--world-size", type=int, help="ranks, 1-8 (default: the manifest's largest)")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], help="where to warm")

    serve = sub.add_parser("serve", help="the sidecar: probes, metrics, bundle reload")
    _common(serve, settings)
    serve.add_argument("--host", help=f"bind address (default {settings.sidecar.host})")
    serve.add_argument("--port", type=int, help=f"port (default {settings.sidecar.port})")

    status = sub.add_parser("status", help="the last run: state, sources, seconds by phase")
    status.add_argument(
        "--file", type=Path, help=f"the status file (default {settings.paths.status_file})"
    )
    _work_dir_option(status, settings)
    status.add_argument("--json", action="store_true", help="the status file's JSON as it is")

    _add_validate(sub)
    doctor.add_parser(sub, settings)
    explain.add_parser(sub, settings)
    registry_cli.add_parser(
        sub,
        default_trust=(
            settings.trust.bundle_keys or settings.trust.keys,
            settings.trust.allow_unsigned,
        ),
    )
    _everywhere(parser)
    return parser


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    description, _, epilog = _plain(__doc__).partition("\n\n")
    parser = argparse.ArgumentParser(
        prog="triton-warmup",
        description=description.splitlines()[0],
        epilog=epilog.split("\n\n", 1)[1],  # the options' and exit codes' paragraphs
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def _plain(text: str) -> str:
    """A docstring as a person reads it in a terminal: no RST markup (````x````,
    ``:func:`x```)."""
    return re.sub(r":\w+:`([^`]*)`", r"\1", text).replace("``", "")


def _everywhere(parser: argparse.ArgumentParser) -> None:
    """``-v``, ``--debug`` and ``--volume`` on ``parser`` and every command below it, so
    that each is accepted before or after any command. SUPPRESS: a command's parser
    leaves unset what it was not given, so it never undoes what a parser above read. No
    abbreviations: an option added later never changes what a shortened one meant."""
    parser.allow_abbrev = False
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,  # not given: TRITON_WARMUP_DEBUG stands
        help="tracebacks with errors (TRITON_WARMUP_DEBUG)",
    )
    parser.add_argument(
        "--volume",
        type=Path,
        default=argparse.SUPPRESS,
        help="the volume's root: its registry, caches and compiled models "
        "(TRITON_WARMUP_VOLUME); needed by run, serve, explain and the registry's store "
        "commands",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias: the same parser
                _everywhere(child)


def _add_validate(sub: Any) -> None:
    validate = sub.add_parser("validate", help="check a manifest and print what it expands to")
    validate.add_argument("manifest", type=Path)
    validate.add_argument("--json", action="store_true")


def _common(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument(
        "--manifest", type=Path, help="the shape manifest (TRITON_WARMUP_MANIFEST); required"
    )
    parser.add_argument(
        "--create-volume",
        action="store_true",
        default=None,  # None: not given, so TRITON_WARMUP_CREATE_VOLUME stands
        help="make the volume's folder if it is not there (default: exit 2)",
    )
    _work_dir_option(parser, settings)


def _work_dir_option(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="this pod's scratch folder (TRITON_WARMUP_WORK_DIR): the status file and the "
        "caches restored for the server lie under it unless set on their own; needed by "
        "run, serve, explain, and status without --file",
    )


OVERRIDES = {  # option -> setting (its keyword and variable name)
    "manifest": "manifest",
    "volume": "volume",
    "create_volume": "create_volume",
    "work_dir": "work_dir",
    "debug": "debug",
    "world_size": "world_size",
    "device": "device",
    "host": "metrics_host",
    "port": "metrics_port",
}


def main(argv: Sequence[str] | None = None, *, early: EarlyRanks | None = None) -> int:
    """The command line; returns the exit code. ``early``: the rank processes the
    program started for ``run`` (``warmup.program``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _command(argv) == "validate":  # a file alone: no settings, nothing else imported
        parser, sub = _top_parser()
        _add_validate(sub)
        _everywhere(parser)
        args = parser.parse_args(argv)
        debug = getattr(args, "debug", None)  # not given: TRITON_WARMUP_DEBUG, as elsewhere
        if debug is None:
            debug = os.environ.get("TRITON_WARMUP_DEBUG", "").lower() in ("1", "true", "yes", "on")
        return _guarded(bool(debug), lambda: _validate(args))
    return _with_settings(argv, early)


VALUED = ("--volume",)  # the options before a command that take a value


def _command(argv: Sequence[str]) -> str | None:
    """The command named: the first word that is neither an option nor an option's value."""
    words = iter(argv)
    for word in words:
        if word in VALUED:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _with_settings(argv: Sequence[str], early: EarlyRanks | None) -> int:
    from pydantic import ValidationError  # pydantic loads after the parse: --help stays fast

    from warmup.core import logs  # after the parse: --help stays fast
    from warmup.core.settings import Settings  # pydantic loads after the parse

    try:
        settings = Settings()
    except ValidationError as e:
        return _error(f"bad settings: {settings_errors(e)}", EXIT_BAD_INPUT)
    args = build_parser(settings).parse_args(argv)
    args.debug = getattr(args, "debug", None)  # None: not given, so TRITON_WARMUP_DEBUG stands
    args.verbose = getattr(args, "verbose", False)
    given = {
        field: getattr(args, option)
        for option, field in OVERRIDES.items()
        if getattr(args, option, None) is not None
    }
    try:  # options are settings too: validated the same way, then taking precedence
        settings = Settings(**given)
    except ValidationError as e:
        return _error(settings_errors(e, options=given), EXIT_BAD_INPUT)
    quiet = args.command not in ("run", "serve")  # registry commands print their own output
    logs.configure(settings.logs.format, level=10 if args.verbose else 30 if quiet else 20)
    return _guarded(settings.logs.debug, lambda: _dispatch(args, settings, early))


def _guarded(debug: bool, command: Callable[[], int]) -> int:
    """``command``'s exit code; an exception is one line on stderr (all of a manifest's
    lines), with its traceback before it under ``debug``."""
    try:
        return command()
    except Exception as e:
        if debug:
            traceback.print_exc()
        code = exit_code(e)
        if isinstance(e, ManifestError):
            for line in e.lines():
                _error(line, code)
            return code
        if isinstance(e, ReportedError):  # the project's own: its message says it all
            return _error(str(e), code)
        return _error(f"{named(e)} (--debug shows where)", code)


def exit_code(error: BaseException) -> int:
    """The exit code a command ends with on ``error``, by its class: 2 for bad input
    (:class:`registry.core.errors.BadInput`, a manifest's :class:`ManifestError`), before
    anything else; 1 for the rest (:class:`registry.core.errors.WorkFailed` and any other)."""
    if isinstance(error, (BadInput, ManifestError)):  # first: a bad bundle is both
        return EXIT_BAD_INPUT
    return EXIT_FAILED


NEEDS = {  # command -> the settings it refuses to start without: no demo defaults
    "run": ("manifest", "volume", "work_dir"),
    "serve": ("manifest", "volume", "work_dir"),
    "explain": ("manifest", "volume", "work_dir"),
}


STATUS_WAYS = "--file, --work-dir or TRITON_WARMUP_WORK_DIR (TRITON_WARMUP_STATUS_FILE)"


def _dispatch(args: argparse.Namespace, settings: Settings, early: EarlyRanks | None) -> int:
    from warmup.core.settings import require  # pydantic loads after the parse

    ways = {
        s: f"--{o.replace('_', '-')} or TRITON_WARMUP_{s.upper()}" for o, s in OVERRIDES.items()
    }
    require(settings, NEEDS.get(args.command, ()), who=args.command, ways=ways)
    if args.command == "run":
        return _run(settings, early)
    if args.command == "serve":
        return _serve(settings)
    if args.command == "status":
        if not args.file and not settings.given("status_file"):  # the run's, in its work dir
            require(settings, ("work_dir",), who="status", ways={"work_dir": STATUS_WAYS})
        return _status(args.file or settings.paths.status_file, as_json=args.json)
    if args.command == "validate":
        return _validate(args)
    if args.command == "doctor":
        from warmup import doctor  # only doctor loads it

        return doctor.run(settings, args)
    if args.command == "explain":
        from warmup import explain  # only explain loads it

        return explain.run(settings, args)
    from registry.cli import main as registry_cli  # each command loads only its own modules

    return registry_cli.run(args, _place(settings))


def _place(settings: Settings) -> Any:
    """Where the registry commands work unless told (:class:`registry.cli.common.Place`):
    the settings' store and volume when a volume (or registry) was given, and the pod
    folders given to the settings (not derived ones)."""
    from registry.cli.common import Place  # only the registry commands load it

    named = settings.given("volume") or settings.given("registry_dir")
    return Place(
        store=settings.paths.registry_dir if named else None,
        volume=settings.paths.volume if settings.given("volume") else None,
        pod={n: p for n, p in settings.folders.by_name().items() if settings.given(n)},
    )


def _error(message: str, code: int) -> int:
    print(f"triton-warmup: error: {message}", file=sys.stderr)
    return code


def _run(settings: Settings, early: EarlyRanks | None) -> int:
    # Before any GPU work or write: the whole manifest (the kernels' rules on its shapes,
    # its functions found), then the volume: the first of the run's checks, which the
    # launcher goes on with (warmup.run.checks).
    manifest = load_manifest(settings.paths.manifest, find_functions=True)
    from warmup.core.services import existing_volume, writable_work_dir  # not for validate
    from warmup.run.launch import run  # only run loads the launcher

    existing_volume(settings)
    writable_work_dir(settings)

    status = run(settings, manifest, early)  # RunError and ManifestError: bad input, exit 2
    print(summary(status))
    return EXIT_OK if status.ready else EXIT_FAILED


def summary(status: RunStatus) -> str:
    """The run for a person: its state, its kernel shapes (each counted once) for its
    ranks, by where each config came from, its benchmark runs (every rank's, added up),
    the seconds since its process started, then a line per model (rank 0's) and per
    failure. A run of ranks and a full hit of the same manifest read alike."""
    from warmup.core.results import SOURCE_WORDS  # the status's own module: loaded already

    def count(n: int, what: str) -> str:
        return f"{n} {what}{'s' * (n != 1)}"

    counts, runs = status.shape_sources, status.benchmark_runs
    line = f"warmup {status.state}: {count(sum(counts.values()), 'kernel shape')} for "
    line += count(status.world_size, "rank")
    if counts:
        line += f" ({', '.join(f'{n} {SOURCE_WORDS.get(s, s)}' for s, n in counts.items())})"
    line += f", {count(runs, 'benchmark run')} over all ranks" if runs else ", nothing benchmarked"
    line += f", {_time_to_state(status)}"
    if status.full_hit:
        line += "; a full hit: caches restored for the server, no rank started"
    models = [f"\n  {m.describe()}" for m in status.models if m.rank == 0 and not m.failed]
    return line + "".join(models) + "".join(f"\n  FAILED {f}" for f in status.failures)


def _time_to_state(status: RunStatus) -> str:
    """``ready 22.4 s after its process started``: the run's time to its state, counted
    from its process's start (the status's ``started``); a run still going says so far."""
    took = status.duration_s
    if took is None and status.finished is not None:  # ended by an error: no duration written
        took = status.finished - status.started
    if took is None:
        return f"{time.time() - status.started:.1f} s since its process started, so far"
    return f"{status.state} {took:.1f} s after its process started"


def _status(path: Path, *, as_json: bool) -> int:
    """Exit 0 when the last run is ready, 1 when it failed or runs, 2 when there is no
    readable status."""
    from warmup.core.results import RunStatus  # only status loads it
    from warmup.run.phases import phase_table  # only status loads it

    status = RunStatus.read(path)
    if status is None:
        return _error(f"no readable status at {path}: has a run started here?", EXIT_BAD_INPUT)
    if as_json:
        print(status.model_dump_json(indent=1))
    else:
        print(summary(status))
        if status.phases:
            print("\n".join(["", *phase_table(status.phases, status.duration_s)]))
        if status.remote is not None:
            counts = ", ".join(f"{n} {v}" for n, v in status.remote.model_dump().items())
            print(f"\nremote tier: {counts}")
        if status.trust:
            print(f"trust: {status.trust}{TRUST_NOTES.get(status.trust, '')}")
    return EXIT_OK if status.ready else EXIT_FAILED


class _StoppedWhileStarting(Exception):
    """SIGTERM or SIGINT while the sidecar starts (its manifest, store recovery, watcher)."""


def _serve(settings: Settings) -> int:
    from warmup.core.services import existing_volume, writable_work_dir  # not for validate
    from warmup.sidecar.server import Sidecar  # only serve loads watchdog and h11

    # Refused at start, as run refuses them: a sidecar that started would answer 503 for ever.
    load_manifest(settings.paths.manifest)
    existing_volume(settings)
    writable_work_dir(settings)
    signals: list[int] = []
    starting = True

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)
        if starting:  # a start that waits on the store's lock ends now, not at SIGKILL
            raise _StoppedWhileStarting

    # Caught from before the start: /healthz answers as soon as it serves, so a stop
    # may come while the rest starts.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    sidecar = Sidecar(settings)
    try:
        port = sidecar.start()
        starting = False
    except _StoppedWhileStarting:
        sidecar.stop(timeout=1.0)
        return EXIT_OK
    print(
        f"serving /healthz /readyz /metrics on {settings.sidecar.host}:{port}; "
        f"watching {settings.paths.bundle_dir}",
        flush=True,
    )
    while not signals:  # a handler that set an Event could deadlock with Event.wait here
        time.sleep(0.1)
    sidecar.stop(timeout=1.0)  # bounded: answers and an install in progress are not waited for
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    """Everything a manifest can be checked for without importing torch, triton or the
    user's code: its fields, each kernel's rule on its shapes, its functions found and
    their signatures read (a note for each only its import can check); every error
    listed at once."""
    notes: list[str] = []
    manifest = load_manifest(args.manifest, find_functions=True, notes=notes)
    for note in notes:
        print(f"triton-warmup: note: {note}", file=sys.stderr)
    rows, models = _listing(manifest)
    if args.json:
        print(
            json.dumps({"digest": manifest.digest(), "entries": rows, "models": models}, indent=2)
        )
        return EXIT_OK
    _print_listing(rows, models)
    print(f"manifest {args.manifest} is valid (digest {manifest.digest()})")
    return EXIT_OK


def _listing(manifest: Manifest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The manifest's kernel entries and its models, each with every shape it declares."""
    rows: list[dict[str, Any]] = [
        {
            "kernel": e.kernel,
            "dtype": e.dtype,
            "world_size": e.world_size,
            "policy": e.policy,
            "shapes": e.expand(),
        }
        for e in manifest.entries
    ]
    models: list[dict[str, Any]] = [
        {"name": m.name, "build": m.build, "world_size": m.world_size, "shapes": m.expand()}
        for m in manifest.models
    ]
    return rows, models


def _print_listing(rows: list[dict[str, Any]], models: list[dict[str, Any]]) -> None:
    """The listing for a person: a title and a line per shape, for each entry and model."""
    for row in rows:
        _print_shapes(
            f"{row['kernel']} {row['dtype']}, world size {row['world_size']}, "
            f"policy {row['policy']}",
            row["shapes"],
        )
    for model in models:
        _print_shapes(
            f"model {model['name']} ({model['build']}), world size {model['world_size']}",
            model["shapes"],
        )


def _print_shapes(title: str, shapes: list[dict[str, int]]) -> None:
    print(f"{title}: {len(shapes)} shape(s)")
    for shape in shapes:
        print("  " + " ".join(f"{k}={v}" for k, v in shape.items()))


def settings_errors(error: ValidationError, options: dict[str, Any] | None = None) -> str:
    """One line: each bad setting as its option (or environment variable), the value
    given, and what is allowed."""
    from warmup.core.settings import describe_errors  # pydantic: not for validate

    by_setting = {setting: option for option, setting in OVERRIDES.items()}
    names = {s: f"--{by_setting[s].replace('_', '-')}" for s in options or {} if s in by_setting}
    return describe_errors(error, names)
