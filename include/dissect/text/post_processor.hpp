// dissect/text/post_processor.hpp — tokenizer.json's "post_processor": the special tokens put
// around an encoded text when add_special_tokens is on (LLaMA 2's <s> from TemplateProcessing),
// or nothing at all (ByteLevel: GPT-2 and LLaMA 3 as their files are written).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/normalized_text.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/function_ref.hpp"
#include "dissect/text/detail/json_cursor.hpp"

namespace dissect::text {

class PostProcessor {
 public:
  /// Reads tokenizer.json's "post_processor" object at `at`.
  /// @throws FormatError for a malformed one (a template naming a special token it does not
  ///         define), ConfigError for a type dissect does not implement (Bert, Roberta).
  static PostProcessor from_json(const detail::JsonCursor& at) {
    at.expect_object();
    const std::string type = at["type"].string();
    PostProcessor out;
    if (type == "ByteLevel") {
      out.kind_ = Kind::byte_level;
      out.trim_offsets_ = at.boolean_or("trim_offsets", true);
    } else if (type == "TemplateProcessing") {
      out.kind_ = Kind::template_processing;
      const auto specials = at["special_tokens"];
      specials.expect_object();
      const auto single = at["single"];
      for (std::size_t i = 0; i < single.size(); ++i) {
        const auto item = single.at(i);
        item.expect_object();
        if (const auto special = item.find("SpecialToken")) {
          const std::string name = (*special)["id"].string();
          const auto entry = specials.find(name);
          if (!entry)
            (*special)["id"].fail(concat('"', name, "\" is not in post_processor.special_tokens"));
          const auto ids = (*entry)["ids"];
          std::vector<std::int32_t> list;
          for (std::size_t k = 0; k < ids.size(); ++k) {
            list.push_back(static_cast<std::int32_t>(ids.at(k).integer(0, INT32_MAX)));
          }
          out.items_.push_back({false, std::move(list), concat(at.source(), ": ", ids.path())});
        } else if (const auto sequence = item.find("Sequence")) {
          const std::string id = (*sequence)["id"].string();
          if (id != "A")
            (*sequence)["id"].unsupported(
                "only sequence \"A\" is supported (dissect encodes single texts)");
          out.items_.push_back({true, {}, {}});
        } else {
          item.fail("must hold \"SpecialToken\" or \"Sequence\"");
        }
      }
    } else if (type == "Sequence") {
      out.kind_ = Kind::sequence;
      const auto list = at["processors"];
      for (std::size_t i = 0; i < list.size(); ++i) out.children_.push_back(from_json(list.at(i)));
    } else {
      at["type"].unsupported(concat('"', type, "\" is not supported"));
    }
    return out;
  }

  /// The ids added before and after the text when add_special_tokens is on.
  void wrap(std::vector<std::int32_t>& ids, std::vector<Span>* offsets) const {
    switch (kind_) {
      case Kind::byte_level:
        return;
      case Kind::sequence:
        for (const auto& child : children_) child.wrap(ids, offsets);
        return;
      case Kind::template_processing: {
        std::vector<std::int32_t> out;
        std::vector<Span> out_offsets;
        out.reserve(ids.size() + 4);
        for (const auto& item : items_) {
          if (item.sequence) {
            out.insert(out.end(), ids.begin(), ids.end());
            if (offsets) out_offsets.insert(out_offsets.end(), offsets->begin(), offsets->end());
          } else {
            out.insert(out.end(), item.ids.begin(), item.ids.end());
            if (offsets) out_offsets.insert(out_offsets.end(), item.ids.size(), Span{});
          }
        }
        ids = std::move(out);
        if (offsets) *offsets = std::move(out_offsets);
        return;
      }
    }
  }

  /// wrap() as it happens: calls `special(id)` for each id added before the text, then `body()`
  /// (which encodes the text), then `special(id)` for each id after it, so that a streaming
  /// encode never holds the ids.
  void around(detail::FunctionRef<void()> body,
              detail::FunctionRef<void(std::int32_t)> special) const {
    switch (kind_) {
      case Kind::byte_level:
        return body();
      case Kind::sequence:
        return around_children(children_.size(), body, special);
      case Kind::template_processing:
        for (const auto& item : items_) {
          if (item.sequence) {
            body();
          } else {
            for (const std::int32_t id : item.ids) special(id);
          }
        }
        return;
    }
  }

  /// The ids a template puts first (BOS), for tools that want to name it.
  std::vector<std::int32_t> leading_ids() const {
    std::vector<std::int32_t> out;
    if (kind_ == Kind::template_processing) {
      for (const auto& item : items_) {
        if (item.sequence) break;
        out.insert(out.end(), item.ids.begin(), item.ids.end());
      }
    }
    for (const auto& child : children_) {
      const auto more = child.leading_ids();
      out.insert(out.end(), more.begin(), more.end());
    }
    return out;
  }

  /// Calls `check(id, where)` for each id a template adds; `where` names the file and the JSON
  /// path of its list ("t.json: post_processor.special_tokens.<s>.ids"), for the tokenizer to
  /// refuse an id its vocabulary lacks (reliability.md row 122).
  template <class Check>
  void for_each_special_id(Check&& check) const {
    for (const auto& item : items_) {
      for (std::size_t k = 0; k < item.ids.size(); ++k)
        check(item.ids[k], std::string_view(concat(item.where, '[', k, ']')));
    }
    for (const auto& child : children_) child.for_each_special_id(check);
  }

  /// Whether ByteLevel's offset trimming is on (Hugging Face trims spaces off token offsets).
  bool trims_offsets() const {
    if (kind_ == Kind::byte_level) return trim_offsets_;
    for (const auto& child : children_) {
      if (child.trims_offsets()) return true;
    }
    return false;
  }

 private:
  // Children wrap in order, the first innermost: child k - 1 wraps what children 0..k-2 gave.
  void around_children(std::size_t k, detail::FunctionRef<void()> body,
                       detail::FunctionRef<void(std::int32_t)> special) const {
    if (k == 0) return body();
    children_[k - 1].around([&] { around_children(k - 1, body, special); }, special);
  }

  enum class Kind { byte_level, template_processing, sequence };
  struct Item {
    bool sequence = false;
    std::vector<std::int32_t> ids;
    std::string where;  ///< the file and the JSON path of `ids`, for messages
  };
  Kind kind_ = Kind::sequence;
  bool trim_offsets_ = false;
  std::vector<Item> items_;
  std::vector<PostProcessor> children_;
};

}  // namespace dissect::text
