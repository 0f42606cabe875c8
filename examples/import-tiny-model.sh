#!/usr/bin/env sh
# Write a tiny test model, import it, show it, check it fits, and remove it.
# Run with Blazar installed; set BLAZAR_HOME to keep it away from your real store.
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python -c "from blazar.testing.tiny import write_tiny_model; write_tiny_model('$dir/tiny.gguf')"
blazar import "$dir/tiny.gguf" --name tiny
blazar list
blazar show tiny
blazar fit tiny --ctx 2048
blazar rm tiny
