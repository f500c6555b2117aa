"""Bundles: create, verify, install, rollback; one streamed reader handed each family's
part."""
