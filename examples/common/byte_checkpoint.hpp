// examples/common/byte_checkpoint.hpp — a train_gpt checkpoint opened as the examples that start
// from one (lora_finetune, dpo_fortunes) need it: the GPT-2 model, the byte vocabulary its
// metadata records, and that metadata, with every failure named after --model.
//
// NOT part of the dissect library: example-only.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>

#include "common/cli.hpp"
#include "dissect/core/error.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/models/decoder_model.hpp"
#include "tools/common/byte_vocab.hpp"

namespace dissect::examples {

/// A byte-level GPT-2 read from a train_gpt checkpoint.
struct ByteCheckpoint {
  GPT2Model<float> model;
  tools::ByteVocab vocab;
  index_t file_bytes = 0;  ///< the checkpoint's size on disk, every shard
  std::map<std::string, std::string> metadata;
};

/// Reads --model. `purpose` ends the message for a checkpoint without a byte vocabulary (what
/// the example does with train_gpt's models). @throws UsageError naming --model for a file that
/// cannot be read, that holds no GPT-2, or no byte vocabulary, or one that does not fit it.
inline ByteCheckpoint load_byte_checkpoint(const std::string& path, const std::string& purpose) {
  try {
    const Checkpoint checkpoint(path);
    auto vocab = tools::ByteVocab::from_metadata(checkpoint.metadata(), path);
    if (!vocab) {
      throw UsageError("--model: " + path + " records no byte vocabulary (\"" +
                       tools::vocab_bytes_key + "\" in its metadata): " + purpose);
    }
    auto model = load_model<GPT2Model<float>>(checkpoint);
    if (vocab->size() != model.config().vocab) {
      throw UsageError("--model: " + path + " has a vocabulary of " +
                       std::to_string(vocab->size()) +
                       " bytes for a model of V = " + std::to_string(model.config().vocab));
    }
    index_t bytes = 0;
    for (const auto& shard : checkpoint.shards()) {
      bytes += static_cast<index_t>(std::filesystem::file_size(shard.path()));
    }
    return {std::move(model), std::move(*vocab), bytes, checkpoint.metadata()};
  } catch (const Error& error) {
    throw UsageError(std::string("--model: ") + error.what());
  }
}

}  // namespace dissect::examples
