"""Blazar: a local LLM serving control plane.

This package holds the machinery (store, model registry, engines, CLI). It may
import `reconcilers` and `specs`; they never import it (see pyproject's
import-linter contract).
"""

__version__ = "0.1.0"
