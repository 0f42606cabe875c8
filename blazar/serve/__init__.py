"""Blazar's serving runtime: supervised engine children, scheduling and the HTTP front."""
