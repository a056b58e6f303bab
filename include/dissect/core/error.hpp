// dissect/core/error.hpp — the exception types the library throws.
//
// Everything derives from dissect::Error (a std::runtime_error), so one catch handles them
// all. ShapeError is for shapes that do not fit (including element counts that overflow
// int64); ConfigError is for impossible model or budget configurations; OverflowError (a
// ShapeError) for any count or size that leaves int64; FormatError for a file whose bytes break
// its format's rules (a corrupt checkpoint). Messages start with
// the operation and print every shape involved, in the spirit of PyTorch's
// "mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)".
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dissect {

/// Base of every exception dissect throws.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A shape that does not fit the operation: the message names the operation, both shapes and
/// the offending axis.
struct ShapeError : Error {
  using Error::Error;
};

/// An impossible model or budget configuration: the message names the field.
struct ConfigError : Error {
  using Error::Error;
};

/// A count, size or byte total that leaves int64: an element count, a parameter count, a budget.
/// It is a ShapeError because every such number is a product of extents.
struct OverflowError : ShapeError {
  using ShapeError::ShapeError;
};

/// A file whose contents break its format's rules (truncated, an impossible header, offsets out
/// of range or overlapping): the message names the file and what is wrong in it. I/O failures
/// (a file that cannot be opened or written) are plain Errors.
struct FormatError : Error {
  using Error::Error;
};

/// Builds a message from streamable parts, so call sites read like the message itself:
/// `concat("Linear::forward: input last dim ", k, " != in_features ", in)`. Public so that tools
/// and user code can word their errors as the library does.
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

namespace detail {
using dissect::concat;  // the library's own call sites predate its move out of detail
}  // namespace detail
}  // namespace dissect
