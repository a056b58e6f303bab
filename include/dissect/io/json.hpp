// dissect/io/json.hpp — JSON read strictly, as dissect's file readers read it: a key repeated
// within an object is a FormatError naming where, and parse errors name the file. Public so
// that the layers above io (text/: tokenizer.json) read JSON by the same rules.
#pragma once

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/io/detail/json.hpp"

namespace dissect::io {

/// `text` as JSON; `where` ("tokenizer.json") starts every message.
/// @throws FormatError "<where> is not valid JSON: ..." or "<where>: key "x" appears twice".
using dissect::detail::parse_json_strictly;

/// Runs a SAX handler over `text` (for a reader that streams a large member instead of
/// building it); parse errors are FormatErrors naming `where`.
using dissect::detail::run_json_sax;

/// The handler parse_json_strictly builds its value with; a streaming reader forwards to it.
using dissect::detail::StrictJsonBuilder;

/// What a JSON value is, for messages: "a string", "an array", "the number 2.5", "null".
using dissect::detail::describe_json;

}  // namespace dissect::io
