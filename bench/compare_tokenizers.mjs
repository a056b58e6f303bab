#!/usr/bin/env node
// compare_tokenizers — the JavaScript side of the tokenizer benchmark: how fast the reference
// tokenizers that dissect's tokenizer fixtures come from load and encode the same text, so the
// C++ Google Benchmark numbers have a baseline measured on this machine.
//
//     scripts/install-tokenizers                     # once: the pinned packages into .deps/npm
//     node bench/compare_tokenizers.mjs
//     node bench/compare_tokenizers.mjs --json tokenizers.json --repeat 16 --prefix .deps/npm
//     node bench/compare_tokenizers.mjs --only gpt2,gpt4o     # leave out llama2's ~3 minutes
//
// The text: every case of tests/reference/tokenizers/corpus/fortunes.jsonl joined with "\n",
// that joined text repeated (joined with "\n" again) --repeat times, by default as often as it
// takes to reach 1 MB of UTF-8 (10^6 bytes).
//
// The tokenizers: gpt2, llama3 and llama2 in @lenml/tokenizers (transformers.js's tokenizers),
// read from the same tokenizer.json files as the fixtures, and gpt4o twice: in @lenml/tokenizers
// and in tiktoken (OpenAI's Rust BPE compiled to WebAssembly, encoding "o200k_base"). Before
// timing, tiktoken's ids are compared with lenml's gpt4o ids on the whole text, both without
// special tokens (tiktoken's encode with no allowed special tokens, lenml's with
// add_special_tokens false; the fortunes hold no special-token text), and the script prints
// whether they agree.
//
// What is timed, on one thread (JavaScript runs encode on one; tiktoken's WebAssembly too):
//
// - load_ms: reading tokenizer.json and tokenizer_config.json, JSON.parse and building the
//   tokenizer (lenml); get_encoding("o200k_base"), which unpacks the ranks built into
//   tiktoken's WebAssembly (tiktoken; compiling the module at import is not counted). One load,
//   the first in the process, as a program would pay it.
// - encode: one encode() call on the whole text, add_special_tokens false; one warm-up call,
//   then the best of --runs (default 5). Reported as MB/s of UTF-8 in (10^6 bytes per second)
//   and tokens/s out. lenml keeps a 10,000-entry cache of pieces, so after the warm-up the
//   fortunes' common words come from it; tiktoken caches nothing. llama2 has no pre-tokenizer,
//   so its whole text is one BPE word (pieces of 256 code units and more are never cached):
//   about 30 s a call for 1 MB here, most of the script's run time.
//
// Output: a table on stdout; --json FILE also writes
// [{name, engine, load_ms, mb_per_s, tokens_per_s, tokens, bytes}, …].

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function parseArgs(argv) {
  const args = { prefix: path.join(root, ".deps/npm"), repeat: null, runs: 5, json: null, only: null };
  for (let i = 0; i < argv.length; ++i) {
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
      return argv[++i];
    };
    const positive = (s, flag) => {
      const n = Number(s);
      if (!Number.isInteger(n) || n < 1) throw new Error(`${flag} must be a positive integer`);
      return n;
    };
    switch (argv[i]) {
      case "--prefix": args.prefix = path.resolve(value()); break;
      case "--repeat": args.repeat = positive(value(), "--repeat"); break;
      case "--runs": args.runs = positive(value(), "--runs"); break;
      case "--json": args.json = value(); break;
      case "--only": args.only = value().split(","); break;
      case "-h":
      case "--help":
        console.log("usage: node bench/compare_tokenizers.mjs [--prefix .deps/npm] [--repeat N] " +
                    "[--runs 5] [--json FILE] [--only gpt2,llama3,llama2,gpt4o]");
        process.exit(0);
      default: throw new Error(`unknown argument ${argv[i]} (try --help)`);
    }
  }
  return args;
}

let args;
try {
  args = parseArgs(process.argv.slice(2));
} catch (error) {
  console.error(`compare_tokenizers: ${error.message}`);
  process.exit(2);
}
const modules = path.join(args.prefix, "node_modules");
if (!fs.existsSync(path.join(modules, "@lenml/tokenizers"))) {
  console.error(`${modules}/@lenml/tokenizers is missing: run scripts/install-tokenizers first`);
  process.exit(1);
}
const { readJsonl } = await import(
  pathToFileURL(path.join(root, "tests/reference/tokenizers/jsonl.mjs")).href);
const { TokenizerLoader } = await import(
  pathToFileURL(path.join(modules, "@lenml/tokenizers/dist/main.mjs")).href);
const require = createRequire(path.join(modules, "noop.js"));
const importStart = performance.now();
const { get_encoding } = require("tiktoken");
const tiktokenImportMs = performance.now() - importStart;

// ---- the text -----------------------------------------------------------------------------------
const corpusText = readJsonl(path.join(root, "tests/reference/tokenizers/corpus/fortunes.jsonl")).join("\n");
const corpusBytes = Buffer.byteLength(corpusText, "utf8");
const repeat = args.repeat ?? Math.ceil(1e6 / (corpusBytes + 1));
const text = Array(repeat).fill(corpusText).join("\n");
const bytes = Buffer.byteLength(text, "utf8");

// ---- the engines ----------------------------------------------------------------------------------
function lenmlDir(name) {
  return name === "gpt2" ? path.join(args.prefix, "gpt2")
                         : path.join(modules, `@lenml/tokenizer-${name}`, "models");
}

function loadLenml(name) {
  const dir = lenmlDir(name);
  const start = performance.now();
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  return { loadMs: performance.now() - start,
           encode: (s) => tokenizer.encode(s, { add_special_tokens: false }) };
}

function loadTiktoken() {
  const start = performance.now();
  const encoding = get_encoding("o200k_base");
  // No allowed special tokens and none disallowed: text is text, as with lenml's fortunes.
  return { loadMs: performance.now() - start, encode: (s) => encoding.encode(s, [], []),
           free: () => encoding.free() };
}

const ENGINES = [
  ["gpt2", "lenml", () => loadLenml("gpt2")],
  ["llama3", "lenml", () => loadLenml("llama3")],
  ["llama2", "lenml", () => loadLenml("llama2")],
  ["gpt4o", "lenml", () => loadLenml("gpt4o")],
  ["gpt4o", "tiktoken", loadTiktoken],
].filter(([name]) => args.only === null || args.only.includes(name));
if (ENGINES.length === 0) throw new Error(`--only ${args.only}: no such tokenizer`);

function timeEncode(encode) {
  let ids = encode(text); // warm-up
  let best = Infinity;
  for (let run = 0; run < args.runs; ++run) {
    const start = performance.now();
    ids = encode(text);
    best = Math.min(best, performance.now() - start);
  }
  return { ms: best, ids };
}

console.log(`text: fortunes.jsonl joined, ${repeat}× = ${bytes.toLocaleString("en-US")} bytes of UTF-8; ` +
            `best of ${args.runs} encode calls after 1 warm-up; Node ${process.version}, 1 thread`);

const results = [];
const gpt4oIds = {};
for (const [name, engine, load] of ENGINES) {
  const loaded = load();
  const { ms, ids } = timeEncode(loaded.encode);
  if (name === "gpt4o") gpt4oIds[engine] = Array.from(ids);
  loaded.free?.();
  const seconds = ms / 1000;
  const result = { name, engine, load_ms: round(loaded.loadMs, 1), mb_per_s: round(bytes / 1e6 / seconds, 2),
                   tokens_per_s: Math.round(ids.length / seconds), tokens: ids.length, bytes };
  results.push(result);
  console.error(`  ${name} (${engine}): load ${result.load_ms} ms, encode ${ms.toFixed(0)} ms`);
}

// The agreement check needs both gpt4o engines; --only without gpt4o skips it.
const checked = gpt4oIds.lenml !== undefined && gpt4oIds.tiktoken !== undefined;
const agree = !checked || (gpt4oIds.lenml.length === gpt4oIds.tiktoken.length &&
                           gpt4oIds.lenml.every((id, i) => id === gpt4oIds.tiktoken[i]));
const firstDifference = agree ? -1 : gpt4oIds.lenml.findIndex((id, i) => id !== gpt4oIds.tiktoken[i]);

// ---- report -----------------------------------------------------------------------------------------
const header = ["tokenizer", "engine", "load ms", "MB/s", "tokens/s", "tokens", "bytes/token"];
const rows = results.map((r) => [r.name, r.engine, r.load_ms.toFixed(1), r.mb_per_s.toFixed(2),
                                 r.tokens_per_s.toLocaleString("en-US"), r.tokens.toLocaleString("en-US"),
                                 (r.bytes / r.tokens).toFixed(2)]);
console.log(`| ${header.join(" | ")} |`);
console.log(`|${header.map((_, i) => (i < 2 ? "---" : "---:")).join("|")}|`);
for (const row of rows) console.log(`| ${row.join(" | ")} |`);
console.log(`tiktoken import (WebAssembly compile, not in load ms): ${tiktokenImportMs.toFixed(1)} ms`);
if (checked) console.log(agree
  ? `gpt4o: tiktoken and lenml agree (${gpt4oIds.lenml.length.toLocaleString("en-US")} ids)`
  : `gpt4o: tiktoken and lenml DISAGREE: ${gpt4oIds.tiktoken.length} vs ${gpt4oIds.lenml.length} ids, ` +
    `first difference at id ${firstDifference}`);

if (args.json) {
  fs.writeFileSync(args.json, JSON.stringify(results, null, 2) + "\n");
  console.log(`wrote ${args.json}`);
}
if (!agree) process.exitCode = 1;

function round(x, digits) {
  const scale = 10 ** digits;
  return Math.round(x * scale) / scale;
}
