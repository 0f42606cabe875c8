"""Helpers for Blazar's tests: tiny models the real engine can serve."""
