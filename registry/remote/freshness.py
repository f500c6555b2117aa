"""What a pod has seen of the remote tier's signed values, so that no older value
replayed at its own key is taken (:mod:`registry.remote.tier`).

A signed value carries its issue time (:mod:`registry.trust.remote_signature`). A
:class:`Freshness` keeps, per key and field, the newest issue time it has seen and a
digest of that value's payload, and refuses a value issued no later than that with
another payload: an older value replayed at its own key, or another value at the same
time. A value with the payload already seen is taken whatever its time (the same bytes
are used either way: a pod whose clock is behind, republishing the same pointer, is not
refused). Old envelopes read as issued at time 0: taken only until a value that carries
a time is seen. Only times that a trusted key vouched for count (an unsigned value can
claim any time: it is taken only where the trust allows unsigned, and never raises the
mark). When this pod publishes, it issues its value above anything it has seen for that
key (:meth:`Freshness.issue`), so its clock being behind never makes its own value older.

With a ``path`` (``<volume>/remote-seen.json``, :data:`FILE_NAME`), the marks persist:
the refusal holds across a restart of the pod. The file is written atomically (merged
with what other processes of the pod wrote since: each key's newest mark wins): a new
mark at once, then at most every :data:`SAVE_EVERY_S` while marks change (less often
where a save takes over a tenth of that; a timer saves a burst's last marks when the
interval ends), at :meth:`Freshness.save` (the tier's ``flush``, at the end of a run)
and at the process's exit. It is bounded: :data:`MAX_SEEN` keys (those with the oldest
marks dropped past it), read within :data:`MAX_FILE_BYTES`. A damaged file is
warned about once and replaced; a folder that is not there keeps the marks in memory
(no volume is made here). Without a path (library users, tests) they live in memory.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry.core import atomic
from registry.core.errors import named
from registry.trust.remote_signature import Opened

log = logging.getLogger(__name__)

VERSION = 1
FILE_NAME = "remote-seen.json"  # beside the volume's folders
MAX_SEEN = 50_000  # keys remembered: ~75 bytes each in the file
MAX_FILE_BYTES = 8 * 2**20
MAX_AHEAD_S = 300  # a signed time further ahead of this pod's clock is refused, never noted
SAVE_EVERY_S = 1.0  # a burst of reads writes the file once a second, not once a value
_LINE = re.compile(r"([0-9a-f]{32}) ([0-9]{1,20}) ([0-9a-f]{16})")  # slot, time, digest


def _slot(key: str, field: str) -> str:
    return hashlib.sha256(key.encode() + b"\0" + field.encode()).hexdigest()[:32]


def _digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()[:16]


class Freshness:
    """The newest issue time seen per (key, field) of the remote tier, and what it
    refuses because of them. ``path``: where the marks persist (None: in memory only);
    ``most``: how many keys are kept; ``max_age_s``: refuse signed values issued longer
    ago than that (a freeze: a server that keeps handing out what was once current);
    None, the default, for no limit. ``clock`` (ns), ``monotonic`` (s) and ``later``
    (runs a function in that many seconds: a daemon timer by default) are injectable."""

    def __init__(
        self,
        path: Path | None = None,
        *,
        most: int = MAX_SEEN,
        max_age_s: float | None = None,
        save_every_s: float = SAVE_EVERY_S,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
        later: Callable[[float, Callable[[], None]], None] | None = None,
    ) -> None:
        self.path = path
        self.most = most
        self.max_age_s = max_age_s
        self.save_every_s = save_every_s
        self._clock = clock
        self._monotonic = monotonic
        self._later = later or _in_a_thread
        self._pending = False  # a save is scheduled
        self._lock = threading.Lock()  # Triton's plug-in may read from several threads
        self._dirty = False
        self._saved_at = -math.inf  # the first mark is saved at once
        self._interval = save_every_s  # grows with the time a save takes
        self._wrote: tuple[int, int, int] | None = None  # the file as this process left it
        self._failed = False  # a save that failed was warned about once
        # slot -> (issue time, payload digest), oldest mark first
        self._seen: dict[str, tuple[int, str]] = {} if path is None else self._load(path)
        if path is not None:  # what a run that ends within the interval saw is kept too
            atexit.register(_save_at_exit, weakref.ref(self))

    def __len__(self) -> int:
        return len(self._seen)

    def newest(self, key: str, field: str = "") -> int:
        """The newest issue time seen for ``key`` (``field``); 0 for none."""
        mark = self._seen.get(_slot(key, field))
        return 0 if mark is None else mark[0]

    def refusal(self, key: str, field: str, value: Opened) -> str | None:
        """Why ``value``, read at ``key`` (``field``), is refused; None when it is taken
        (then its time is noted). Times no trusted key vouched for are neither checked
        nor noted."""
        if not value.vouched:
            return None
        ahead_s = (value.issued - self._clock()) / 1e9
        if ahead_s > MAX_AHEAD_S:  # its mark would make every value of the fleet look old
            return (
                f"issued at {value.issued} ns, {ahead_s:.0f} s ahead of this pod's clock; "
                f"at most {MAX_AHEAD_S} s (a signer's clock far ahead?)"
            )
        if self.max_age_s is not None:
            age_s = (self._clock() - value.issued) / 1e9
            if age_s > self.max_age_s:
                return (
                    f"issued at {value.issued} ns, {age_s:.0f} s ago; signatures expire "
                    f"after {self.max_age_s:g} s"
                )
        slot, digest = _slot(key, field), _digest(value.payload)
        with self._lock:
            mark = self._seen.get(slot)
            if mark is not None and digest != mark[1] and value.issued <= mark[0]:
                return (
                    f"issued at {value.issued} ns, not after {mark[0]} ns, the newest value "
                    "this pod has seen at this key (an older value replayed?)"
                )
            self._raise(slot, value.issued, digest)
        self._maybe_save()
        return None

    def note(self, key: str, field: str, value: Opened) -> None:
        """Note ``value``'s time (if a trusted key vouched for it and it is newer), with
        no check: a value this pod published, or one its publish replaces."""
        if not value.vouched or value.issued - self._clock() > MAX_AHEAD_S * 10**9:
            return
        with self._lock:
            self._raise(_slot(key, field), value.issued, _digest(value.payload))
        self._maybe_save()

    def issue(self, key: str, field: str = "") -> int:
        """The issue time of a value this pod publishes now at ``key`` (``field``): now,
        or just above the newest this pod has seen there when its clock is behind."""
        return max(self._clock(), self.newest(key, field) + 1)

    def _raise(self, slot: str, issued: int, digest: str) -> None:
        mark = self._seen.get(slot)
        if issued <= 0 or (mark is not None and issued <= mark[0]):
            return  # an old envelope's 0 never becomes a mark; a mark never goes down
        self._seen.pop(slot, None)  # to the end: the newest mark
        self._seen[slot] = (issued, digest)
        while len(self._seen) > self.most:
            del self._seen[next(iter(self._seen))]
        self._dirty = True

    # ---- the file ------------------------------------------------------------------

    def _maybe_save(self) -> None:
        if not self._dirty or self.path is None:
            return
        wait = self._interval - (self._monotonic() - self._saved_at)
        if wait <= 0:
            self.save()
            return
        with self._lock:  # a burst's last marks are saved when the interval ends
            if self._pending:
                return
            self._pending = True
        self._later(wait, self._deferred)

    def _deferred(self) -> None:
        with self._lock:
            self._pending = False
        self.save()

    def save(self) -> None:
        """Write the marks to :attr:`path` (when given, its folder there, and marks
        changed), merged with what the file holds when another process wrote it since.
        Never raises: a failure is warned once and the marks stay in memory."""
        if self.path is None or not self._dirty or not self.path.parent.is_dir():
            return
        with self._lock:
            started = self._monotonic()
            if _identity(self.path) != self._wrote:  # another process's marks: merged
                merged = self._read(self.path, quiet=True)
                for slot, mark in self._seen.items():
                    if slot not in merged or merged[slot][0] < mark[0]:
                        merged[slot] = mark
                self._seen = self._bounded(merged)
            lines = [f"{slot} {t} {d}" for slot, (t, d) in self._seen.items()]
            # compact, one line: 50,000 marks are ~4 MiB, written in tens of ms
            data = json.dumps({"version": VERSION, "seen": lines}, separators=(",", ":"))
            try:
                # not fsynced: it must outlive the pod's restart, not the node's power loss
                atomic.write_bytes(self.path, data.encode() + b"\n", durable=False)
            except OSError as e:
                if not self._failed:
                    self._failed = True
                    log.warning("remote tier: %s not written (%s): kept in memory", self.path, e)
                return
            self._wrote = _identity(self.path)
            self._dirty = False
            self._saved_at = self._monotonic()
            # a bigger file waits longer: saving takes at most a tenth of the time
            self._interval = max(self.save_every_s, 10 * (self._saved_at - started))

    def _bounded(self, marks: dict[str, tuple[int, str]]) -> dict[str, tuple[int, str]]:
        newest = sorted(marks.items(), key=lambda item: item[1][0])[-self.most :]
        return dict(newest)

    def _load(self, path: Path) -> dict[str, tuple[int, str]]:
        marks = self._bounded(self._read(path, quiet=False))
        self._wrote = _identity(path) if not self._dirty else None
        return marks

    def _read(self, path: Path, *, quiet: bool) -> dict[str, tuple[int, str]]:
        try:
            return _parse(atomic.loads(atomic.read_bounded(path, MAX_FILE_BYTES)))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            if not quiet:
                self._dirty = True  # replaced by the next save
                log.warning(
                    "remote tier: %s is damaged (%s): starting with no values seen; it is replaced",
                    path,
                    named(e),
                )
            return {}


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells a file this process wrote from one written since: None for none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _parse(data: Any) -> dict[str, tuple[int, str]]:
    """The marks in a file's JSON (oldest first); ValueError for anything
    :meth:`Freshness.save` did not write."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} file")
    lines = data.get("seen")
    if not isinstance(lines, list):
        raise ValueError("no 'seen' list")
    marks = {}
    for line in lines:
        found = _LINE.fullmatch(line) if isinstance(line, str) else None
        if found is None:
            raise ValueError(f"a bad mark {str(line)[:60]!r}")
        marks[found[1]] = (int(found[2]), found[3])
    return marks


def _in_a_thread(delay_s: float, fn: Callable[[], None]) -> None:
    timer = threading.Timer(delay_s, fn)
    timer.daemon = True  # never holds a process's exit: the exit's own save follows
    timer.start()


def _save_at_exit(ref: weakref.ref[Freshness]) -> None:
    seen = ref()
    if seen is not None:
        seen.save()
