"""What crosses ranks is typed: each payload survives its JSON form, and a malformed one
fails on the receiving rank at once."""

import pydantic
import pytest

from registry import Entry, KernelConfig
from registry.remote.tiered import TieredFence
from registry.storage.store import Fence
from tests.conftest import gpu_fingerprint
from warmup.core.collectives import (
    Answer,
    Candidates,
    Chosen,
    LearnedDims,
    LockDecision,
    Lockstep,
    Lookup,
    Number,
    Stored,
)

CONFIG = KernelConfig.make({"BLOCK_M": 64}, algorithm="fused_pull", num_warps=8)
FENCE = TieredFence(Fence("ag_gemm/x.json", ""), remote="")
ENTRY = Entry.make("ag_gemm", {"M": 64, "N": 8, "K": 16}, gpu_fingerprint(), CONFIG)


def sent(payload):
    """What a follower rank makes of rank 0's payload: its JSON, validated."""
    return type(payload).model_validate(payload.model_dump(mode="json"))


@pytest.mark.parametrize(
    "payload",
    [
        Answer(value={"a": [1, 2]}),
        Answer(error="registry lookup failed: OSError: disk gone"),
        Lookup(),
        Lookup(
            found={"entry": ENTRY, "remote": True},
            fence=TieredFence(Fence("ag_gemm/x.json", ""), remote=""),
        ),
        LockDecision(deferred="held by pod-b"),
        Stored(entry=ENTRY, superseded=True),
        Chosen(config=CONFIG, source="{'M': 32}"),
        Candidates(configs=[CONFIG, KernelConfig.make({"BLOCK_M": 16})]),
        Number(value=0.25),
        LearnedDims(dims=[{"batch": 3}]),
    ],
    ids=lambda p: type(p).__name__,
)
def test_each_payload_arrives_as_it_was_sent(payload):
    assert sent(payload) == payload


def test_a_malformed_payload_fails_where_it_is_read():
    with pytest.raises(pydantic.ValidationError):
        Stored.model_validate({"entry": ENTRY.to_json(), "superseeded": True})  # misspelt
    with pytest.raises(pydantic.ValidationError):
        Chosen.model_validate({"config": {"num_warps": "many"}})


def test_one_process_shares_its_own_value():
    steps = Lockstep(None)
    assert not steps.active and steps.leader
    assert steps.share(Number(value=1.5), Number, what="x").value == 1.5
