#!/usr/bin/env bash
# Regenerates the GGUF reference files in this folder with llama.cpp's own libraries (the npm
# package @node-llama-cpp/linux-x64 ships them prebuilt), installed into .deps/llama (ignored by
# git). The outputs are committed; tests read them and never run this.
#   blocks.gguf  make_block_fixture.cpp: llama.cpp's quantisation and dequantisation of 16
#                awkward rows in every block type dissect decodes, and one metadata key of
#                every GGUF value type.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
prefix=$repo/.deps/llama
pin=@node-llama-cpp/linux-x64@3.22.1
libs=$prefix/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
if [ ! -f "$libs/libggml-base.so" ]; then
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --save-exact --no-audit --no-fund --loglevel=error "$pin"
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
c++ -std=c++17 -O1 "$here/make_block_fixture.cpp" -L"$libs" -l:libggml-base.so \
    -Wl,-rpath,"$libs" -o "$build/make_block_fixture"
"$build/make_block_fixture" "$here/blocks.gguf"
echo "wrote $here/blocks.gguf"
