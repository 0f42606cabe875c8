"""Fields the manifest validates but Blazar does not act on yet: a manifest using one is refused.

A user who declares a field believes Blazar acts on it. Until the work that
implements a field lands, `blazar diff`, `apply` and `serve` refuse a
manifest that uses it, naming the field and saying it is not supported yet
(`blazar.reconcile.apply.load` calls `unsupported`). Pure: a function of the
manifest. When a field becomes real, its entry here goes away.
"""

from __future__ import annotations

from collections.abc import Callable

from specs.manifest import Manifest
from specs.problems import Path as FieldPath
from specs.problems import Problem, format_path

NOT_YET: dict[FieldPath, str] = {}

# Fields that work only with an optional package installed: (its module, the package,
# how to install it). A manifest setting one without it is refused when it is set, not
# accepted by a running serve that then fails to start after a restart.
NEEDS: dict[FieldPath, tuple[str, str, str]] = {
    ("serving", "otlp_endpoint"): (
        "opentelemetry.sdk",
        "opentelemetry-sdk",
        "pip install 'blazar[otlp]'",
    ),
}


def _used(manifest: Manifest, path: FieldPath) -> bool:
    value: object = manifest.model_dump()
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return bool(value)


def unsupported(manifest: Manifest) -> list[Problem]:
    """A problem for each field the manifest sets that Blazar does not act on yet."""
    problems = []
    for path, why in NOT_YET.items():
        if not _used(manifest, path):
            continue
        where = manifest.location_of(*path)
        problems.append(
            Problem(
                f"{format_path(path)}: not supported yet ({why}); Blazar refuses a manifest "
                "that sets it rather than ignore it",
                file=where.file if where else None,
                line=where.line if where else None,
                path=format_path(path),
                hint=f"remove {format_path(path)} for now",
            )
        )
    return problems


def missing_packages(manifest: Manifest, installed: Callable[[str], bool]) -> list[Problem]:
    """A problem for each field the manifest sets whose optional package is not
    installed (`installed(module)` says whether one is), naming how to install it."""
    problems = []
    for path, (module, package, how) in NEEDS.items():
        if not _used(manifest, path) or installed(module):
            continue
        where = manifest.location_of(*path)
        problems.append(
            Problem(
                f"{format_path(path)} needs {package}, which is not installed: run `{how}`, "
                f"or leave {format_path(path)} unset",
                file=where.file if where else None,
                line=where.line if where else None,
            )
        )
    return problems
