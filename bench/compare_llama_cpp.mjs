// compare_llama_cpp.mjs — dissect against llama.cpp on the same GGUF files, in one run:
// prefill of a prompt and greedy decoding after it, tokens per second, on 1 and 2 threads.
//
//   node bench/compare_llama_cpp.mjs --dissect build/bench/tools/dissect/dissect \
//       [--threads 1,2] [--prompt 128] [--decode 64] [--rounds 1] FILE.gguf...
//
// llama.cpp is the prebuilt CPU library of @node-llama-cpp/linux-x64@3.22.1, driven through
// node-llama-cpp (tests/reference/gguf/make_fixtures.sh installs both into .deps/llama; set
// LLAMA_PACKAGES to use another place). Each engine gets the same prompt ids (a fixed
// pseudo-random sequence); llama.cpp evaluates the prompt in one batch (K/V cache F32, no flash
// attention, as the reference logits are made), then one token per call. dissect runs
// `dissect generate FILE --tokens … --max-new-tokens N --temperature 0 --ids` with
// OMP_NUM_THREADS set, and its own timings are read from its output. Before any number is
// reported, both engines' greedy tokens are compared: a row whose tokens differ says so.
// Rounds interleave the engines; each cell is the median.
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
const promptLength = Number(option("--prompt", "128"));
const decodeLength = Number(option("--decode", "64"));
const rounds = Number(option("--rounds", "1"));
const files = args;
if (files.length === 0 || threads.some((t) => !(t >= 1)) || !(promptLength >= 1) ||
    !(decodeLength >= 2) || !(rounds >= 1)) {
  console.error("usage: node bench/compare_llama_cpp.mjs --dissect PATH [--threads 1,2] " +
                "[--prompt 128] [--decode 64] [--rounds 1] FILE.gguf...");
  process.exit(2);
}

const median = (values) => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

const {llama, description} = await loadLlama();

async function runLlamaCpp(file, threadCount, prompt, vocab) {
  const model = await llama.loadModel({modelPath: file});
  const context = await model.createContext({
    contextSize: promptLength + decodeLength + 8,
    batchSize: promptLength,
    threads: threadCount,
    flashAttention: false,
    experimentalKvCacheKeyType: "F32",
    experimentalKvCacheValueType: "F32",
  });
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
  // A fixed pseudo-random prompt (Knuth's multiplicative hash), away from the special ids.
  const prompt = Array.from({length: promptLength}, (_, i) => 3 + ((i * 2654435761) >>> 0) % (vocab - 3));
  for (const threadCount of threads) {
    const cells = {dissect: {prefill: [], decode: []}, llama: {prefill: [], decode: []}};
    let same = true;
    for (let round = 0; round < rounds; round++) {
      const ours = runDissect(file, threadCount, prompt);
      const theirs = await runLlamaCpp(file, threadCount, prompt, vocab);
      same &&= ours.tokens.length === theirs.tokens.length &&
               ours.tokens.every((t, i) => t === theirs.tokens[i]);
      for (const [name, r] of [["dissect", ours], ["llama", theirs]]) {
        cells[name].prefill.push(r.prefill);
        cells[name].decode.push(r.decode);
      }
      console.error(`${file} ${threadCount} thread(s) round ${round + 1}: dissect ${ours.prefill.toFixed(1)} / ` +
                    `${ours.decode.toFixed(2)}, llama.cpp ${theirs.prefill.toFixed(1)} / ${theirs.decode.toFixed(2)} tokens/s`);
      if (!same) {
        console.error(`  greedy tokens differ: dissect ${ours.tokens.slice(0, 12)} … llama.cpp ${theirs.tokens.slice(0, 12)} …`);
      }
    }
    rows.push({file, threads: threadCount, same,
               dp: median(cells.dissect.prefill), lp: median(cells.llama.prefill),
               dd: median(cells.dissect.decode), ld: median(cells.llama.decode)});
  }
}

console.log(`llama.cpp: ${description}; prompt ${promptLength} tokens, ${decodeLength} decoded, ` +
            `${rounds} round(s), medians, tokens/s\n`);
console.log("| file | threads | greedy tokens | prefill dissect | prefill llama.cpp | ratio | decode dissect | decode llama.cpp | ratio |");
console.log("|---|---|---|---|---|---|---|---|---|");
for (const r of rows) {
  const name = r.file.split("/").pop();
  console.log(`| ${name} | ${r.threads} | ${r.same ? "equal" : "**differ**"} | ${r.dp.toFixed(1)} | ` +
              `${r.lp.toFixed(1)} | ${(r.dp / r.lp).toFixed(2)} | ${r.dd.toFixed(2)} | ${r.ld.toFixed(2)} | ` +
              `${(r.dd / r.ld).toFixed(2)} |`);
}
