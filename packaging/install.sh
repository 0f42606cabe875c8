#!/bin/sh
# Install Blazar into its own virtual environment and link `blazar` onto PATH.
#
#   curl -fsSL https://raw.githubusercontent.com/blazar-llm/blazar/main/packaging/install.sh | sh
#
# It reads nothing beside itself (run from a pipe, $0 is only "sh"); settings:
#   BLAZAR_REPO  what pip installs: a git URL, a checkout's path, or a package spec
#                (default: git+https://github.com/blazar-llm/blazar.git)
#   PREFIX       where the environment goes   (default: ~/.local/share/blazar/venv)
#   BINDIR       where the `blazar` link goes (default: ~/.local/bin)
#   PYTHON       the Python to use            (default: python3; 3.11 or newer)
set -eu

main() {
    repo=${BLAZAR_REPO:-git+https://github.com/blazar-llm/blazar.git}
    prefix=${PREFIX:-"$HOME/.local/share/blazar/venv"}
    bindir=${BINDIR:-"$HOME/.local/bin"}
    python=${PYTHON:-python3}

    if ! command -v "$python" >/dev/null 2>&1; then
        echo "install.sh: $python not found: install Python 3.11 or newer, or set PYTHON" >&2
        exit 1
    fi
    "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Blazar needs Python >= 3.11: set PYTHON")'
    echo "installing Blazar from $repo into $prefix"
    "$python" -m venv "$prefix"
    "$prefix/bin/python" -m pip install --quiet --upgrade pip
    "$prefix/bin/python" -m pip install --quiet "$repo"
    # what `blazar upgrade` installs again to upgrade this environment
    printf 'repo=%s\n' "$repo" > "$prefix/blazar-install"
    mkdir -p "$bindir"
    ln -sf "$prefix/bin/blazar" "$bindir/blazar"
    echo "installed: $bindir/blazar ($("$bindir/blazar" --version))"
    case ":${PATH:-}:" in
        *":$bindir:"*) ;;
        *) echo "note: $bindir is not on PATH; add it to run \`blazar\`" ;;
    esac
}

# All in a function called on the last line: a download cut short runs nothing.
main "$@"
