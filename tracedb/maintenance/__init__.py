"""Maintenance of a data directory: compact, recover, prune, verify, repair, backup."""
