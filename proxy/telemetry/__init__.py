"""Telemetry observes the engine's events and never decides anything (metrics, traces, logs)."""
