#!/usr/bin/env python3
"""cuemu: turn a .cu file into C++ that g++ compiles against tests/cuemu/include (tests/cuemu/README.md).

Two rewrites, each kept on its own lines so that compiler messages and debuggers point at the .cu's lines:
  k<<<grid, block[, smem[, stream]]>>>(args)  ->  cuemu::make_launch(k, "k", grid, block[, ...])(args)
  extern __shared__ T name[];                 ->  T *name = (T *)cuemu::dyn_smem();
Anything else that is CUDA C++ is left to the headers.
usage: translate.py IN.cu OUT.cc"""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;")


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path, encoding="utf-8") as f:
        text = f.read()
    n_launch = len(LAUNCH.findall(text))
    text = LAUNCH.sub(lambda m: 'cuemu::make_launch(%s, "%s", %s)(' % (m.group(1), m.group(1), m.group(2)), text)
    text = SMEM.sub(lambda m: "%s *%s = (%s *)cuemu::dyn_smem();" % (m.group(1), m.group(2), m.group(1)), text)
    if "<<<" in text or ">>>" in text:
        sys.exit("translate.py: %s: a launch this script does not understand is left" % src_path)
    if n_launch == 0 and "__global__" in text:
        print("translate.py: %s: kernels but no launch" % src_path, file=sys.stderr)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write('#line 1 "%s"\n' % src_path)
        f.write(text)


if __name__ == "__main__":
    main()
