#!/usr/bin/env bash
# The meson test logs a full ./scripts/test.sh run writes, one path a line (those there now, relative to the
# checkout): its two streams' in build/, the sanitizer build's, the ft suite's, ft-survive-nccl's and the emulated
# gpu suite's. scripts/test.sh removes them before its run and counts them after it; .ci/run counts them again for
# its last line.
cd "$(dirname "$0")/.." || exit 1
for f in build/meson-logs/testlog-*.json build-asan/meson-logs/testlog*.json build-ft/meson-logs/testlog-ft*.json \
    build-ft-emu/meson-logs/testlog-ft-nccl*.json build-emu/meson-logs/testlog-emu*.json; do
    [ -f "$f" ] && echo "$f"
done
exit 0
