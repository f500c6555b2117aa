"""The one typed settings object, read once from ``TRITON_WARMUP_*`` and passed down."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from registry.fingerprint import MatchPolicy
from registry.volume import Volume


class Settings(BaseSettings):
    """Embedded defaults run the demo: a local folder as the volume and file locks."""

    model_config = SettingsConfigDict(env_prefix="TRITON_WARMUP_", extra="forbid")

    volume: Path = Field(Path("demo-volume"), description="the mounted volume's root")
    triton_cache_dir: Path | None = Field(
        None, description="TRITON_CACHE_DIR to restore into; None: Triton's default"
    )
    lock_url: str = Field(
        "", description="redis://..., unix://..., or a folder; '': <volume>/locks"
    )
    lock_ttl_s: float = Field(60.0, gt=0)
    lock_timeout_s: float = Field(1800.0, ge=0)
    match_policy: MatchPolicy = MatchPolicy.EXACT
    log_format: Literal["text", "json"] = "text"

    @property
    def paths(self) -> Volume:
        return Volume(self.volume)

    @property
    def lock_location(self) -> str:
        return self.lock_url or str(self.paths.locks)
