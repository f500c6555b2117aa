"""The foundations of the main job: settings, services, the manifest, results, metrics,
logs, collectives."""
