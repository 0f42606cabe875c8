"""The one request path: resolve, require, keep_alive, lease, admit, trace, call the
child, release.
"""
