"""Desired state: what a user wants a host to have.

Pure definitions, no I/O beyond reading manifest files, and no imports of
`reconcilers` or `blazar` (an import-linter contract checks it):

    names, sources   model names and source strings
    durations        "5m", "30s", "-1"
    manifest         the pydantic models of a manifest (fields in fields.py)
    loader           TOML/YAML files or a directory -> Manifest, or ManifestError
    aliases          the user guide's flat names (`port`) for the manifest's keys
    problems         Location, Problem, ManifestError
    schema           JSON Schema and docs/manifest.md (`python -m specs.schema`)
"""
