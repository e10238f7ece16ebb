# shellcheck shell=bash
# The device kit's environment (scripts/gpu_kit.sh copies this file into the kit as env.sh): source it.
# Open MPI and PMIx moved into the kit (OPAL_PREFIX, PMIX_PREFIX), the kit's programs and libraries first on PATH and
# LD_LIBRARY_PATH, its compressed files unpacked once, and the machine's own CUDA runtime, cuBLAS and NCCL found:
# CUDA's lib64, the dynamic linker's cache, or the nvidia-* Python wheels (PyTorch's); NCCL as libnccl.so.2, or a
# libnccl.so linked under that name. GRPO_KIT_SAYS: one line on what was found.
GRPO_KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GRPO_KIT
while IFS= read -r _z; do
    [ -f "${_z%.xz}" ] && continue
    if command -v xz >/dev/null; then
        xz -dc "$_z" >"${_z%.xz}.part"
    else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$_z" "${_z%.xz}.part"
    fi && chmod --reference="$_z" "${_z%.xz}.part" && mv "${_z%.xz}.part" "${_z%.xz}"
done < <(find "$GRPO_KIT" -name '*.xz' -type f)
export OPAL_PREFIX="$GRPO_KIT/usr"
export PMIX_PREFIX="$GRPO_KIT/usr/lib/x86_64-linux-gnu/pmix2"
export PATH="$GRPO_KIT/usr/bin:$PATH"
# the machine's CUDA libraries
_dirs=()
for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$_d" ] && _dirs+=("$_d")
done
_nv="$(python3 -c 'import importlib.util as u; s = u.find_spec("nvidia"); print("\n".join(s.submodule_search_locations) if s else "")' 2>/dev/null || true)"
for _n in $_nv; do
    for _d in "$_n"/*/lib; do [ -d "$_d" ] && _dirs+=("$_d"); done
done
# find NAME: the first directory above (or the linker's cache) that holds NAME
_find_lib() {
    local d
    for d in "${_dirs[@]}"; do [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
    ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n { print $NF; exit }'
}
_said=""
_nccl="$(_find_lib libnccl.so.2)"
if [ -z "$_nccl" ] && [ -n "$(_find_lib libnccl.so)" ]; then
    mkdir -p "$GRPO_KIT/cuda-links"
    ln -sf "$(_find_lib libnccl.so)" "$GRPO_KIT/cuda-links/libnccl.so.2"
    _nccl="$(_find_lib libnccl.so) (as libnccl.so.2)"
    _dirs=("$GRPO_KIT/cuda-links" "${_dirs[@]}")
fi
for _l in libcudart.so.13 libcublas.so.13; do
    _said+="$_l: $(_find_lib "$_l" || true); "
done
GRPO_KIT_SAYS="kit $GRPO_KIT; mpirun $(command -v mpirun); ${_said}libnccl.so.2: ${_nccl:-not found}"
export GRPO_KIT_SAYS
_ld="$GRPO_KIT/lib:$OPAL_PREFIX/lib/x86_64-linux-gnu/openmpi/lib:$PMIX_PREFIX/lib"
for _d in "${_dirs[@]}"; do _ld+=":$_d"; done
export LD_LIBRARY_PATH="$_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# no fabric components came along: say nothing of them
export OMPI_MCA_mca_base_component_show_load_errors=0
unset _z _d _n _nv _l _ld _dirs _said _nccl
unset -f _find_lib
