// The hand-written hard set: [label, text] pairs, written by make_corpora.mjs to
// corpus/hard.jsonl (the texts) and corpus/hard_labels.txt (the labels, same line numbers).
//
// Each group aims at one place where a tokenizer implementation can go wrong: Unicode
// categories (the pre-tokenizer regexes are written in \p{L}, \p{N}, \s), normalization (qwen3
// applies NFC), byte-level and byte-fallback encoding, added-token matching, whitespace runs (the
// \s+(?!\S) lookahead), contractions (the (?i:'s|…) group) and very long pieces. Escapes are
// used for anything invisible so the file can be reviewed. Labels are unique, short and free of
// spaces so a failing test can name its case.

const cases = [];
function add(label, text) {
  cases.push([label, text]);
}
const repeat = (s, n) => s.repeat(n);

// ---- trivial inputs ----------------------------------------------------------------------------
add("empty", "");
add("space", " ");
add("two-spaces", "  ");
add("one-letter", "a");
add("one-dot", ".");
add("one-tab", "\t");
add("one-newline", "\n");
add("hello", "Hello world");
add("hello-lead-space", " Hello world");

// ---- every general category that valid UTF-8 can carry ------------------------------------------
// Alone, and inside a sentence, because the regexes treat a piece differently at the start.
const categories = [
  ["Lu", "ÀÉÎÕÜ ΑΒΓΔ АБВГ ĀŁŒ"],
  ["Ll", "àéîõü αβγδ абвг āłœ"],
  ["Lt", "ǅ ǈ ǋ ǲ ᾈ ᾯ"],
  ["Lm", "ʰ ʲ ˆ ˇ ー ᴬ ꜝ"],
  ["Lo", "א ب 中 あ ㄱ ཀ ሀ"],
  ["Mn", "a\u0300 o\u0308 \u0301 \u05B7 \u0651 \u093C"],
  ["Mc", "का कः \u0903 \u0BBE ಿ"],
  ["Me", "1\u20E3 \u20DD \u20DE \u0488"],
  ["Nd", "0123 ٠١٢٣ ०१२३ ０１２３ ๐๑๒"],
  ["Nl", "Ⅰ Ⅱ Ⅻ ⅰ 〇 ᛮ"],
  ["No", "½ ¾ ² ³ ① ⁴ ₅ ༳"],
  ["Pc", "snake_case ‿ ⁀ ＿"],
  ["Pd", "a-b a–b a—b a‐b ⸺"],
  ["Ps", "( [ { 「 『 ⁅ ❨"],
  ["Pe", ") ] } 」 』 ⁆ ❩"],
  ["Pi", "« ‘ “ ‹"],
  ["Pf", "» ’ ” ›"],
  ["Po", "! ? ¡ ¿ 。 、 ، ؟ ¶ §"],
  ["Sm", "+ < = > ∑ ∞ ≠ ± × ÷ ¬"],
  ["Sc", "$ € £ ¥ ₹ ₿ ¢ ₩"],
  ["Sk", "^ ` ¨ ˚ ´ ˜ ꜀"],
  ["So", "© ® ° ™ ☃ ♥ ⌘ ⚙"],
  ["Zs", "a\u2003b\u2009c\u202Fd\u205Fe\u1680f"],
  ["Zl", "line\u2028separator"],
  ["Zp", "paragraph\u2029separator"],
  ["Cc", "bell\u0007esc\u001Bdel\u007Fc1\u0080\u009F"],
  ["Cf", "soft\u00ADhyphen zw\u200Bsp zwnj\u200Cx zwj\u200Dx wj\u2060x"],
  ["Co", "\uE000\uE123\uF8FF \u{F0000}\u{10FFFD}"],
  ["Cn", "nonchar\uFFFE\uFFFF \u{1FFFE}"],
];
for (const [cat, text] of categories) {
  add(`cat-${cat}`, text);
  add(`cat-${cat}-in-text`, `The ${cat} sample: ${text}, done.`);
}
add("nul", "a\u0000b");
add("nul-alone", "\u0000");
add("replacement-char", "bad \uFFFD char");

// ---- emoji ------------------------------------------------------------------------------------
add("emoji-single", "😀");
add("emoji-in-text", "hello😀world");
add("emoji-run", "😀😃😄😁😆😅");
add("emoji-heart-vs16", "I \u2764\uFE0F NY");
add("emoji-text-vs15", "\u263A\uFE0E vs \u263A\uFE0F");
add("emoji-skin-tone", "👍🏽 👋🏿 👌🏻");
add("emoji-zwj-family", "👨\u200D👩\u200D👧\u200D👦");
add("emoji-zwj-profession", "🧑🏿\u200D💻 👩\u200D🚀");
add("emoji-zwj-kiss", "👩\u200D\u2764\uFE0F\u200D💋\u200D👨");
add("emoji-rainbow-flag", "🏳\uFE0F\u200D🌈");
add("emoji-flags", "🇺🇸🇯🇵🇩🇪🇫🇷");
add("emoji-lone-regional", "🇺 alone");
add("emoji-tag-flag", "🏴\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}");
add("emoji-keycap", "1\uFE0F\u20E3 #\uFE0F\u20E3");
add("emoji-new", "🫠🪿🦩🫨");
add("emoji-repeated", repeat("🙂", 50));

// ---- combining marks and normalization (NFC changes these) -------------------------------------
add("cafe-nfc", "café");
add("cafe-nfd", "cafe\u0301");
add("stacked-acutes", "e\u0301\u0301\u0301");
add("vietnamese-nfc", "Tiếng Việt có dấu");
add("vietnamese-nfd", "Tiếng Việt có dấu".normalize("NFD"));
add("vietnamese-reordered", "e\u0302\u0323 vs e\u0323\u0302"); // canonical reordering
add("hangul-syllables", "한국어 텍스트");
add("hangul-jamo", "\u1112\u1161\u11AB\u1100\u116E\u11A8\u110B\u1165"); // NFC: 한국어
add("hangul-compat-jamo", "ㅎㅏㄴㄱㅜㄱ");
add("angstrom-sign", "\u212B vs \u00C5"); // NFC maps the sign to Å
add("ohm-sign", "\u2126 vs \u03A9");
add("kelvin-sign", "\u212A");
add("devanagari-qa", "\u0958"); // a composition exclusion: NFC gives \u0915\u093C
add("ligature-fi", "ﬁnance ﬀ"); // NFC leaves it, NFKC would not
add("umlaut-order", "a\u0308\u0301 a\u0301\u0308");
add("greek-tonos", "\u0390 \u03B9\u0308\u0301");
add("combining-start", "\u0301leading mark");
add("combining-after-space", "a \u0301b");
add("zalgo", "Z\u0351\u0352\u0353a\u0354\u0355\u0356l\u0357\u0358g\u0359\u035Ao");

// ---- CJK ----------------------------------------------------------------------------------------
add("chinese", "你好，世界！今天天气很好。");
add("chinese-no-space", "我爱北京天安门天安门上太阳升");
add("japanese", "日本語のテキストです。カタカナ、ひらがな。");
add("japanese-long-vowel", "コーヒーとケーキ");
add("halfwidth-katakana", "ｶﾀｶﾅ ﾃｽﾄ");
add("fullwidth-latin", "ＡＢＣ ａｂｃ！");
add("korean", "안녕하세요, 세계! 반갑습니다.");
add("cjk-mixed-english", "中文English混合テキストmixed");
add("cjk-long-run", repeat("漢字仮名交じり文", 25));

// ---- right-to-left ------------------------------------------------------------------------------
add("arabic", "مرحبا بالعالم");
add("arabic-tashkeel", "مُحَمَّد");
add("arabic-numbers", "العدد 123 والعدد ٤٥٦ هنا");
add("hebrew", "שלום עולם");
add("hebrew-mixed", "עברית 2024 English מילים");
add("bidi-marks", "\u200Fabc\u200E \u202Ebackwards\u202C");
add("persian-zwnj", "می\u200Cخواهم");

// ---- Indic and Southeast Asian -------------------------------------------------------------------
add("devanagari", "नमस्ते दुनिया");
add("devanagari-conjunct", "क्षत्रिय श्री");
add("thai", "สวัสดีชาวโลก");
add("thai-no-space", "ภาษาไทยไม่มีช่องว่างระหว่างคำ");
add("tamil", "தமிழ் மொழி");
add("bengali", "বাংলা ভাষা");
add("georgian-armenian", "ქართული Հայերեն");

// ---- numbers ------------------------------------------------------------------------------------
for (let n = 1; n <= 7; ++n) {
  const digits = "1234567".slice(0, n);
  add(`digits-${n}`, digits);
  add(`digits-${n}-in-text`, `I have ${digits} apples`);
  add(`digits-${n}-glued`, `abc${digits}def`);
}
add("digits-long", repeat("9876543210", 5));
add("decimal", "3.14159");
add("decimal-comma", "3,14159");
add("thousands", "1,234,567");
add("money", "$1,000.00 and €2.50");
add("negative", "-42 and +7");
add("scientific", "6.022e23 1E-9");
add("hex-number", "0x1F 0xDEADBEEF");
add("date-time", "2024-01-01T12:30:45Z");
add("percent", "10% 99.9%");
add("version", "v1.2.3-rc.4");
add("arabic-indic-digits", "٣٤٥ ۱۲۳");
add("fullwidth-digits", "１２３４５");
add("circled-digits", "①②③");
add("superscript-digits", "x² + y³ = z⁴");
add("phone", "+1 (555) 123-4567");

// ---- whitespace ----------------------------------------------------------------------------------
// Runs of 1..20 between two letters: the regex's \s+(?!\S) leaves one space to the next word.
for (const [name, ws] of [["space", " "], ["tab", "\t"], ["newline", "\n"]]) {
  for (let n = 1; n <= 20; ++n) add(`${name}-run-${n}`, `a${ws.repeat(n)}b`);
  for (const n of [2, 3, 8, 20]) add(`${name}-only-${n}`, ws.repeat(n));
}
add("crlf", "\r\n");
add("crlf-lines", "line1\r\nline2\r\nline3\r\n");
add("cr", "\r");
add("cr-lines", "a\rb\rc");
add("crlf-double", "para\r\n\r\npara");
add("lf-cr", "a\n\rb");
add("leading-spaces", "   hello");
add("trailing-spaces", "hello   ");
add("leading-trailing-newlines", "\n\nhello\n\n");
add("mixed-ws", " \t\n mixed \r\n ");
add("space-newline", " \n");
add("newline-space", "\n ");
add("spaces-newline-spaces", "  \n  ");
add("tab-newline", "\t\n");
add("vt-ff", "a\u000B\u000Cb");
add("nbsp", "\u00A0");
add("nbsp-between", "a\u00A0b");
add("nbsp-run", "a \u00A0 b\u00A0\u00A0c");
add("ideographic-space", "\u3000");
add("ideographic-space-between", "日本\u3000語");
add("bom", "\uFEFF");
add("bom-start", "\uFEFFhello");
add("bom-middle", "hello\uFEFFworld");
add("nel", "\u0085");
add("nel-between", "a\u0085b");
add("line-sep", "\u2028");
add("line-sep-between", "a\u2028b");
add("para-sep-between", "a\u2029b");
// JavaScript's \s (the reference's regexes run in V8) holds U+FEFF but not U+0085; Rust's and
// Oniguruma's \s (Hugging Face tokenizers, tiktoken) hold U+0085 but not U+FEFF. These differ
// between the two only when the character sits next to punctuation or other whitespace.
add("bom-before-punct", "x\uFEFF!");
add("bom-after-space", "x \uFEFFy");
add("bom-run-before-space", "a\uFEFF\uFEFF b");
add("nel-before-space", "a\u0085 b");
add("nel-between-punct", "!\u0085!");
add("nel-run", "a\u0085\u0085b");
add("nel-before-newline", "a\u0085\nb");
add("ws-before-punct", "word   !");
add("ws-after-punct", "!   word");
add("spaces-digits", "1   2");
add("newlines-digits", "1\n\n2");
add("ws-everywhere", " a  b   c    d     e ");

// ---- contractions ----------------------------------------------------------------------------------
for (const word of ["it's", "IT'S", "It'S", "don't", "DON'T", "Don'T", "you're", "YOU'RE", "You'Re",
                    "we've", "WE'VE", "I'm", "I'M", "we'll", "WE'LL", "We'Ll", "he'd", "HE'D"]) {
  add(`contraction-${word.replace("'", "_")}`, word);
}
add("contraction-typographic", "it’s don’t you’re");
add("contraction-alone-s", "'s");
add("contraction-alone-apostrophe", "'");
add("contraction-two-apostrophes", "''");
add("contraction-triple", "'''s");
add("contraction-rock-n-roll", "rock 'n' roll");
add("contraction-90s", "the 90's");
add("contraction-oclock", "o'clock");
add("contraction-tis", "'tis the season");
add("contraction-maam", "ma'am");
add("contraction-yalldve", "y'all'd've");
add("contraction-space-before", "it 's");
add("contraction-chain", "'S'T'RE'VE'M'LL'D");
add("contraction-prefix-only", "'sx 'tx 'llama 'dog");
add("contraction-after-digit", "1's 2'S");
add("contraction-after-cjk", "漢's");
add("contraction-quote", "\"it's\" 'quoted'");
add("kelvin-before-apostrophe", "\u212A's");
add("kelvin-after-apostrophe", "it'\u212A");
add("long-s-after-apostrophe", "it'\u017F");
add("long-s-upper-after-apostrophe", "IT'\u017F");
add("long-s-alone-after-apostrophe", "'\u017F");
add("long-s-before-apostrophe", "\u017F's");
add("kelvin-word", "\u212Aelvin's");
add("sharp-s", "straße STRASSE ẞ");
add("dotted-i", "İstanbul ıi");
add("titlecase-contraction", "ǅ's ǅ'S");
add("greek-final-sigma", "ΟΔΟΣ οδος");

// ---- strings that look like special tokens ----------------------------------------------------------
for (const token of ["<|endoftext|>", "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>",
                     "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>",
                     "<|eot_id|>", "<|endofprompt|>", "<start_of_turn>", "<end_of_turn>",
                     "<|reserved_special_token_0|>", "<mask>"]) {
  add(`special-${token.replace("/", "end-").replace(/[<>|]/g, "")}`, token);
}
add("special-partial-eot", "<|endoftext");
add("special-partial-eot-tail", "endoftext|>");
add("special-partial-s", "<s");
add("special-spaced-s", "< s>");
add("special-upper-s", "<S>");
add("special-nested-s", "<<s>>");
add("special-s-run", "<s><s></s>");
add("special-glued", "hello<|endoftext|>world");
add("special-spaced", " <s> ");
add("special-spaced-eot", "a <|endoftext|> b");
add("special-double-eot", "<|endoftext|><|endoftext|>");
add("special-chatml", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
add("special-gemma-turn", "<start_of_turn>user\nhello<end_of_turn>\n");
add("special-llama3-header", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>");
add("special-newline-around", "\n<|endoftext|>\n");
add("special-inside-word", "pre</s>post");
add("special-bos-in-text", "a<bos>b");
add("bracket-tags", "[CLS] text [SEP] [MASK]");

// ---- byte fallback and the SentencePiece meta character ---------------------------------------
add("cjk-ext-b", "𠀀𠀁𠀂");
add("cjk-ext-b-in-text", "rare 𪜀 and 𠮷 chars");
add("private-use", "\uE000\uE001 text \uF8FF");
add("private-use-astral", "\u{F0000}\u{10FFFD}");
add("byte-token-literal", "<0x41>");
add("byte-token-literals", "<0x0A><0xFF><0x00>");
add("meta-space-char", "▁");
add("meta-space-leading", "▁▁hello");
add("meta-space-between", "a▁b ▁ c");
add("rare-symbols", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙");
add("cuneiform", "𒀀𒀁");
add("linear-b", "𐀀𐀁");

// ---- long pieces ----------------------------------------------------------------------------------
add("a-500", repeat("a", 500));
add("ab-300", repeat("ab", 300));
add("space-a-200", repeat(" a", 200));
add("digits-200", repeat("1", 200));
add("url-long", "https://example.com/" + repeat("path/segment-", 21) + "end?query=value&x=" +
    repeat("0", 20) + "#fragment");
add("long-word-mixed", repeat("Supercalifragilistic", 20));
add("long-punct", repeat("!?", 150));
add("long-spaces", "x" + repeat(" ", 200) + "y");
add("long-newlines", "x" + repeat("\n", 100) + "y");
add("long-cyrillic", repeat("Съешь же ещё этих мягких французских булок", 5));

// ---- code and markup ----------------------------------------------------------------------------
add("python", "def f(x):\n    if x > 0:\n        return x ** 2  # square\n    return None\n");
add("cpp-tabs", "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\tfor (auto& x : v)\n\t\tx *= 2;\n\treturn 0;\n}\n");
add("json", '{"name": "dissect", "version": [1, 2, 3], "ok": true, "nested": {"a": null}}');
add("markdown-table", "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |\n");
add("markdown-list", "# Title\n\n- item one\n- **bold** and _italic_\n  1. nested\n\n```sh\nls -la\n```\n");
add("html", "<div class=\"a\"><p>Hello &amp; goodbye</p></div>");
add("latex", "$\\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}$");
add("unicode-math", "∀x∈ℝ: x²≥0 ∧ ∃y: y≠x → ∑ᵢ aᵢ ≤ ∞");
add("shell", "#!/bin/sh\nfind . -name '*.cpp' | xargs grep -n \"TODO\" 2>/dev/null\n");
add("regex", "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@\\w+\\.com$");
add("sql", "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;");
add("path-windows", "C:\\Users\\name\\Documents\\file.txt");
add("email", "someone.else+tag@example.co.uk");

// ---- mixed scripts without spaces -------------------------------------------------------------------
add("mixed-scripts", "helloмир你好مرحباשלוםनमस्ते");
add("mixed-latin-greek-cyrillic", "abcαβγабв");
add("mixed-tokyo", "Tokyo東京Tokyo");
add("mixed-naive", "naïveカフェcafé");
add("mixed-digits-letters", "abc123def456ghi");
add("mixed-case-runs", "camelCaseWordsAndHTTPServer");
add("mixed-upper-lower", "HeLLo WoRLD lOWER UPPER");

// ---- repeated punctuation ---------------------------------------------------------------------------
for (const p of ["!!!!!!", "...", "----", "????", "!?!?", "....................", "***", "===",
                 "~~~~", "…", "。。。", "-->", "<--", "::", "//", "/* */", "''''", "\"\"\"", "___"]) {
  add(`punct-${[...p].map((c) => c.codePointAt(0).toString(16)).join("-").slice(0, 24)}`, p);
}
add("punct-after-word", "wait... what?! no---yes");
add("punct-space-run", "a . . . b");

// ---- prose ----------------------------------------------------------------------------------------------
add("prose-english", "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere!");
add("prose-german", "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.");
add("prose-french", "Où est la bibliothèque ? « Là-bas », répondit-elle.");
add("prose-russian", "Широкая электрификация южных губерний даст мощный толчок подъёму сельского хозяйства.");
add("prose-spanish", "¿Qué tal? ¡Muy bien, gracias!");
add("prose-polish", "Zażółć gęślą jaźń");
add("prose-greek", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία");
add("prose-multiline", "First line.\nSecond line.\n\nNew paragraph.\n");

export default cases;
