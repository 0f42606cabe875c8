"""Model files and what they say: GGUF facts, the registry of pulled models, file
sets and hashing, vocabularies, and `fit`'s memory estimate.
"""
