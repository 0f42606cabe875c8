"""Engine lanes: installing, listing and switching inference servers.

A lane is a kind of server (`llamacpp`); an engine is one installed version of
it, named by a tag such as `b11549-cpu`. Every install method (wheel, release,
source) yields the same contract: `command + llama-server flags` starts an
HTTP server with llama-server's API.
"""
