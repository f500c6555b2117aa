"""The run: launching ranks, one rank's session and runner, collectives, time by phase."""
