"""Tuned configs: the registry's own entries, one per kernel, shape and host.

They live in the store on the volume, read in place: nothing is copied into the pod and
nothing is saved at the run's end (the tuner writes each entry as it is made). What a
family adds for them is the prediction: whether this host's fingerprint, under the
match policy, and each kernel's source hash would hit the entries the store, the bundles
waiting to install and (sampled) the remote tier hold.
"""

from __future__ import annotations

from registry.core.entry import Entry
from registry.core.explain import Differences, Prediction, fingerprint_differences, predict
from registry.core.fingerprint import MatchPolicy
from registry.families.base import Family, Host, Scope, Sources


class TunedConfigs(Family):
    name = "tuned-configs"
    order = 10

    def explain(self, scope: Scope, host: Host, sources: Sources) -> Prediction:
        """The store's entries, the pending bundles' and (sampled) the remote tier's."""
        found: dict[tuple[str, str, str], Entry] = {}
        held = [scope.store().entries(), *(b.entries for b in sources.bundles)]
        if sources.remote is not None:
            held.append(sources.remote.sample())
        for entries in held:
            for entry in entries:
                found.setdefault((entry.kernel, entry.key_json, entry.fingerprint.digest()), entry)
        differences = [_differences(e, host, scope.match_policy) for e in found.values()]
        return predict(self.name, differences, note=f"policy {scope.match_policy.value}")


def _differences(entry: Entry, host: Host, policy: MatchPolicy) -> Differences:
    kernel_hash = host.kernel_hashes.get(entry.kernel, entry.fingerprint.kernel_hash)
    mine = host.fingerprint.with_kernel(kernel_hash)
    return fingerprint_differences(mine.mismatches(entry.fingerprint, policy))


FAMILY = TunedConfigs()
