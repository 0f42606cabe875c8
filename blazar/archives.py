"""Archives Blazar opens, bounded before they are read (filled in by the hardening work)."""

from __future__ import annotations
