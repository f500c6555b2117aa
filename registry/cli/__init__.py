"""The ``registry`` command line."""
