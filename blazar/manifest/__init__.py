"""Edits of the user's manifest: the file editor (comments kept), the imperative
operations (pull, rm, config set, ...), API keys, derived models, Modelfiles,
quantized copies, and the default engine kind.
"""
