"""The cold-start bench's side-by-side table: each warm phase beside the floor's that
does the same work, and why where the warm run spends more."""

from bench.cold_start import ABOVE_S, VS_FLOOR, phase_vs_floor, vs_floor_lines


def test_rows_above_the_floor_say_why_and_the_others_do_not():
    warm = {"rank_start": 1.5, "rendezvous": 0.9, "setup": 0.2, "compile": 0.1, "check": 0.05}
    warm |= {"restore": 0.4, "exit": 0.1, "new_phase": 0.3}
    floor = {"imports": 1.1, "rendezvous": 0.95, "setup": 0.2 - ABOVE_S / 2, "launch": 0.3}
    floor |= {"exit": 0.1}
    rows = phase_vs_floor(warm, 3.5, floor, 2.8)
    assert (
        rows["rank_start"]["warm_minus_floor_s"] == 0.4 and "pydantic" in rows["rank_start"]["why"]
    )
    assert rows["compile+check"] == {"warm_s": 0.15, "floor_s": 0.3, "warm_minus_floor_s": -0.15}
    assert "why" not in rows["rendezvous"] and "why" not in rows["setup"]  # not above
    assert "why" in rows["restore"]  # beside the ranks, but above the floor's none
    assert "new_phase" in rows and "why" not in rows["new_phase"]  # a newer phase: no words
    # other: the wall time no phase holds (restore overlaps: not counted)
    assert rows["other"]["warm_s"] == round(3.5 - (1.5 + 0.9 + 0.2 + 0.15 + 0.1 + 0.3), 4)
    assert "why" in rows["other"] and "why" not in rows["total"]
    lines = vs_floor_lines(rows)
    assert any(line.startswith("rank_start") and "pydantic" in line for line in lines)
    assert not any(line.startswith("setup") and "reference" in line for line in lines)


def test_every_row_has_its_reason():
    assert all(why for _, _, _, why in VS_FLOOR)
