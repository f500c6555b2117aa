"""Triton's compiled kernels: the files of ``TRITON_CACHE_DIR`` (cubins, their metadata
and group files, launcher stubs), kept on the volume at ``<volume>/triton-cache``.

Restored into this pod's TRITON_CACHE_DIR before anything compiles (group files pointed
at their new folder), saved back at the run's end with the host's origin recorded for
``explain`` (:mod:`registry.triton_cache`). Triton's own hash names each folder, so the
key needs nothing of ours and no path enters it.
"""

from __future__ import annotations

from registry import remote_triton, triton_cache
from registry.explain import Prediction, predict
from registry.families.base import Family, Host, Moved, Scope, Sources
from registry.triton_cache import Kind, Origin


class TritonKernels(Family):
    name = "triton-kernels"
    order = 20

    def restore(self, scope: Scope) -> Moved:
        done = triton_cache.restore(scope.volume.triton_cache, scope.triton_cache_dir)
        return Moved(self.name, copied=done.copied, present=done.present)

    def save(self, scope: Scope) -> Moved:
        """New files onto the volume; with the host known, its origin recorded."""
        origin = None
        if scope.fingerprint is not None:
            origin = Origin.of(scope.fingerprint, scope.triton_env)
        done = triton_cache.save(scope.triton_cache_dir, scope.volume.triton_cache, origin)
        return Moved(self.name, copied=done.copied, present=done.present)

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        return triton_prediction(self.name, "kernels", scope, host, sources)


def triton_prediction(
    family: str, kind: Kind, scope: Scope, host: Host, sources: Sources
) -> Prediction:
    """Triton's kernels or autotune results: on the volume (``restore`` relocates them),
    in this pod's TRITON_CACHE_DIR (as Triton reads it), on the remote tier (sampled)."""
    volume = scope.volume.triton_cache
    recorded = triton_cache.origins(volume)  # read once: they also name a restored cache's
    held, unknown = triton_cache.held_differences(volume, host.triton, kind, known=recorded)
    if sources.local:
        mine, mine_unknown = triton_cache.held_differences(
            scope.triton_cache_dir, host.triton, kind, restored=False, known=recorded
        )
        held.update(mine)
        unknown = (unknown - set(held)) | mine_unknown
    if sources.remote is not None:
        for cache_key, data in remote_triton.sample_metadata(sources.remote).items():
            try:
                factors = triton_cache.metadata_factors(data)
                held.setdefault(cache_key, triton_cache.compare(host.triton, factors))
            except ValueError:
                unknown.add(cache_key)
    note = f"{len(unknown)} of unknown origin not predicted" if unknown else ""
    return predict(family, held.values(), note=note)


FAMILY = TritonKernels()
