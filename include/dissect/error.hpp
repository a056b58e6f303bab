// dissect/error.hpp — the exception types the library throws.
//
// Everything derives from dissect::Error (a std::runtime_error), so one catch handles them
// all. ShapeError is for shapes that do not fit (including element counts that overflow
// int64); ConfigError is for impossible model or budget configurations; OverflowError (a
// ShapeError) for any count or size that leaves int64. Messages start with
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

namespace detail {

/// Builds a message from streamable parts, so call sites read like the message itself.
template <class... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

}  // namespace detail
}  // namespace dissect
