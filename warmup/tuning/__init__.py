"""Tuning: a cache miss made a stored, verified best config, alone or shared by a fleet."""
