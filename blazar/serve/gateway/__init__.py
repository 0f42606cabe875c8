"""The gateway's edge: the aiohttp app, the listener, the one middleware (access,
tracing, errors), the relay.
"""
