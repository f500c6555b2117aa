"""The run: its checks, launching ranks, one rank's session and runner, the restore, the
aggregation of the ranks' reports, collectives, time by phase."""
