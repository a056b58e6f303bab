// Writes the committed test corpora under tests/reference/tokenizers/corpus/.
//
//     node tests/reference/tokenizers/make_corpora.mjs
//
// Needs Debian's `fortunes` package (scripts/install-deps installs it) and base-files'
// /usr/share/common-licenses/GPL-3; no npm package. The corpora change only when this script
// does: make_fixtures.mjs reads the committed files, so regenerating the fixtures does not depend
// on what the machine's fortune files hold. Every file is JSON lines, one JSON string per line
// (see jsonl.mjs for the escaping).

import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { writeJsonl, writeLines } from "./jsonl.mjs";
import hardCases from "./hard_cases.mjs";

const here = path.dirname(fileURLToPath(import.meta.url));
const corpusDir = path.join(here, "corpus");
fs.mkdirSync(corpusDir, { recursive: true });

// ---- fortunes: every entry of these files, in this order --------------------------------------
// Chosen for variety at about 3,000 lines: ascii-art is whitespace-heavy drawings (runs of
// spaces and tabs), debian IRC quotes, fortunes short one-liners, linux longer prose with tabs,
// code and one non-ASCII word ("Linuxkongreß"), perl quotes full of code and punctuation.
const FORTUNE_DIR = "/usr/share/games/fortunes";
const FORTUNE_FILES = ["ascii-art", "debian", "fortunes", "linux", "perl"];

function fortuneEntries(file) {
  // strfile's format: entries separated by lines holding only "%". An entry keeps its inner
  // newlines and tabs; the newline before the "%" ends the entry and is not part of it.
  const text = fs.readFileSync(path.join(FORTUNE_DIR, file), "utf8");
  const entries = [];
  let lines = [];
  for (const line of text.split("\n")) {
    if (line === "%") {
      entries.push(lines.join("\n"));
      lines = [];
    } else {
      lines.push(line);
    }
  }
  // A file ends with "%\n", which leaves one empty line behind; anything else is a last entry.
  if (lines.length > 1 || lines[0] !== "") entries.push(lines.join("\n"));
  return entries.filter((entry) => entry.length > 0);
}

const fortunes = [];
let fortuneLines = 0;
for (const file of FORTUNE_FILES) {
  const entries = fortuneEntries(file);
  fortunes.push(...entries);
  const lines = entries.reduce((sum, entry) => sum + entry.split("\n").length, 0);
  fortuneLines += lines;
  console.log(`fortunes/${file}: ${entries.length} entries, ${lines} lines`);
}
writeJsonl(path.join(corpusDir, "fortunes.jsonl"), fortunes);

// ---- the GPL: the whole text as one case, then each paragraph ---------------------------------
// Paragraphs are split on blank lines (lines empty or only spaces); each keeps its indentation
// and inner newlines. The whole text keeps its final newline.
const gpl = fs.readFileSync("/usr/share/common-licenses/GPL-3", "utf8");
const paragraphs = gpl.split(/\n(?:[ \t]*\n)+/).filter((p) => p.trim().length > 0);
writeJsonl(path.join(corpusDir, "gpl.jsonl"), [gpl, ...paragraphs]);

// ---- the hand-written hard set ------------------------------------------------------------------
writeJsonl(path.join(corpusDir, "hard.jsonl"), hardCases.map(([, text]) => text));
writeLines(path.join(corpusDir, "hard_labels.txt"), hardCases.map(([label]) => label));

// ---- invalid UTF-8 ------------------------------------------------------------------------------
// Lowercase hex of whole byte strings, each an invalid UTF-8 sequence inside text. The fixtures
// hold TextDecoder's lossy decoding of each (the WHATWG "maximal subpart" rule: one U+FFFD per
// maximal prefix of a valid sequence, else per byte). No case starts with EF BB BF, which
// `new TextDecoder()` would drop as a BOM.
const hex = (s) => Buffer.from(s, "utf8").toString("hex");
const invalid = [
  ["ff-in-text", hex("Hello") + "ff" + hex(" world")],
  ["fe-in-text", hex("a") + "fe" + hex("b")],
  ["ff-alone", "ff"],
  ["overlong-slash-2", hex("path") + "c0af" + hex("etc")],
  ["overlong-c1", hex("x") + "c1bf" + hex("y")],
  ["overlong-slash-3", hex("path") + "e080af" + hex("etc")],
  ["overlong-slash-4", hex("path") + "f08080af" + hex("etc")],
  ["overlong-4-max", hex("x") + "f08fbfbf" + hex("y")],
  ["lone-continuation", hex("a") + "80" + hex("b")],
  ["continuation-run", hex("a") + "808182bf" + hex("b")],
  ["truncated-euro", hex("cost ") + "e282" + hex(" 5")],
  ["truncated-3-at-end", hex("end") + "e2"],
  ["truncated-4-at-end", hex("smile ") + "f09f98"],
  ["truncated-4-middle", hex("a") + "f09f98" + hex("b")],
  ["surrogate-high", hex("x") + "eda080" + hex("y")],
  ["surrogate-low", hex("x") + "edbfbf" + hex("y")],
  ["cesu8-pair", hex("emoji ") + "eda0bdedb880"],
  ["above-10ffff", hex("x") + "f4908080" + hex("y")],
  ["f5-lead", hex("x") + "f5808080" + hex("y")],
  ["five-byte", hex("x") + "f888808080" + hex("y")],
  ["bad-second-byte", hex("a") + "c328" + hex("b")],
  ["bad-third-byte", hex("a") + "e228a1" + hex("b")],
  ["e0-low-second", hex("a") + "e09f80" + hex("b")],
  ["valid-then-invalid", hex("café") + "ff" + hex("日本") + "80"],
  ["max-then-continuation", hex("max ") + "f48fbfbf" + "80"],
  ["bom-then-invalid", hex("a") + "efbbbf" + "ff" + hex("b")],
];
writeJsonl(path.join(corpusDir, "invalid_utf8.jsonl"), invalid.map(([, bytes]) => bytes));
writeLines(path.join(corpusDir, "invalid_utf8_labels.txt"), invalid.map(([label]) => label));
for (const [label, bytes] of invalid) {
  // Each case must really be invalid, or it tests nothing.
  let valid = true;
  try {
    new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(bytes, "hex"));
  } catch {
    valid = false;
  }
  if (valid) throw new Error(`invalid_utf8 case ${label} is valid UTF-8`);
}

console.log(`fortunes.jsonl: ${fortunes.length} cases, ${fortuneLines} lines`);
console.log(`gpl.jsonl: ${paragraphs.length + 1} cases (the whole text, ${paragraphs.length} paragraphs)`);
console.log(`hard.jsonl: ${hardCases.length} cases`);
console.log(`invalid_utf8.jsonl: ${invalid.length} cases`);
