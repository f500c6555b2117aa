"""Ways to spoil a stored file, for the fuzz tests of every file kind the project reads:
each takes the file's bytes and a seeded random generator and returns new bytes."""

from __future__ import annotations

import json
import random

WRONG_VALUES = [None, True, 0, -1, 2**70, 10**400, 1.5, "", "x" * 300, [], [1], {}, {"a": [None]}]


def _spoil_json(data: bytes, rng: random.Random) -> bytes:
    """Replace one value somewhere in the JSON document with a wrong-typed one."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data[: rng.randrange(len(data) + 1)]
    holder, key = _random_slot(doc, rng)
    if holder is None:
        return json.dumps(rng.choice(WRONG_VALUES)).encode()
    holder[key] = rng.choice([*WRONG_VALUES, "DEEP"])
    return json.dumps(doc).replace('"DEEP"', "[" * 20_000 + "]" * 20_000).encode()


def _random_slot(doc: object, rng: random.Random) -> tuple[object, object]:
    slots: list[tuple[object, object]] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        items = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for key, value in items:
            slots.append((node, key))
            stack.append(value)
    return rng.choice(slots) if slots else (None, None)


def _flip_bits(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data or b"\0")
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


MUTATIONS = {
    "truncate": lambda data, rng: data[: rng.randrange(len(data) + 1)],
    "flip bits": _flip_bits,
    "wrong type": _spoil_json,
    "deep nest": lambda data, rng: b"[" * 100_000 + b"]" * 100_000,
    "empty": lambda data, rng: b"",
    "garbage": lambda data, rng: rng.randbytes(rng.randint(1, 2000)),
}
