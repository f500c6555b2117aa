"""A serving op's table: each M's config, its own bucket's or the nearest's; rehearsals."""

from registry import KernelConfig
from warmup.serving.table import (
    FALLBACK,
    NEAREST,
    REHEARSALS,
    SOURCES,
    TUNED,
    nearest_table,
    rehearsal,
)


def config(block_m: int, algorithm: str | None = None) -> KernelConfig:
    return KernelConfig.make(
        {"BLOCK_M": block_m, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
        algorithm=algorithm,
        num_warps=4,
    )


def test_each_m_takes_its_own_bucket_else_the_nearest_in_log_distance():
    tuned = {8: config(16), 32: config(32), 128: config(64)}
    table = nearest_table(tuned, step=1, max_m=300)
    chosen = {m: table.config_for(m).meta["BLOCK_M"] for m in (1, 8, 15, 16, 17, 32, 64, 65, 300)}
    # 16 is as far from 8 as from 32 (x2 both ways): a tie goes to the larger M
    assert chosen == {1: 16, 8: 16, 15: 16, 16: 32, 17: 32, 32: 32, 64: 64, 65: 64, 300: 64}
    assert [table.source[m] for m in (8, 9, 32, 300)] == [TUNED, NEAREST, TUNED, NEAREST]
    assert len(table.configs) == 3 and len(table.pick) == 301


def test_a_gathered_table_is_indexed_by_rows_per_rank():
    table = nearest_table({6: config(16), 60: config(32)}, step=3, max_m=99)
    assert len(table.pick) == 34  # M = 0, 3, ..., 99
    assert table.config_for(2).meta["BLOCK_M"] == 16  # M = 6
    assert table.config_for(33).meta["BLOCK_M"] == 32  # M = 99
    assert table.source[2] == TUNED and table.source[20] == TUNED and table.source[19] == NEAREST


def test_an_op_rehearses_each_config_once_up_to_a_bound():
    few = nearest_table({8: config(16), 512: config(32)}, step=1, max_m=1000)
    many = nearest_table({2**i: config(16 * (i + 1)) for i in range(10)}, step=1, max_m=1000)
    assert rehearsal(few) == [config(32), config(16)]  # the config most Ms use comes first
    assert len(rehearsal(many)) == len(set(rehearsal(many))) == REHEARSALS < len(many.configs)


def test_the_sources_name_the_ways_a_config_is_chosen():
    assert SOURCES[TUNED] == "tuned" and SOURCES[NEAREST] == "nearest"
    assert SOURCES[FALLBACK] == "fallback"
