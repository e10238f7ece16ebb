#!/usr/bin/env bash
# The device kit: what a GPU session needs, built here, in one ignored folder that travels with the working tree to a
# bare GPU machine (CUDA's compiler and libraries, PyTorch, meson; no Debian development package, no Open MPI, no
# package registry) and runs there with nothing installed:
#   KIT/build/...   the stripped programs the device checks run (scripts/gpu_check.sh), at their build-dir paths
#   KIT/lib/        the Debian runtime libraries they load (nanomsg, protobuf-c, libuv, OpenBLAS, oneDNN, jansson,
#                   yaml, cmocka, hwloc, ...): every library ldd finds but glibc's, libstdc++, libgcc_s and CUDA's
#   KIT/usr/        Open MPI (mpirun, orted, the components whose libraries are here, help files) and PMIx, moved
#                   with OPAL_PREFIX and PMIX_PREFIX
#   KIT/env.sh      source it: those variables, PATH, LD_LIBRARY_PATH, and the device's own CUDA runtime, cuBLAS and
#                   NCCL found (libnccl.so.2, or libnccl.so linked under that name; CUDA's lib64, ldconfig, or the
#                   nvidia-* Python wheels next to PyTorch)
# The files over 1.5 MB (OpenBLAS and oneDNN, 36 and 40 MB, and the programs with their CUDA code) travel
# xz-compressed, unpacked by env.sh on first use, so that the folder stays under 60 MiB.
#
#   scripts/gpu_kit.sh [KIT]              build the kit (default KIT: kit/), for sm_90 only (-Dgpu_archs=90)
#   scripts/gpu_kit.sh --emulate [KIT]    the same from a cuemu build (CUDA emulated on the CPU: no CUDA library
#                                         needed), to rehearse a device session here (default KIT: kit-emu/)
#   scripts/gpu_kit.sh --check KIT        prove it here: in a private mount namespace that hides the Debian
#                                         libraries (all of /usr/lib/x86_64-linux-gnu but glibc's, libstdc++,
#                                         libgcc_s and what bash needs) and Open MPI, ldd finds every library of
#                                         every kit program but CUDA's, the kit's mpirun runs a 2-rank MPI job (2
#                                         colocated grpo-worker ranks, 2 steps on the CPU) and grpo-worker --help
#                                         starts. Root (unshare -m).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="$PWD"

# programs the device run needs (build-dir relative), and the shared objects they load by path
PROGRAMS=(worker/grpo-worker worker/grpo-model daemon/grpod ctl/grpoctl tests/gpu/test_gpu_kernels
    tests/gpu/test_gpu_model tests/gpu/test_gpu_parallel tests/gpu/gpu_bench tests/mpi/compare_weights)
MODULES=(worker/rewards/reward_test_scorer.so)
# not bundled: the device image has them (and newer ones: CUDA's libraries may need a newer libstdc++)
BASE_RE='/(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
CUDA_RE='/lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc|nvJitLink|cudnn[a-z_]*)\.so'
# Open MPI components left out: they load libraries of fabrics a one-node GPU session has no use for
MCA_SKIP_RE='_(ucx|ofi|psm|psm2|verbs|openib|cuda|usnic|portals4)\.so$'
XZ_MIN=1500000 # files larger than this travel compressed (env.sh unpacks them)

# deps FILE...: the libraries ldd resolves for FILE (absolute paths), one per line
deps() { ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u; }

build_kit() {
    local kit="$1" bdir="$2"
    shift 2
    ./scripts/deps.sh >/dev/null
    if [ -f "$bdir/build.ninja" ]; then
        meson setup --reconfigure "$bdir" "$@" >/dev/null
    else
        meson setup "$bdir" -Dtests=enabled -Dbuildtype=debugoptimized "$@" >/dev/null
    fi
    ninja -C "$bdir" "${PROGRAMS[@]}" "${MODULES[@]}"
    rm -rf "$kit"
    mkdir -p "$kit/lib" "$kit/usr/bin"
    local f
    for f in "${PROGRAMS[@]}" "${MODULES[@]}"; do
        mkdir -p "$kit/build/$(dirname "$f")"
        strip --strip-unneeded -o "$kit/build/$f" "$bdir/$f"
    done
    # Open MPI: the launcher and daemon, the libraries, the components whose own libraries can come along, help
    local ompi=/usr/lib/x86_64-linux-gnu/openmpi pmix=/usr/lib/x86_64-linux-gnu/pmix2
    cp -L "$(command -v orterun)" "$kit/usr/bin/orterun"
    cp -L "$(command -v orted)" "$kit/usr/bin/orted"
    ln -s orterun "$kit/usr/bin/mpirun"
    ln -s orterun "$kit/usr/bin/mpiexec"
    mkdir -p "$kit$ompi/lib/openmpi3" "$kit/usr/share/openmpi" "$kit$pmix/lib/pmix" "$kit$pmix/share"
    cp -a "$ompi"/lib/*.so* "$kit$ompi/lib/"
    local skipped=()
    for f in "$ompi"/lib/openmpi3/*.so; do
        if [[ "$f" =~ $MCA_SKIP_RE ]]; then skipped+=("$(basename "$f")"); else cp "$f" "$kit$ompi/lib/openmpi3/"; fi
    done
    cp -a /usr/share/openmpi/. "$kit/usr/share/openmpi/"
    cp -a "$pmix"/lib/libpmix.so* "$kit$pmix/lib/"
    cp -a "$pmix"/lib/pmix/*.so "$kit$pmix/lib/pmix/"
    cp -a "$pmix"/share/. "$kit$pmix/share/"
    # every library any of them loads, but the base system's and CUDA's
    local elves
    mapfile -t elves < <(find "$kit/build" "$kit/usr" -type f \( -perm -u+x -o -name '*.so*' \) -exec file {} + |
        awk -F: '/ELF/ { print $1 }')
    deps "${elves[@]}" | grep -Ev "$BASE_RE" | grep -Ev "$CUDA_RE" | grep -v "^$ompi/" | grep -v "^$pmix/" |
        while read -r f; do
            case "$(realpath "$f")" in "$ompi"/* | "$pmix"/*) continue ;; esac # (Open MPI's own, in KIT/usr)
            cp -L "$f" "$kit/lib/"
        done
    for f in "$kit"/lib/*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
    find "$kit" -type f -size +${XZ_MIN}c -exec xz -9 -T2 {} +
    cp scripts/gpu_kit_env.sh "$kit/env.sh"
    {
        echo "grpo device kit, built $(date -u +%Y-%m-%dT%H:%MZ) from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo '+changes') on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
        echo "build: $bdir ($*)"
        echo "Open MPI components left out: ${skipped[*]}"
        echo
        (cd "$kit" && find . -type f -printf '%s %p\n' | sort -k2)
    } >"$kit/MANIFEST.txt"
    echo "kit: $kit, $(du -sh "$kit" | cut -f1) ($(du -sb "$kit" | cut -f1) bytes): $(find "$kit" -type f | wc -l) files"
    local mib=$(($(du -sb "$kit" | cut -f1) / 1048576))
    [ "$mib" -lt 60 ] || { echo "gpu_kit: the kit is $mib MiB, over the 60 MiB a device call carries with the tree" >&2; return 1; }
}

# check_kit KIT: the proof above, in a private mount namespace (the function runs inside it)
check_kit() {
    local kit
    kit="$(realpath "$1")"
    [ -f "$kit/env.sh" ] || { echo "gpu_kit --check: no kit at $1 (run scripts/gpu_kit.sh first)" >&2; return 2; }
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/grpo-kit-check.XXXXXX")"
    # what stays visible of /usr/lib/x86_64-linux-gnu: glibc's, libstdc++, libgcc_s, and what bash and the
    # coreutils this check uses load (the device image has all of them)
    mkdir -p "$work/visible"
    local f
    for f in /usr/lib/x86_64-linux-gnu/*; do
        [[ "$f" =~ $BASE_RE ]] && cp -L "$f" "$work/visible/"
    done
    # (the symlinks' targets too: libc.so.6 -> libc.so.6 is a file on Debian 12, but be sure)
    local tools=() t
    for t in bash ls env mkdir cat grep awk xz sort head tail wc dirname realpath find ln rm mv cp chmod date \
        timeout sed tr cut stat python3; do
        tools+=("$(command -v "$t")")
    done
    for f in $(deps "${tools[@]}"); do
        cp -L "$f" "$work/visible/" 2>/dev/null || true
    done
    cp -L /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$work/visible/"
    unshare -m bash -s "$kit" "$work" "$SRC" <<'EOS'
set -uo pipefail
kit="$1" work="$2" src="$3"
fails=0
expect() { if [ "$2" = 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }
mount --make-rprivate /
mkdir -p "$work/empty"
for d in /usr/share/openmpi /etc/openmpi /usr/lib/openmpi; do [ -d "$d" ] && mount --bind "$work/empty" "$d"; done
# (last: mount itself needs what this hides)
mount --bind "$work/visible" /usr/lib/x86_64-linux-gnu || { echo "FAIL cannot hide /usr/lib/x86_64-linux-gnu"; exit 1; }
hidden=$(ls /usr/lib/x86_64-linux-gnu | wc -l)
! [ -e /usr/lib/x86_64-linux-gnu/libnanomsg.so.5 ] && ! [ -e /usr/lib/x86_64-linux-gnu/openmpi ]
expect "the Debian libraries and Open MPI are hidden ($hidden files left in /usr/lib/x86_64-linux-gnu)" $?
# shellcheck disable=SC1091
. "$kit/env.sh"
expect "env.sh: $GRPO_KIT_SAYS" 0
missing="" n=0
while IFS= read -r f; do
    [ "$(head -c 4 "$f" | tr -d '\177')" = ELF ] || continue # (an ELF file: 0x7f E L F)
    n=$((n + 1))
    m=$(ldd "$f" 2>/dev/null | awk '/not found/ { print $1 }' | grep -Ev '^lib(cuda|cudart|cublas|cublasLt|nccl|nvrtc)\.so' | tr '\n' ' ')
    [ -n "$m" ] && missing+="$(basename "$f"): $m; "
done < <(find "$kit/build" "$kit/usr" "$kit/lib" -type f ! -name '*.xz')
[ -z "$missing" ] && [ "$n" -ge 20 ]
expect "ldd finds every library of the kit's $n programs and libraries but CUDA's${missing:+ (missing: $missing)}" $?
left=$(find "$kit" -name '*.xz' -type f | while read -r z; do [ -f "${z%.xz}" ] || echo "$z"; done | wc -l)
[ "$left" = 0 ]; expect "env.sh unpacked every compressed file ($left left)" $?
[ "$(command -v mpirun)" = "$kit/usr/bin/mpirun" ]; st=$?; expect "mpirun is the kit's ($(command -v mpirun))" "$st"
"$kit/build/worker/grpo-worker" --help >"$work/help.txt" 2>&1; expect "grpo-worker --help starts" $?
tok="$src/tests/fixtures/tokenizers/bytes-chatml"
"$kit/build/worker/grpo-model" init "$tok/config.json" "$work/tiny" --tokenizer-from "$tok" --seed 11 --std 0.1 \
    >"$work/init.txt" 2>&1
expect "grpo-model init makes a tiny model" $?
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
timeout 300 mpirun --oversubscribe -np 2 "$kit/build/worker/grpo-worker" actor_rollout_ref.model.path="$work/tiny" \
    trainer.default_local_dir="$work/run" trainer.project_name=p trainer.experiment_name=e trainer.device=cpu \
    trainer.total_training_steps=2 trainer.val_before_train=false trainer.test_freq=-1 data.train_batch_size=2 \
    actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=6 \
    data.synthetic.num_train=8 data.synthetic.num_val=2 </dev/null >"$work/mpirun.txt" 2>&1
rc=$?
[ $rc = 0 ] && compgen -G "$work/run/p/e/checkpoints/global_step_2/actor/*.safetensors" >/dev/null &&
    grep -q "\[rank 1\] trainer: run " "$work/mpirun.txt"
expect "the kit's mpirun runs 2 colocated grpo-worker ranks through 2 steps (exit $rc)" $?
if [ $fails != 0 ]; then
    for f in help init mpirun; do echo "---- $f.txt (tail)"; tail -n 15 "$work/$f.txt"; done
fi
exit $((fails > 0))
EOS
    local rc=$?
    rm -rf "$work"
    return $rc
}

case "${1:-}" in
--check) check_kit "${2:-kit}" ;;
--emulate) build_kit "${2:-kit-emu}" build-kit-emu -Dcuemu=true -Dcuda=disabled ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
*) build_kit "${1:-kit}" build-kit -Dcuda=enabled -Dgpu_archs=90 ;;
esac
