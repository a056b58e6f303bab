// make_logits.mjs — writes llama.cpp's own logits for GGUF models, the reference that dissect's
// forward pass is checked against. It drives llama.cpp's prebuilt libraries through the npm
// package node-llama-cpp; tests never run it (its output is committed).
//
// Usage: node make_logits.mjs OUT.json MODEL.gguf...
//
// node-llama-cpp is loaded from $LLAMA_PACKAGES/node_modules (LLAMA_PACKAGES defaults to
// <repo>/.deps/llama, where make_fixtures.sh installs it).
//
// For each model, in a fresh context on one CPU thread, it evaluates PROMPT in one batch with
// logits requested at every position, then decodes GREEDY_STEPS tokens greedily (argmax of the
// last logits, lowest id on ties, computed here from the raw logits), and writes
//   {"generator", "llama_cpp", "prompt",
//    "models": {"<file name>": {"vocab": V, "logits": [[V floats] per prompt position],
//                               "greedy": [token ids]}}}
// The context keeps K and V in F32 with flash attention off. llama.cpp's defaults (an F16 K/V
// cache, flash attention) round K and V to F16 and move the test models' logits by up to ~1e-3;
// with F32 the prompt's logits from one batch and from one token per call agree to ~1e-6 on
// the llama test model (~4e-5 on the gpt2 one).
//
// Logits are float32 values printed with JavaScript's shortest round-trip form of the double
// that holds them, so parsing them back as double and narrowing to float32 is exact.
//
// The logits are the model's raw output: controlledEvaluate returns the candidates after its
// sampler chain, but with no sampling options the chain holds only llama.cpp's greedy sampler,
// which only picks an index (no repeat penalty, token bias, temperature or top-k/p is added
// unless asked for). Each greedy pick is checked against the token llama.cpp's greedy sampler
// chose.
import fs from "node:fs";
import path from "node:path";

import {loadLlama} from "./llama_driver.mjs";

const PROMPT = [1, 17, 200, 45, 3, 99, 150, 7];
const GREEDY_STEPS = 8;

const [out, ...models] = process.argv.slice(2);
if (out == null || models.length === 0) {
  console.error("usage: node make_logits.mjs OUT.json MODEL.gguf...");
  process.exit(2);
}


// Index of the largest value; the first (lowest id) wins ties.
function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++)
    if (values[i] > values[best]) best = i;
  return best;
}

// The Map token -> logit that node-llama-cpp returns (sorted by logit) as an array by token id;
// it must hold every id 0..vocab-1 exactly once.
function logitsById(map, vocab) {
  if (map.size !== vocab) throw new Error(`expected ${vocab} logits, got ${map.size}`);
  const out = new Array(vocab);
  for (const [token, logit] of map) {
    if (!(token >= 0 && token < vocab) || out[token] !== undefined)
      throw new Error(`unexpected token id ${token} in logits`);
    out[token] = logit;
  }
  return out;
}

// Evaluates `tokens` after what the sequence already holds and returns, for each token, the
// logits by id and the token llama.cpp's greedy sampler picked next. Passing no sampling
// options keeps the logits raw (see the header).
async function evaluate(sequence, tokens, vocab) {
  const want = {generateNext: {logits: true, token: true}};
  const results = await sequence.controlledEvaluate(tokens.map((token) => [token, want]));
  return tokens.map((_, i) => {
    const next = results[i]?.next;
    if (next?.logits == null) throw new Error(`no logits for position ${i}`);
    return {logits: logitsById(next.logits, vocab), token: next.token};
  });
}

async function modelReference(llama, file) {
  const model = await llama.loadModel({modelPath: file});
  // F32 K/V cache without flash attention keeps llama.cpp's attention in float32 (its default
  // stores K and V as F16, which moves the logits by ~1e-3); see the header.
  const context = await model.createContext({
    contextSize: 128,
    batchSize: 128,
    threads: 1,
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
  try {
    // V is the length of the GGUF's token list, which is llama.cpp's n_vocab.
    const vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
    if (!Number.isInteger(vocab) || vocab <= 0) throw new Error(`${file}: no tokenizer.ggml.tokens`);
    const sequence = context.getSequence();

    const steps = await evaluate(sequence, PROMPT, vocab);
    const logits = steps.map((step) => step.logits);
    const greedy = [];
    let last = steps[steps.length - 1];
    for (let i = 0; i < GREEDY_STEPS; i++) {
      const token = argmax(last.logits);
      if (token !== last.token)
        throw new Error(`${file}: argmax ${token} but llama.cpp's greedy sampler chose ${last.token}`);
      greedy.push(token);
      if (i + 1 < GREEDY_STEPS) [last] = await evaluate(sequence, [token], vocab);
    }
    return {vocab, logits, greedy};
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

// JSON with one line per number array (one per prompt position), so diffs stay readable.
function toJson(value, indent = "") {
  if (Array.isArray(value) && value.every((v) => typeof v === "number"))
    return `[${value.map((v) => JSON.stringify(v)).join(", ")}]`;
  const inner = indent + "  ";
  if (Array.isArray(value))
    return `[\n${value.map((v) => inner + toJson(v, inner)).join(",\n")}\n${indent}]`;
  if (value !== null && typeof value === "object") {
    const fields = Object.entries(value).map(([k, v]) => `${inner}${JSON.stringify(k)}: ${toJson(v, inner)}`);
    return `{\n${fields.join(",\n")}\n${indent}}`;
  }
  return JSON.stringify(value);
}

const {llama, description} = await loadLlama();
const result = {
  generator: "make_logits.mjs",
  llama_cpp: description,
  prompt: PROMPT,
  models: {},
};
for (const file of models) {
  const name = path.basename(file);
  if (name in result.models) throw new Error(`two models named ${name}`);
  const reference = await modelReference(llama, file);
  result.models[name] = reference;
  console.log(`${name}: vocab ${reference.vocab}, greedy ${reference.greedy.join(" ")}`);
}
fs.writeFileSync(out, toJson(result) + "\n");
await llama.dispose();
