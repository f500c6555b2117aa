"""The collectives that keep ranks choosing alike, over two gloo ranks and alone."""

import multiprocessing
import os

import torch.distributed as dist

from kernels.collectives import agree, all_true


def test_one_process_answers_alone_without_a_process_group():
    assert not dist.is_initialized()
    assert agree("mine", group=None, world=1) == "mine"
    assert all_true(False, group=None, world=1, device="cpu") is False


def _rank(rank: int, init: str, results: "multiprocessing.Queue[tuple[int, object]]") -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    try:
        cpu = dist.group.WORLD
        agreed = agree({"from": rank}, group=cpu, world=2)
        one_says_no = all_true(rank == 0, group=cpu, world=2, device="cpu")
        both_say_yes = all_true(True, group=None, world=2, device="cpu")
        results.put((rank, (agreed, one_says_no, both_say_yes)))
    finally:
        dist.destroy_process_group()


def test_two_ranks_take_rank_0s_value_and_a_vote_that_one_loses_is_lost(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    init = os.fspath(tmp_path / "init")
    ranks = [spawn.Process(target=_rank, args=(r, init, results)) for r in range(2)]
    for process in ranks:
        process.start()
    answers = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
    assert answers == {r: ({"from": 0}, False, True) for r in range(2)}
