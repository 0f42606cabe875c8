"""URLs a client or a manifest named, checked as the connector will see them (filled in by
the hardening work)."""

from __future__ import annotations
