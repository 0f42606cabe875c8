"""A model's settings turned into engine flags: cache and memory settings, tuned
settings (a profile over the manifest), and the chat template it is served with.
"""
