"""The host Blazar runs on: child processes, the apply lock, the hardware it
sees, and Blazar's own upgrade.
"""
