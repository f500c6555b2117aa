"""One rank's session: its own end (rank 0's) and its bad input, as a rank says them."""

from tests.conftest import DEMO, settings_for
from warmup.core.manifest import load_manifest
from warmup.core.results import RunStatus
from warmup.core.services import Services
from warmup.run import session
from warmup.run.aggregate import RunRecord


def test_a_failure_in_rank_0_s_finish_is_a_failed_status_every_rank_gets(tmp_path, monkeypatch):
    settings = settings_for(tmp_path)
    services, manifest = Services(settings), load_manifest(DEMO)
    record = RunRecord(services=services, manifest=manifest, run_dir=tmp_path, world=2, started=1.0)

    def broken(record):
        raise OSError("the volume went away")

    monkeypatch.setattr(session, "finish", broken)
    status = session._finish_or_fail(record)
    assert status.state == "failed" and status.errors == ["OSError: the volume went away"]
    assert status.started == 1.0 and status.world_size == 2
    assert RunStatus.read(settings.paths.status_file) == status
    assert session._shared_status(status, None) is status  # no group: as it is


def test_a_torchrun_rank_says_each_problem_on_its_own_line_and_exits_2(
    tmp_path, capsys, torchrun_rank
):
    settings = settings_for(tmp_path)
    settings.paths.volume.mkdir()
    torchrun_rank(settings, 3)  # DEMO's entries are for 2 ranks
    assert session.main() == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(line.startswith("triton-warmup: error: rank 0: ") for line in lines)
    assert any("no entry for world size 3" in line for line in lines)
    assert not settings.paths.work_dir.exists()
