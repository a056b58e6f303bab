#!/bin/sh
# bench/compile_time.sh — what README's hello world costs to compile, against the same product
# written with Eigen alone (bench/compile_time/eigen_hello.cpp: a row-major float Linear
# 768 -> 3072 with bias, forward, backward dx/dW/db, a shape check that throws), in one run:
#
#   (a) Eigen alone
#   (b) README's "Use it" example as a CMake consumer compiles it: DISSECT_SEPARATE_KERNELS, the
#       SIMD kernels in a unit of their own (src/kernels.cpp), compiled once per program and
#       printed on a line of its own, not counted in (b)
#   (c) the same example header-only: $CXX -std=c++20 -O2 and the include paths, nothing else
#
# Each is one translation unit compiled with -c (REPEATS times, default 1: the fastest counts),
# then linked and run once to prove it works. Prints seconds, peak memory (/usr/bin/time), the
# ratios to (a) and the CPU. The example is extracted from README.md (the ```cpp block under
# "## Use it"), so the bench follows README.
#
#   bench/compile_time.sh                 # CXX (default g++), CXXFLAGS (default -O2), REPEATS
#
# The machine's load moves the seconds; run it while nothing else compiles.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
cxx=${CXX:-g++}
flags=${CXXFLAGS:--O2}
repeats=${REPEATS:-1}
if [ ! -x /usr/bin/time ]; then
  echo "compile_time.sh: needs /usr/bin/time (Debian: apt-get install time)" >&2
  exit 2
fi
eigen=$(pkg-config --cflags eigen3 2>/dev/null || echo -I/usr/include/eigen3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# README's example: the first ```cpp block after the "## Use it" heading.
awk '/^## Use it/ { section = 1; next }
     section && /^## / { exit }
     section && /^```cpp/ { code = 1; next }
     code && /^```/ { exit }
     code { print }' "$repo/README.md" >"$work/hello.cpp"
if ! grep -q '#include <dissect/' "$work/hello.cpp"; then
  echo "compile_time.sh: no \`\`\`cpp block with a dissect include under \"## Use it\" in README.md" >&2
  exit 1
fi

# measure LABEL OUTPUT ARGS...: compiles with -c REPEATS times; keeps the fastest run's seconds
# and that run's peak resident memory in $seconds and $megabytes.
measure() {
  label=$1 output=$2
  shift 2
  seconds= megabytes=
  i=0
  while [ "$i" -lt "$repeats" ]; do
    /usr/bin/time -f '%e %M' -o "$work/time" $cxx -std=c++20 $flags "$@" -c -o "$output"
    read -r s kb <"$work/time"
    if [ -z "$seconds" ] || [ "$(echo "$s < $seconds" | bc)" = 1 ]; then
      seconds=$s megabytes=$((kb / 1024))
    fi
    i=$((i + 1))
  done
  printf '%-58s %7.2f s %6d MB\n' "$label" "$seconds" "$megabytes"
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "compiler: $($cxx --version | head -1); flags: -std=c++20 $flags; fastest of $repeats"
includes="-I$repo/include $eigen"

measure "(a) Eigen alone (eigen_hello.cpp)" "$work/a.o" $eigen "$repo/bench/compile_time/eigen_hello.cpp"
a=$seconds
measure "(b) README example, kernels compiled once (CMake default)" "$work/b.o" $includes \
  -DDISSECT_SEPARATE_KERNELS "$work/hello.cpp"
b=$seconds
measure "    + src/kernels.cpp, once per program (not in b)" "$work/kernels.o" $includes \
  -DDISSECT_SEPARATE_KERNELS "$repo/src/kernels.cpp"
measure "(c) README example, header-only" "$work/c.o" $includes "$work/hello.cpp"
c=$seconds
echo "ratio (b)/(a) = $(echo "scale=2; $b / $a" | bc)   ratio (c)/(a) = $(echo "scale=2; $c / $a" | bc)"

# Each program links and runs: the units above are the whole of a working program.
$cxx "$work/a.o" -o "$work/a"
$cxx "$work/b.o" "$work/kernels.o" -o "$work/b"
$cxx "$work/c.o" -o "$work/c"
for program in a b c; do
  if ! "$work/$program" >"$work/$program.out" 2>&1; then
    echo "compile_time.sh: program ($program) failed:" >&2
    cat "$work/$program.out" >&2
    exit 1
  fi
done
if ! cmp -s "$work/b.out" "$work/c.out"; then
  echo "compile_time.sh: (b) and (c) printed different things" >&2
  exit 1
fi
echo "all three programs ran; (b) and (c) print the same"
