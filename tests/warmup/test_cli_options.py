"""The command line agrees with itself: ``--volume``, ``--debug`` and ``-v`` before or
after any command, no demo defaults (``run``, ``serve``, ``explain`` need a manifest and
a volume), bad paths refused at start in one line, help that reads plain."""

import pytest

from tests.conftest import DEMO, error_line
from warmup.cli import build_parser, main
from warmup.core.settings import Settings


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """A working folder and no TRITON_WARMUP_* variable: only what the command says."""
    monkeypatch.chdir(tmp_path)
    for name in ("VOLUME", "WORK_DIR", "MANIFEST"):
        monkeypatch.delenv(f"TRITON_WARMUP_{name}", raising=False)
    return tmp_path


def _files(folder):
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


@pytest.mark.parametrize("command", ["run", "serve", "explain"])
@pytest.mark.parametrize("given", ["nothing", "volume", "manifest"])
def test_a_command_without_its_manifest_or_volume_exits_2_naming_both_ways(
    bare, capsys, command, given
):
    (bare / "vol").mkdir()
    argv = {
        "nothing": [],
        "volume": ["--volume", str(bare / "vol")],
        "manifest": ["--manifest", str(DEMO)],
    }[given]
    assert main([command, *argv]) == 2
    line = error_line(capsys.readouterr().err)
    if given != "manifest":
        assert "--manifest or TRITON_WARMUP_MANIFEST" in line
    if given != "volume":
        assert "--volume or TRITON_WARMUP_VOLUME" in line
    assert _files(bare) == [bare.joinpath("vol").relative_to(bare)]  # no demo-volume, no work


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_missing_manifest_is_refused_at_start_in_one_line(bare, capsys, command):
    (bare / "vol").mkdir()
    argv = [command, "--volume", str(bare / "vol"), "--manifest", "missing.yaml"]
    argv += ["--work-dir", str(bare / "work"), "--port", "0"]
    assert main(argv if command == "serve" else argv[:-2]) == 2  # serve: never answers 503
    line = error_line(capsys.readouterr().err)
    assert "missing.yaml: cannot read" in line
    assert _files(bare) == [bare.joinpath("vol").relative_to(bare)]


PLACES = {  # where the options go: before the command, after it, after a nested one
    "before": ["--volume", "{vol}", "-v", "registry", "ls"],
    "after-registry": ["registry", "--volume", "{vol}", "-v", "ls"],
    "after-command": ["registry", "ls", "--volume", "{vol}", "-v"],
    "after-nested": ["registry", "bundle", "list", "--volume", "{vol}", "-v"],
}


@pytest.mark.parametrize("where", PLACES)
def test_the_volume_and_verbose_are_taken_anywhere(bare, capsys, where):
    (bare / "vol").mkdir()
    argv = [a.format(vol=bare / "vol") for a in PLACES[where]]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"0 entries in {bare / 'vol' / 'registry'}" in out or "GENERATION" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "registry", "ls"],
        ["registry", "--debug", "ls"],
        ["registry", "ls", "--debug"],
        ["registry", "bundle", "list", "--debug"],
        ["doctor", "--only", "volume", "--debug"],
        ["validate", str(DEMO), "--debug"],
    ],
)
def test_debug_shows_where_wherever_it_is_put(bare, capsys, monkeypatch, argv):
    def broken(*args, **kwargs):
        raise TypeError("something internal")

    for name in ("registry.cli.main.run", "warmup.doctor.run", "warmup.cli._validate"):
        monkeypatch.setattr(name, broken)
    plain = [a for a in argv if a != "--debug"]
    assert main(plain) == 1
    assert "TypeError: something internal (--debug shows where)" in error_line(
        capsys.readouterr().err
    )
    assert main(argv) == 1
    assert "Traceback" in capsys.readouterr().err


def test_every_command_takes_the_volume(bare):
    parser = build_parser(Settings())
    for argv in (
        ["run"], ["serve"], ["status"], ["doctor"], ["explain"], ["validate", "m.yaml"],
        ["registry", "ls"], ["registry", "bundle", "install", "b.tgz"], ["registry", "rollback"],
    ):  # fmt: skip
        assert parser.parse_args([*argv, "--volume", "v"]).volume.name == "v", argv


def test_help_reads_plain_and_shows_choices_as_typed(bare, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and ":func:" not in top and "Exit codes: 0 done" in top
    with pytest.raises(SystemExit):
        main(["registry", "bundle", "install", "--help"])
    install = capsys.readouterr().out
    assert "{exact,same-arch,any}" in install and "MatchPolicy" not in install


def test_validate_takes_triton_warmup_debug_as_the_other_commands_do(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_WARMUP_DEBUG", "true")
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "Traceback" in capsys.readouterr().err
    monkeypatch.delenv("TRITON_WARMUP_DEBUG")
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 2
    assert "Traceback" not in capsys.readouterr().err
