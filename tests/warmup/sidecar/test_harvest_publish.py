"""The harvest's publisher: in order; what the tier did not take is kept, bounded, and
sent again first."""

from __future__ import annotations

from registry.families.file_harvest import Upload
from warmup.sidecar.harvest_publish import Publisher


class Tier:
    """A remote tier that takes files while it is up."""

    def __init__(self) -> None:
        self.up = True
        self.held: list[str] = []

    def send(self, remote: object, upload: Upload) -> bool:
        assert remote is self
        if self.up:
            self.held.append(upload.name)
        return self.up


def uploads(tier: Tier, *names: str, size: int = 1) -> list[Upload]:
    return [Upload("K", name, b"x" * size, tier.send) for name in names]


def test_without_a_tier_nothing_is_sent_nor_kept():
    tier = Tier()
    publisher = Publisher(None)
    assert not publisher.publish(uploads(tier, "a"))
    assert tier.held == [] and publisher.held() == []


def test_uploads_go_in_order():
    tier = Tier()
    assert Publisher(tier).publish(uploads(tier, "a", "b", "__grp__k.json"))  # type: ignore[arg-type]
    assert tier.held == ["a", "b", "__grp__k.json"]


def test_an_outage_keeps_the_rest_and_sends_it_first_next_time():
    tier = Tier()
    publisher = Publisher(tier)  # type: ignore[arg-type]
    tier.up = False
    assert not publisher.publish(uploads(tier, "a", "b"))
    assert [u.name for u in publisher.held()] == ["a", "b"]
    tier.up = True
    assert publisher.publish(uploads(tier, "c"))
    assert tier.held == ["a", "b", "c"] and publisher.held() == []


def test_what_is_kept_is_bounded_and_the_oldest_go():
    tier = Tier()
    publisher = Publisher(tier, max_held=25)  # type: ignore[arg-type]
    tier.up = False
    publisher.publish(uploads(tier, "a", "b", size=10))
    publisher.publish(uploads(tier, "c", size=10))
    assert [u.name for u in publisher.held()] == ["b", "c"]
