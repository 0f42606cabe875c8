"""The supervisor: the scheduler, each child's owner (instance), the runtimes and
the child client.
"""
