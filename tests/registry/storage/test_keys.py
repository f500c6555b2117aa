"""One "nearest" rule for the tuner's fallback and the serving table, and the store's
queries built on it."""

import math

from registry import Entry, KernelConfig, MatchPolicy, Store
from registry.storage import keys
from tests.conftest import gpu_fingerprint


def test_numbers_are_as_near_as_their_ratio_and_other_fields_must_match():
    assert keys.log_distance(512, 1024) == keys.log_distance(1024, 512) == 1.0
    assert keys.log_distance(12, 8) == keys.log_distance(18, 12)  # a tie stays a tie
    assert keys.key_distance({"M": 512, "d": "bf16"}, {"M": 1024, "d": "bf16"}) == 1.0
    assert keys.key_distance({"M": 512, "d": "bf16"}, {"M": 512, "d": "fp16"}) == math.inf
    assert keys.key_distance({"M": 512}, {"M": 512, "N": 8}) == math.inf
    assert keys.key_distance({"M": 0}, {"M": 1}) < math.inf  # zero is floored, not log(0)
    assert keys.key_distance({"flag": True}, {"flag": 1}) == 0.0  # equal, not numbers


def put(store, m, n=64, block=16, fingerprint=None, dtype="bf16"):
    config = KernelConfig.make({"BLOCK_M": block})
    key = {"M": m, "N": n, "dtype": dtype}
    entry = Entry.make("k", key, fingerprint or gpu_fingerprint(), config)
    return store.put(entry)


def test_the_store_answers_the_nearest_entry_of_a_kernel_on_a_matching_host(tmp_path):
    store = Store(tmp_path)
    here = gpu_fingerprint()
    assert store.nearest("k", {"M": 1, "N": 64, "dtype": "bf16"}, here) is None
    put(store, 64, block=16)
    put(store, 1024, block=64)
    put(store, 300, block=128, dtype="fp16")  # another dtype: never near
    put(store, 2048, n=32, block=32)  # N differs too: farther
    assert store.nearest("k", bf16(200), here).key["M"] == 64
    assert store.nearest("k", bf16(800), here).key["M"] == 1024
    assert store.nearest("other", bf16(64), here) is None
    h100 = gpu_fingerprint("NVIDIA H100", sms=132)
    assert store.nearest("k", bf16(64), h100) is None  # exact: not this GPU
    assert store.nearest("k", bf16(64), h100, MatchPolicy.SAME_ARCH) is not None


def bf16(m, n=64):
    return {"M": m, "N": n, "dtype": "bf16"}


def test_like_finds_each_m_of_one_layer(tmp_path):
    store = Store(tmp_path)
    for m in (256, 8, 64):
        put(store, m, block=m)
    put(store, 16, n=32)  # another layer
    put(store, 16, dtype="fp16")  # and another
    put(store, 32, fingerprint=gpu_fingerprint("NVIDIA B200", cc="10.0", sms=148))
    layer = store.like("k", bf16(1), gpu_fingerprint(), MatchPolicy.EXACT, free="M")
    assert list(layer) == [8, 64, 256]  # by M; other layers and hosts left out
    assert [e.best.meta["BLOCK_M"] for e in layer.values()] == [8, 64, 256]
    assert store.like("k", bf16(1, n=128), gpu_fingerprint(), MatchPolicy.EXACT, free="M") == {}
