"""Desired state: what a user wants a host to have.

Pure definitions (names now; the manifest's pydantic models later). No I/O
beyond reading manifest files, and no imports of `reconcilers` or `blazar`.
"""
