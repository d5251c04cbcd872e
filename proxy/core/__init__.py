"""The core: the running service, the relay, the recovery engine, admission and lifecycle."""
