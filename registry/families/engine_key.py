"""What enters an inference engine's own cache key besides its files: the environment
variables and the paths an engine hashes when it looks its cache up. A declared folder
restored in full still misses in its engine when one of them differs from where the
folder was written, so each save records them beside the folder's files
(:class:`EngineKey`) and ``explain`` and the restore compare that record with this pod.

An entry names them (``key_env``: variable names or ``fnmatch`` patterns; ``key_paths``:
absolute paths) and its ``engine`` brings that engine's known ones (:data:`ENGINES`).
A value is recorded as it is, unless it is long or its name looks secret (a token, a
key, a password): then only a salted sha256 prefix is kept, and messages name the
variable without a value. Never a token in a record.

The record is plain JSON inside the stored index's ``key`` (``engine_key``), so it is
bundled, published and restored with the folder; a record that is missing or does not
read (an older folder) is unknown, and unknown compares as equal.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.core.explain import Differences

RECORD = "engine_key"  # its name in a declared folder's key (the stored index's "key")
MAX_PATTERNS = 64  # patterns of one spec: an entry's 32 and its engine's
MAX_PATTERN = 128
MAX_VARIABLES = 64  # variables recorded; the others are counted, never compared
MAX_NAME = 128
MAX_VALUE = 128  # longer values are recorded as digests
MAX_KEY_PATHS = 16
MAX_PATH = 1024
DIGEST_HEX = 16
# a name holding one of these words is a secret's: recorded as set, never its value
SECRET_WORDS = (
    "TOKEN", "KEY", "SECRET", "PASS", "PWD", "AUTH", "CRED", "PRIVATE", "SESSION", "COOKIE",
)  # fmt: skip
# a value that carries credentials whatever its name: a URL's user:password@, a header's
SECRET_VALUE = re.compile(r"://[^/@\s]*:[^/@\s]*@|^\s*(bearer|basic)\s", re.IGNORECASE)
SET = "set"  # a secret's record: present, its value neither kept nor digested
FIX = (
    "hold them equal across the fleet: the same value in every container of every pod "
    "(the chart sets the engine's environment alike in the init container, the sidecar "
    "and the server)"
)


@dataclass(frozen=True)
class EngineDefaults:
    """What an engine's cache key is known to hold: variables (patterns) and whether the
    folder's own path is in it (its cache root's path is written into the files it keeps)."""

    env: tuple[str, ...]
    own_path: bool


ENGINES: Mapping[str, EngineDefaults] = {
    # envs.compile_factors(): the VLLM_* environment; before vLLM PR 47573 also paths
    # derived from HOME and the XDG roots. It sets TRITON_CACHE_DIR under its root, and
    # Triton's group files name their members by absolute path.
    "vllm": EngineDefaults(("VLLM_*", "HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"), True),
    # SGLang's piecewise backend sets TRITON_CACHE_DIR under SGLANG_CACHE_DIR too
    "sglang": EngineDefaults(("SGLANG_*",), True),
    # DeepGEMM's JIT: DG_JIT_* (falling back to DJ_JIT_*), its cache in DG_JIT_CACHE_DIR
    "deepgemm": EngineDefaults(("DG_*", "DJ_*"), False),
    # FlashInfer's JIT: FLASHINFER_WORKSPACE_BASE, FLASHINFER_CUBIN_DIR, its arch list
    "flashinfer": EngineDefaults(("FLASHINFER_*",), False),
}


@dataclass(frozen=True)
class EngineKeySpec:
    """What one declared folder's engine keys its cache on: variable patterns, absolute
    paths, and whether the folder's own path is one of them."""

    env: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    own_path: bool = False

    @classmethod
    def of(
        cls, engine: str | None, key_env: Iterable[str] = (), key_paths: Iterable[Path | str] = ()
    ) -> EngineKeySpec:
        """An entry's own patterns and paths, unioned with its ``engine``'s defaults
        (:data:`ENGINES`); ValueError for an engine not in the table."""
        if engine is not None and engine not in ENGINES:
            raise ValueError(f"engine {engine!r} is not one of {', '.join(sorted(ENGINES))}")
        defaults = ENGINES[engine] if engine else EngineDefaults((), False)
        env = tuple(dict.fromkeys((*defaults.env, *key_env)))
        return cls(env, tuple(dict.fromkeys(str(p) for p in key_paths)), defaults.own_path)

    def matches(self, name: str) -> bool:
        """Whether variable ``name`` is one this engine keys on (case-sensitive, as the
        environment of a Linux process is)."""
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.env)


@dataclass(frozen=True)
class EngineKey:
    """The engine-key facts a folder was written under: its own path, each variable
    matched by a pattern (its value, or a digest of it), each key path and whether it
    existed. Bounded: at most :data:`MAX_VARIABLES` variables, the rest counted."""

    path: str
    spec: EngineKeySpec = field(default_factory=EngineKeySpec)
    env: Mapping[str, str] = field(default_factory=dict)  # name -> value
    # name -> a long value's salted sha256 prefix, or SET for a secret's (compared as present)
    digests: Mapping[str, str] = field(default_factory=dict)
    paths: Mapping[str, bool] = field(default_factory=dict)  # key path -> it existed
    left_out: int = 0  # variables matched past MAX_VARIABLES

    @classmethod
    def here(cls, spec: EngineKeySpec, folder: Path, env: Mapping[str, str]) -> EngineKey:
        """This process's facts for a folder at ``folder``, from its environment ``env``."""
        names = sorted(n for n in env if len(n) <= MAX_NAME and spec.matches(n))
        shown, digests = {}, {}
        for name in names[:MAX_VARIABLES]:
            value = env[name]
            if secret(name) or SECRET_VALUE.search(value):  # a digest of a short one is guessed
                digests[name] = SET
            elif len(value) > MAX_VALUE:
                digests[name] = digest(name, value)
            else:
                shown[name] = value
        paths = {p: Path(p).exists() for p in spec.paths}
        left = max(0, len(names) - MAX_VARIABLES)
        return cls(str(folder), spec, shown, digests, paths, left)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "own_path": self.spec.own_path,
            "patterns": list(self.spec.env),
            "env": dict(self.env),
            "digests": dict(self.digests),
            "paths": dict(self.paths),
            "left_out": self.left_out,
        }

    @classmethod
    def from_json(cls, data: object) -> EngineKey | None:
        """A stored record, checked field by field and bounded; None for one that is
        missing or does not read (unknown: nothing is compared)."""
        try:
            return _parsed(data)
        except (TypeError, ValueError, KeyError, AttributeError):
            return None

    def value(self, name: str) -> str | None:
        """How ``name`` is recorded: its value, ``sha256:<prefix>``, or None (unset)."""
        if name in self.digests:
            return f"sha256:{self.digests[name]}"
        return self.env.get(name)

    def names(self) -> set[str]:
        return {*self.env, *self.digests}


@dataclass(frozen=True)
class Difference:
    """One fact in the engine's key that differs: its factor for ``explain``
    (``env VLLM_X``, ``path``), both sides as shown, and one phrase for people."""

    factor: str
    mine: str
    stored: str
    phrase: str


def differences(here: EngineKey, there: EngineKey | None) -> list[Difference]:
    """What differs between this pod's facts and the record (none when the record is
    unknown). A variable is compared only where both sides looked for it (a pattern of
    this spec and of the record's) and neither left it out past the bound."""
    if there is None:
        return []
    found = _env_differences(here, there)
    if here.spec.own_path and here.path != there.path:
        phrase = f"path {here.path} here, {there.path} there"
        found.append(Difference("path", here.path, there.path, phrase))
    return found + _path_differences(here, there)


def _env_differences(here: EngineKey, there: EngineKey) -> list[Difference]:
    theirs = EngineKeySpec(there.spec.env)
    found = []
    for name in sorted(here.names() | there.names()):
        if not (here.spec.matches(name) and theirs.matches(name)):
            continue
        if (here.left_out or there.left_out) and name not in (here.names() & there.names()):
            continue  # one side may have left it out: unknown
        mine, stored = here.value(name), there.value(name)
        if mine == stored:
            continue
        if name in here.digests or name in there.digests:
            found.append(Difference(f"env {name}", "(not shown)", "(not shown)", f"{name} differs"))
            continue
        phrase = f"{name} is {_quoted(mine)} here, {_quoted(stored)} where it was written"
        found.append(Difference(f"env {name}", mine or "unset", stored or "unset", phrase))
    return found


def _path_differences(here: EngineKey, there: EngineKey) -> list[Difference]:
    found = []
    mine, theirs = set(here.paths), set(there.paths)
    if there.paths and mine != theirs:
        shown_here = ", ".join(sorted(mine - theirs)) or "none"
        shown_there = ", ".join(sorted(theirs - mine)) or "none"
        phrase = f"key paths {shown_here} here, {shown_there} there"
        found.append(Difference("path key_paths", shown_here, shown_there, phrase))
    # Whether a path exists is recorded, never compared: the engine's key holds the path,
    # and the init container and the sidecar need not mount what the server reads.
    return found


def as_factors(found: Sequence[Difference]) -> Differences:
    """The differences as ``explain``'s factors: ``{factor: (this host's, stored)}``."""
    return {d.factor: (d.mine, d.stored) for d in found}


def describe(found: Sequence[Difference]) -> str:
    """One line: ``VLLM_X is 'b' here, 'a' where it was written; path /a here, /b there``."""
    return "; ".join(d.phrase for d in found)


def secret(name: str) -> bool:
    """Whether a variable's name says its value is a secret (never recorded as is)."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def digest(name: str, value: str) -> str:
    """A value's salted sha256 prefix: equal values compare equal, and the name salts it
    so that one table of common values does not read every variable."""
    data = f"triton-warmup engine key\0{name}\0{value}".encode()
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def _quoted(value: str | None) -> str:
    if value is None:
        return "unset"
    return repr(value if len(value) <= 60 else value[:57] + "...")


def _parsed(data: object) -> EngineKey | None:
    if not isinstance(data, Mapping):
        return None
    path, own_path, left_out = data["path"], data["own_path"], data["left_out"]
    if not isinstance(path, str) or len(path) > MAX_PATH or not isinstance(own_path, bool):
        raise ValueError("path")
    if not isinstance(left_out, int) or isinstance(left_out, bool) or left_out < 0:
        raise ValueError("left_out")
    patterns = _strings(data["patterns"], MAX_PATTERNS, MAX_PATTERN)
    env = _mapping(data["env"], MAX_VARIABLES, MAX_NAME, str, MAX_VALUE)
    digests = _mapping(data["digests"], MAX_VARIABLES, MAX_NAME, str, DIGEST_HEX)
    paths = _mapping(data["paths"], MAX_KEY_PATHS, MAX_PATH, bool, 0)
    if len(env) + len(digests) > MAX_VARIABLES:
        raise ValueError("variables")
    spec = EngineKeySpec(tuple(patterns), tuple(paths), own_path)
    return EngineKey(path, spec, env, digests, paths, left_out)


def _strings(value: object, count: int, length: int) -> list[str]:
    if not isinstance(value, list) or len(value) > count:
        raise ValueError("list")
    if not all(isinstance(v, str) and 0 < len(v) <= length for v in value):
        raise ValueError("strings")
    return list(value)


def _mapping(value: object, count: int, length: int, kind: type, limit: int) -> dict[str, Any]:
    if not isinstance(value, Mapping) or len(value) > count:
        raise ValueError("mapping")
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key) <= length or not isinstance(item, kind):
            raise ValueError("entry")
        if isinstance(item, str) and len(item) > limit:
            raise ValueError("value")
    return dict(value)
