"""The store: Blazar's SQLite database (its tables as typed records), fast reads for
the CLI, the schema's migrations, and the profiles `blazar tune` keeps.
"""
