"""A redis server's URL, read in one place: which URLs name one, how one is shown in a
message (never its password), and the client each user of redis makes from it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from registry.errors import RegistryError

SCHEMES = ("redis://", "rediss://", "unix://")


def is_redis(url: str) -> bool:
    """Whether ``url`` names a redis server (else: a lease folder, '' or 'off')."""
    return url.startswith(SCHEMES)


def redacted(url: str) -> str:
    """``url`` without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def client(url: str, *, timeout_s: float, user: str = "A redis client") -> Any:
    """A redis-py client for ``url`` whose calls wait at most ``timeout_s`` (to connect,
    and for each answer) and are never retried by redis-py: the caller decides what a
    failure means. :class:`RegistryError` saying that ``user`` needs redis-py when it is
    not installed; ``ValueError`` for a bad URL."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise RegistryError(f"{user} needs redis-py: pip install 'triton-warmup[redis]'.") from None

    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def cause(error: Exception) -> str:
    """Why a redis call failed, in the operating system's words where there are some
    ("Connection refused")."""
    inner = error.__context__
    if isinstance(inner, OSError) and inner.strerror:
        return inner.strerror
    return str(error).rstrip(".") or type(error).__name__
