"""Rank 0's work shared with every rank: its result, or one TuneError on every rank."""

import pytest

from registry import RegistryError
from tests.warmup.tuning.fakes import configs
from warmup.core.collectives import Chosen, Lockstep
from warmup.tuning.leader import on_leader
from warmup.tuning.measure import TuneError


def _run(work):
    return on_leader(Lockstep(), work, Chosen, what="test", failed="fake at M=8", timeout_s=1.0)


def test_rank_0s_result_is_every_ranks():
    chosen = Chosen(config=configs(64)[0], source="here")
    assert _run(lambda: chosen) is chosen  # one process: rank 0 keeps its own object


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RegistryError("store unreadable"), "fake at M=8: store unreadable"),
        (OSError(28, "No space left on device"), "fake at M=8: OSError: "),
    ],
)
def test_a_failure_on_rank_0_is_one_tune_error_naming_it(error, said):
    def work():
        raise error

    with pytest.raises(TuneError) as raised:
        _run(work)
    assert str(raised.value).startswith(said)
