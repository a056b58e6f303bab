// tools/common/table.hpp — plain-text tables for terminals: aligned columns of UTF-8 text.
//
// The tools and examples print their results as tables whose labels carry "·", "²", "→" or "×";
// printf's %-30s counts bytes, not columns, so the padding here counts code points instead.
// Shared by tools and examples, never by the library.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dissect::tools {

/// Columns a UTF-8 string takes in a terminal, assuming one per code point: enough for the
/// "·", "ᵀ", "√", "→", "²" and "×" the tables use (no wide or combining characters).
inline std::size_t display_width(std::string_view text) {
  return static_cast<std::size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // not a continuation byte
  }));
}

/// `text` followed by blanks up to `width` columns, and by one blank at least when it is already
/// `width` wide or wider: a label padded this way never runs into the value written after it,
/// whatever the figures in it.
inline std::string pad_right(std::string text, std::size_t width) {
  const std::size_t used = display_width(text);
  text.append(used < width ? width - used : 1, ' ');
  return text;
}

/// Blanks, then `text`, up to `width` columns.
inline std::string pad_left(const std::string& text, std::size_t width) {
  const std::size_t used = display_width(text);
  return used < width ? std::string(width - used, ' ') + text : text;
}

/// Rows of cells printed in columns two spaces apart, each column as wide as its widest cell:
/// however wide a figure grows, its column grows with it and two blanks stay between columns.
/// Lines carry no trailing blanks, which would make a table awkward to compare and to paste.
class TextTable {
 public:
  /// `right_aligned[c]`: column c is padded on the left (numbers); missing entries mean left.
  explicit TextTable(std::vector<bool> right_aligned = {})
      : right_aligned_(std::move(right_aligned)) {}

  void add_row(std::vector<std::string> cells) { rows_.push_back({std::move(cells), false}); }

  /// A row of dashes, as wide as each column.
  void add_rule() { rows_.push_back({{}, true}); }

  std::string render() const {
    std::vector<std::size_t> width;
    for (const Row& row : rows_) {
      if (width.size() < row.cells.size()) width.resize(row.cells.size(), 0);
      for (std::size_t c = 0; c < row.cells.size(); ++c) {
        width[c] = std::max(width[c], display_width(row.cells[c]));
      }
    }
    std::string out;
    for (const Row& row : rows_) {
      std::string line;
      for (std::size_t c = 0; c < width.size(); ++c) {
        const std::string cell = row.rule               ? std::string(width[c], '-')
                                 : c < row.cells.size() ? row.cells[c]
                                                        : std::string();
        if (c) line += "  ";
        const bool right = c < right_aligned_.size() && right_aligned_[c];
        // Every column is as wide as its widest cell, and the separator keeps them apart.
        const std::size_t blanks = width[c] - display_width(cell);
        line += right ? std::string(blanks, ' ') + cell : cell + std::string(blanks, ' ');
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out += line + '\n';
    }
    return out;
  }

 private:
  struct Row {
    std::vector<std::string> cells;
    bool rule;
  };
  std::vector<bool> right_aligned_;
  std::vector<Row> rows_;
};

}  // namespace dissect::tools
