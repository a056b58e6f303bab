// make_tokenize.mjs — writes llama.cpp's own tokenization of the tokenizer fixtures' corpora
// with vocabulary-only GGUF files (tests/support/vocab_gguf.hpp writes them from real
// tokenizer.json files), the reference dissect's tokenizer_from_gguf is checked against. It
// drives llama.cpp's prebuilt libraries through node-llama-cpp; tests never run it (its output
// is committed).
//
// Usage: node make_tokenize.mjs OUT_DIR NAME=VOCAB.gguf...
//
// For each vocabulary and each corpus of tests/reference/tokenizers/corpus (hard, fortunes,
// gpl; not invalid_utf8, which dissect refuses), it writes OUT_DIR/<NAME>.<corpus>.ids: one
// case a line, the ids space-separated, from llama_tokenize(text, add_special = false,
// parse_special = true) — node-llama-cpp's model.tokenize(text, true). And OUT_DIR/vocabs.json:
// per vocabulary, the token count, BOS and EOS ids and whether llama.cpp prepends BOS
// (add_special = true adds exactly that token before the same ids).
import fs from "node:fs";
import path from "node:path";
import {fileURLToPath} from "node:url";

import {readJsonl} from "../tokenizers/jsonl.mjs";
import {loadLlama} from "./llama_driver.mjs";

const [outDir, ...specs] = process.argv.slice(2);
if (outDir == null || specs.length === 0) {
  console.error("usage: node make_tokenize.mjs OUT_DIR NAME=VOCAB.gguf...");
  process.exit(2);
}


const here = path.dirname(fileURLToPath(import.meta.url));
const corpora = ["hard", "fortunes", "gpl"];
const corpusDir = path.resolve(here, "../tokenizers/corpus");

const {llama, description} = await loadLlama();
const summary = {
  generator: "make_tokenize.mjs",
  llama_cpp: description,
  call: "llama_tokenize(text, add_special = false, parse_special = true)",
  vocabs: {},
};
fs.mkdirSync(outDir, {recursive: true});
for (const spec of specs) {
  const [name, file] = spec.split("=");
  const model = await llama.loadModel({modelPath: file, vocabOnly: true});
  try {
    summary.vocabs[name] = {
      tokens: model.fileInfo.metadata.tokenizer.ggml.tokens.length,
      bos: model.tokens.bos ?? null,
      eos: model.tokens.eos ?? null,
      prepends_bos: model.tokens.shouldPrependBosToken,
    };
    for (const corpus of corpora) {
      const texts = readJsonl(path.join(corpusDir, `${corpus}.jsonl`));
      const lines = texts.map((text) => Array.from(model.tokenize(text, true)).join(" "));
      fs.writeFileSync(path.join(outDir, `${name}.${corpus}.ids`), lines.map((l) => l + "\n").join(""));
    }
  } finally {
    await model.dispose();
  }
}
fs.writeFileSync(path.join(outDir, "vocabs.json"), JSON.stringify(summary, null, 1) + "\n");
