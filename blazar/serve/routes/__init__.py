"""The route modules: each protocol's HTTP surface, translating to and from the one
request path.
"""
