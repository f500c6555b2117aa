"""``python -m warmup``: the ``triton-warmup`` program."""

from warmup.program import entry

entry()
