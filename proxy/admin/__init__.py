"""The admin port: health, readiness, metrics, policies and the status page."""
