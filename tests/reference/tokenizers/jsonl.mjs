// JSON-lines helpers shared by the tokenizer fixture scripts and bench/compare_tokenizers.mjs.
//
// Every line of a .jsonl file here is one JSON string. JSON.stringify already escapes '"', '\'
// and the C0 controls; this also escapes, as \uXXXX, every code point that is invisible or that
// some tool would take for a line break (U+0085, U+2028, U+2029), so the committed files stay
// readable, reviewable in a diff and unambiguous for line-based tools: other controls (Cc), format
// characters (Cf: ZWJ, BOM, bidi marks, tags), private use (Co), unassigned and noncharacters
// (Cn), separators other than U+0020 (Z*) and variation selectors. Astral code points come out as
// surrogate pairs, which every JSON parser joins back. Lone surrogates never occur: the
// generators check that every case is well-formed UTF-16, i.e. valid Unicode.

import fs from "node:fs";

const INVISIBLE = /[\p{C}\p{Z}\u{FE00}-\u{FE0F}\u{E0100}-\u{E01EF}]/gu;
// With the u flag a surrogate pair is one code point, so this matches lone surrogates only
// (String.prototype.isWellFormed would do, but Debian 12's Node 18 lacks it).
const LONE_SURROGATE = /\p{Cs}/u;

function escapeCodePoint(ch) {
  let out = "";
  for (let i = 0; i < ch.length; ++i) {
    out += "\\u" + ch.charCodeAt(i).toString(16).padStart(4, "0");
  }
  return out;
}

/** One JSON string, without a newline. */
export function jsonLine(text) {
  if (typeof text !== "string") throw new Error("jsonLine: not a string");
  if (LONE_SURROGATE.test(text)) throw new Error(`lone surrogate in ${JSON.stringify(text)}`);
  return JSON.stringify(text).replace(INVISIBLE, (ch) => (ch === " " ? ch : escapeCodePoint(ch)));
}

/** Writes one JSON string per line; every line ends with "\n". */
export function writeJsonl(path, strings) {
  fs.writeFileSync(path, strings.map((s) => jsonLine(s) + "\n").join(""));
}

/** Reads a file written by writeJsonl back into its strings. */
export function readJsonl(path) {
  const text = fs.readFileSync(path, "utf8");
  if (text.length > 0 && !text.endsWith("\n")) throw new Error(`${path}: no final newline`);
  return text.length === 0 ? [] : text.slice(0, -1).split("\n").map((line) => JSON.parse(line));
}

/** Writes lines of plain text (labels, ids), each ending with "\n". */
export function writeLines(path, lines) {
  fs.writeFileSync(path, lines.map((line) => line + "\n").join(""));
}
