"""The sidecar: the probe and metrics HTTP server and the bundle watcher (no torch)."""
