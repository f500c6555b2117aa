"""The remote tier on Redis: transport, values, the families' namespaces."""
