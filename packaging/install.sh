#!/usr/bin/env sh
# Install Blazar into its own virtual environment and link `blazar` onto PATH.
#   PREFIX   where the environment goes   (default: ~/.local/share/blazar/venv)
#   BINDIR   where the `blazar` link goes (default: ~/.local/bin)
#   SOURCE   what pip installs            (default: the checkout this script is in)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${PREFIX:-"$HOME/.local/share/blazar/venv"}
BINDIR=${BINDIR:-"$HOME/.local/bin"}
SOURCE=${SOURCE:-"$here"}
PYTHON=${PYTHON:-python3}

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Blazar needs Python >= 3.11")'
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --quiet --upgrade pip
"$PREFIX/bin/python" -m pip install --quiet "$SOURCE"
mkdir -p "$BINDIR"
ln -sf "$PREFIX/bin/blazar" "$BINDIR/blazar"
echo "installed: $BINDIR/blazar ($("$BINDIR/blazar" --version))"
