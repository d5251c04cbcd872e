"""Per-tool recovery policy: the on-disk files, their compiled frozen form, and the live snapshot."""
