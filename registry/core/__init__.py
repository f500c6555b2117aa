"""The foundations every room stands on: errors, configs, entries, fingerprints, atomic
files, the volume's layout."""
