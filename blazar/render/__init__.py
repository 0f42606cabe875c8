"""Renderers: the manifest in another system's terms (`blazar render`)."""
