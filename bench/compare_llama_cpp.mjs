// compare_llama_cpp.mjs — dissect against llama.cpp on the same GGUF files, in one run:
// prefill of a prompt and greedy decoding after it, tokens per second, on 1 and 2 threads.
//
//   node bench/compare_llama_cpp.mjs --dissect build/bench/tools/dissect/dissect \
//       [--threads 1,2] [--prompt 128,512] [--decode 64] [--rounds 1] [--tie 0.5] FILE.gguf...
//
// llama.cpp is the prebuilt CPU library of @node-llama-cpp/linux-x64@3.22.1, driven through
// node-llama-cpp (tests/reference/gguf/make_fixtures.sh installs both into .deps/llama; set
// LLAMA_PACKAGES to use another place). Each engine gets the same prompt ids (a fixed
// pseudo-random sequence); llama.cpp evaluates the prompt in one batch (K/V cache F32, no flash
// attention, as the reference logits are made), then one token per call. dissect runs
// `dissect generate FILE --tokens … --max-new-tokens N --temperature 0 --ids` with
// OMP_NUM_THREADS set, and its own timings are read from its output. Rounds interleave the
// engines; each cell is the median.
//
// The greedy check, before anything is reported: free-running greedy sequences of two engines
// part at the first near-tie (random-weight models have near-flat logits over 32,000 tokens, and
// two correct engines that quantise activations differently order a near-tie differently), after
// which nothing can be compared. So llama.cpp is teacher-forced on dissect's sequence: it
// evaluates the prompt and then dissect's own tokens, and at every step dissect's token must be
// llama.cpp's argmax, or within `--tie` (a fraction of that step's logit standard deviation) of
// it. A row says "all argmax" when every token is llama.cpp's argmax, "N near-ties (≤ x σ)" when some
// are within the tie margin; a larger gap stops the run with the step and both logits, before
// any time is printed. The first free-running round's tokens are also compared, for the table.
// Why 0.5 σ: on the 22 random layers of TinyLlama's shape, a quantised file's logits move by a
// few percent between engines that round activations differently (dissect per block of 32 with
// an fp32 scale, llama.cpp to q8_0 with an fp16 one; random layers amplify the difference): the
// first prefill token already sat 0.09 σ below llama.cpp's argmax on q4_0, and step 58 of 64 on
// the same file 0.26 σ. A wrong model (a token drawn at random, wrong weights, a shifted
// position) lands ~4 σ below the argmax (the maximum of 32,000 near-normal logits), and within
// 0.5 σ only for the few tokens next to the top: over 64 steps it cannot pass. The f32 rows
// show "all argmax" at any margin.
import {spawnSync} from "node:child_process";

import {loadLlama} from "../tests/reference/gguf/llama_driver.mjs";

const args = process.argv.slice(2);
const option = (name, fallback) => {
  const at = args.indexOf(name);
  if (at < 0) return fallback;
  const value = args[at + 1];
  args.splice(at, 2);
  return value;
};
const dissect = option("--dissect", "build/bench/tools/dissect/dissect");
const threads = option("--threads", "1,2").split(",").map(Number);
const promptLengths = option("--prompt", "128").split(",").map(Number);
const decodeLength = Number(option("--decode", "64"));
const rounds = Number(option("--rounds", "1"));
const tie = Number(option("--tie", "0.5"));
const files = args;
if (files.length === 0 || threads.some((t) => !(t >= 1)) || promptLengths.some((p) => !(p >= 1)) ||
    !(decodeLength >= 2) || !(rounds >= 1) || !(tie >= 0)) {
  console.error("usage: node bench/compare_llama_cpp.mjs --dissect PATH [--threads 1,2] " +
                "[--prompt 128,512] [--decode 64] [--rounds 1] [--tie 0.5] FILE.gguf...");
  process.exit(2);
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

const {llama, description} = await loadLlama();

const contextOptions = (prompt, threadCount) => ({
  contextSize: prompt.length + decodeLength + 8,
  batchSize: prompt.length,
  threads: threadCount,
  flashAttention: false,
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});

// llama.cpp teacher-forced on dissect's greedy `tokens` after `prompt`: per step, whether
// dissect's token is llama.cpp's argmax, and if not, how far below it in standard deviations.
async function checkGreedy(file, prompt, tokens, vocab) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext(contextOptions(prompt, 2));
  try {
    const sequence = context.getSequence();
    const want = {generateNext: {logits: true}};
    let next = (await sequence.controlledEvaluate(
        prompt.map((token, i) => (i + 1 === prompt.length ? [token, want] : token))))[prompt.length - 1];
    let nearTies = 0, worst = 0;
    for (let step = 0; step < tokens.length; step++) {
      const logits = next?.next?.logits;
      if (logits == null || logits.size !== vocab) throw new Error(`${file}: no logits at step ${step}`);
      let max = -Infinity, argmax = -1, sum = 0, sumSquares = 0;
      for (const [token, logit] of logits) {
        if (logit > max) [max, argmax] = [logit, token];
        sum += logit;
        sumSquares += logit * logit;
      }
      const sigma = Math.sqrt(Math.max(sumSquares / vocab - (sum / vocab) ** 2, 0));
      const ours = logits.get(tokens[step]);
      if (tokens[step] !== argmax) {
        const gap = (max - ours) / sigma;
        if (!(gap <= tie)) {
          throw new Error(`${file}, prompt ${prompt.length}: greedy step ${step}: dissect chose ` +
                          `${tokens[step]} (llama.cpp logit ${ours}), llama.cpp's argmax is ` +
                          `${argmax} (${max}): ${gap.toFixed(4)} σ apart, over the --tie ${tie}`);
        }
        nearTies++;
        worst = Math.max(worst, gap);
      }
      if (step + 1 < tokens.length) [next] = await sequence.controlledEvaluate([[tokens[step], want]]);
    }
    return {nearTies, worst};
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

async function runLlamaCpp(file, threadCount, prompt, vocab) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext(contextOptions(prompt, threadCount));
  try {
    const sequence = context.getSequence();
    const want = {generateNext: {token: true}};
    const last = (results) => results[results.length - 1].next.token;
    let start = process.hrtime.bigint();
    const prefill = await sequence.controlledEvaluate(
        prompt.map((token, i) => (i + 1 === prompt.length ? [token, want] : token)));
    const prefillSeconds = Number(process.hrtime.bigint() - start) / 1e9;
    const tokens = [last(prefill)];
    start = process.hrtime.bigint();
    while (tokens.length < decodeLength) {
      tokens.push(last(await sequence.controlledEvaluate([[tokens[tokens.length - 1], want]])));
    }
    const decodeSeconds = Number(process.hrtime.bigint() - start) / 1e9;
    if (tokens.some((t) => !(t >= 0 && t < vocab))) throw new Error(`${file}: token out of range`);
    return {prefill: prompt.length / prefillSeconds, decode: (decodeLength - 1) / decodeSeconds,
            tokens};
  } finally {
    await context.dispose();
    await model.dispose();
  }
}

function runDissect(file, threadCount, prompt) {
  const result = spawnSync(dissect, ["generate", file, "--tokens", prompt.join(","),
                                     "--max-new-tokens", String(decodeLength),
                                     "--temperature", "0", "--ids"],
                           {encoding: "utf8", env: {...process.env, OMP_NUM_THREADS: String(threadCount)},
                            maxBuffer: 1 << 26});
  if (result.status !== 0) throw new Error(`dissect generate ${file}: ${result.stderr.trim()}`);
  const out = result.stdout;
  const ids = out.split("\n")[0].split(",").map(Number);
  const prefill = Number(/prefill +\d+ prompt tokens.*?, ([0-9.e+]+) tokens\/s/.exec(out)?.[1]);
  const decode = Number(/decode +\d+ tokens, ([0-9.e+]+) tokens\/s/.exec(out)?.[1]);
  if (!(prefill > 0) || !(decode > 0)) throw new Error(`dissect generate ${file}: no timings in\n${out}`);
  return {prefill, decode, tokens: ids.slice(prompt.length)};
}

const rows = [];
for (const file of files) {
  const probe = await llama.loadModel({modelPath: file, vocabOnly: true});
  const vocab = probe.fileInfo.metadata.tokenizer.ggml.tokens.length;
  await probe.dispose();
  for (const promptLength of promptLengths) {
    // A fixed pseudo-random prompt (Knuth's multiplicative hash), away from the special ids.
    const prompt = Array.from({length: promptLength}, (_, i) => 3 + ((i * 2654435761) >>> 0) % (vocab - 3));
    const checks = new Map();
    for (const threadCount of threads) {
      const cells = {dissect: {prefill: [], decode: []}, llama: {prefill: [], decode: []}};
      let same = true, check = null;
      for (let round = 0; round < rounds; round++) {
        const ours = runDissect(file, threadCount, prompt);
        // Each distinct sequence dissect produced is checked (once), before any time is shown.
        const key = ours.tokens.join();
        if (!checks.has(key)) checks.set(key, await checkGreedy(file, prompt, ours.tokens, vocab));
        const checked = checks.get(key);
        if (check === null || checked.nearTies > check.nearTies) check = checked;
        const theirs = await runLlamaCpp(file, threadCount, prompt, vocab);
        same &&= ours.tokens.length === theirs.tokens.length &&
                 ours.tokens.every((t, i) => t === theirs.tokens[i]);
        for (const [name, r] of [["dissect", ours], ["llama", theirs]]) {
          cells[name].prefill.push(r.prefill);
          cells[name].decode.push(r.decode);
        }
        console.error(`${file} prompt ${promptLength}, ${threadCount} thread(s) round ${round + 1}: ` +
                      `dissect ${ours.prefill.toFixed(1)} / ${ours.decode.toFixed(2)}, llama.cpp ` +
                      `${theirs.prefill.toFixed(1)} / ${theirs.decode.toFixed(2)} tokens/s`);
      }
      rows.push({file, promptLength, threads: threadCount, same, check,
                 dp: median(cells.dissect.prefill), lp: median(cells.llama.prefill),
                 dd: median(cells.dissect.decode), ld: median(cells.llama.decode)});
    }
  }
}

console.log(`llama.cpp: ${description}; ${decodeLength} tokens decoded, ${rounds} round(s), ` +
            `medians, tokens/s; greedy check: llama.cpp teacher-forced on dissect's tokens, ` +
            `near-tie margin ${tie} σ\n`);
console.log("| file | prompt | threads | greedy check | free-run tokens | prefill dissect | prefill llama.cpp | ratio | decode dissect | decode llama.cpp | ratio |");
console.log("|---|---|---|---|---|---|---|---|---|---|---|");
for (const r of rows) {
  const name = r.file.split("/").pop();
  const check = r.check.nearTies === 0 ? "all argmax"
                                        : `${r.check.nearTies} near-tie(s) ≤ ${r.check.worst.toFixed(3)} σ`;
  console.log(`| ${name} | ${r.promptLength} | ${r.threads} | ${check} | ${r.same ? "equal" : "differ"} | ` +
              `${r.dp.toFixed(1)} | ${r.lp.toFixed(1)} | ${(r.dp / r.lp).toFixed(2)} | ${r.dd.toFixed(2)} | ` +
              `${r.ld.toFixed(2)} | ${(r.dd / r.ld).toFixed(2)} |`);
}
