"""The gateway's long-lived parts beside the scheduler: sessions, remotes, tracing,
live figures.
"""
