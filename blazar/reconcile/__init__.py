"""The reconcile pass: the manifest applied to the host through the reconcilers,
the real ports they act through, and the lock file.
"""
