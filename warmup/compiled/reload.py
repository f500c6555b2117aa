"""Hot reload of compiled models: after the sidecar installs a bundle, the indexes it
brought for a declared model (at the model's current key and this node's fingerprint)
are restored into the pod's Inductor cache.

A model the server has compiled already keeps running the code it loaded; what the
restore serves is every compile still to come in the pod: a server container that
restarts, a shape the warm never ran, a model whose warm failed. Indexes for other
models, keys or machines stay on the volume for the pods they fit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from registry.caches import inductor_cache
from registry.caches.inductor_cache import Restored
from registry.core.fingerprint import Fingerprint
from warmup.compiled.key import model_key
from warmup.core.manifest import ModelEntry
from warmup.core.services import Services

log = logging.getLogger(__name__)


def restore_installed(
    services: Services,
    models: Iterable[ModelEntry],
    fingerprint: Fingerprint,
    indexes: Iterable[str],
) -> dict[str, Restored]:
    """Restore each of ``indexes`` (``models/...`` paths a bundle installed into the
    volume's family) that belongs to one of ``models`` on this node; by model name."""
    installed = set(indexes)
    done: dict[str, Restored] = {}
    for model in models:
        try:  # the key reads the build's package: its __init__ may raise anything
            digest = model_key(model).digest
            if inductor_cache.index_relpath(model.name, digest, fingerprint) not in installed:
                continue
            restored = inductor_cache.restore(
                services.volume.inductor,
                services.settings.folders.inductor_cache_dir,
                model=model.name,
                key_digest=digest,
                fingerprint=fingerprint,
            )
        except Exception as e:  # one model's: the others still reload
            log.warning("model %s: not reloaded: %s", model.name, e)
            continue
        log.info(
            "model %s: reloaded from a bundle: %d files copied, %d present, %d quarantined",
            model.name,
            restored.copied,
            restored.present,
            restored.quarantined,
        )
        done[model.name] = restored
    return done
