"""Golden files and helpers for the protocol translator tests."""
