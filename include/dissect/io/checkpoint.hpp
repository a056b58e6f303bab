// dissect/io/checkpoint.hpp — a checkpoint as Hugging Face publishes one: a single
// model.safetensors, or shards model-00001-of-00002.safetensors … listed by
// model.safetensors.index.json ({"metadata": {..}, "weight_map": {name: shard file}}).
//
// Checkpoint opens any of these (or the directory holding them) and finds each tensor in its
// shard, so callers ask for names and never for files. Every shard is opened and checked up
// front, and the index must agree with the shards: errors name the index or the shard file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/detail/mapped_file.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

class Checkpoint {
 public:
  /// Opens `path`: a .safetensors file; an index .json; or a directory holding
  /// model.safetensors.index.json, else model.safetensors, else exactly one
  /// *.safetensors.index.json or (with no index) exactly one *.safetensors.
  /// @throws Error naming the directory if it holds none of these or several; Error or
  ///         FormatError from SafetensorsFile naming a shard; FormatError naming the index if
  ///         it is not valid JSON, has no "weight_map" object, names a shard by anything but a
  ///         file name beside it (a NUL byte included), puts a tensor in a shard that lacks
  ///         it, or leaves out a tensor a shard holds.
  explicit Checkpoint(const std::filesystem::path& path);
  /// A checkpoint of no shards, tensors or metadata that stands for `path`: what
  /// DetectedCheckpoint (io/open_model.hpp) holds for a file another reader owns, a GGUF file,
  /// so that path() still names it. Opens nothing.
  static Checkpoint without_tensors(std::filesystem::path path);

  /// The file opened: the .safetensors or the index (a directory resolved to one of them).
  const std::filesystem::path& path() const { return path_; }
  /// A single file's "__metadata__", or an index's "metadata" (values that are not strings, like
  /// "total_size", as their JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The files, in the order of their names.
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

  /// Every tensor's name, sorted.
  std::vector<std::string> tensor_names() const;
  bool contains(std::string_view name) const { return shard_index_.contains(name); }
  /// The shard holding tensor `name`. @throws Error naming the checkpoint and `name` if absent.
  const SafetensorsFile& shard_of(std::string_view name) const;
  /// As SafetensorsFile's, in the tensor's shard (errors name the shard file).
  const TensorInfo& info(std::string_view name) const { return shard_of(name).info(name); }
  template <class Scalar, std::size_t Rank>
  Tensor<Scalar, Rank> load(std::string_view name) const {
    return shard_of(name).template load<Scalar, Rank>(name);
  }
  template <std::size_t Rank, class Scalar = float>
  ConstTensorView<Scalar, Rank> view(std::string_view name) const {
    return shard_of(name).template view<Rank, Scalar>(name);
  }

 private:
  Checkpoint() = default;
  void open_index();

  std::filesystem::path path_;
  std::vector<SafetensorsFile> shards_;
  detail::TensorIndex shard_index_;  ///< tensor → position in shards_
  std::map<std::string, std::string> metadata_;
};

/// load_into on the tensor's shard. @throws as SafetensorsFile's load_into, or as shard_of.
template <class Scalar, std::size_t Rank>
void load_into(const Checkpoint& checkpoint, std::string_view name,
               TensorView<Scalar, Rank> target) {
  load_into(checkpoint.shard_of(name), name, target);
}

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// The file a checkpoint directory stands for (see Checkpoint's constructor).
inline std::filesystem::path resolve_checkpoint(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(path, error)) return path;
  for (const char* preferred : {"model.safetensors.index.json", "model.safetensors"}) {
    if (std::filesystem::is_regular_file(path / preferred, error)) return path / preferred;
  }
  std::vector<std::filesystem::path> indexes, files;
  for (const auto& item : std::filesystem::directory_iterator(path, error)) {
    const std::string name = item.path().filename().string();
    if (name.ends_with(".safetensors.index.json")) indexes.push_back(item.path());
    if (name.ends_with(".safetensors")) files.push_back(item.path());
  }
  if (error) {
    throw Error(concat("Checkpoint: cannot list ", path.string(), ": ", error.message()));
  }
  if (indexes.size() == 1) return indexes.front();
  if (indexes.empty() && files.size() == 1) return files.front();
  std::string found;
  for (const auto& file : indexes.empty() ? files : indexes) {
    found += concat(found.empty() ? "" : ", ", file.filename().string());
  }
  throw Error(concat("Checkpoint: ", path.string(),
                     " holds no model.safetensors.index.json or model.safetensors",
                     found.empty() ? ", and no other safetensors file"
                                   : concat(", and more than one candidate: ", found)));
}

}  // namespace detail

inline Checkpoint::Checkpoint(const std::filesystem::path& path)
    : path_(detail::resolve_checkpoint(path)) {
  if (path_.extension() == ".json") {
    open_index();
  } else {
    shards_.push_back(SafetensorsFile(path_));
    for (const TensorInfo& tensor : shards_.front().tensors()) shard_index_.emplace(tensor.name, 0);
    metadata_ = shards_.front().metadata();
  }
}

inline Checkpoint Checkpoint::without_tensors(std::filesystem::path path) {
  Checkpoint none;
  none.path_ = std::move(path);
  return none;
}

inline void Checkpoint::open_index() {
  const std::string where = detail::concat("Checkpoint: ", path_.string());
  const detail::MappedFile file(path_, "Checkpoint");
  if (file.bytes().size() > static_cast<std::size_t>(SafetensorsFile::max_header_bytes)) {
    throw FormatError(detail::concat(where, ": the index is ", file.bytes().size(),
                                     " bytes, beyond the limit of ",
                                     format_count(SafetensorsFile::max_header_bytes)));
  }
  const std::string_view text(reinterpret_cast<const char*>(file.bytes().data()),
                              file.bytes().size());
  const nlohmann::json index = detail::parse_json_strictly(text, where);
  const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || weight_map == index.end() || !weight_map->is_object()) {
    throw FormatError(detail::concat(where, ": the index has no \"weight_map\" object"));
  }
  if (const auto metadata = index.find("metadata"); metadata != index.end()) {
    if (!metadata->is_object()) {
      throw FormatError(detail::concat(where, ": \"metadata\" is ",
                                       detail::describe_json(*metadata), ", not an object"));
    }
    for (const auto& [key, value] : metadata->items()) {
      metadata_.emplace(key, value.is_string() ? value.get<std::string>() : value.dump());
    }
  }
  // Shard file name → the tensors the index puts there.
  std::map<std::string, std::vector<std::string>> wanted;
  for (const auto& [name, shard] : weight_map->items()) {
    const std::string at = detail::concat(where, ": weight_map \"", name, "\"");
    if (!shard.is_string()) {
      throw FormatError(
          detail::concat(at, " is ", detail::describe_json(shard), ", not a file name"));
    }
    const std::string file_name = shard.get<std::string>();
    // A NUL ends the name for the system: "model.safetensors\0x" would open model.safetensors.
    if (file_name.empty() || file_name == "." || file_name == ".." ||
        file_name.find('/') != std::string::npos || file_name.find('\0') != std::string::npos) {
      throw FormatError(detail::concat(at, " names ", detail::quoted_name(file_name),
                                       ", not a file beside the index"));
    }
    wanted[file_name].push_back(name);
  }
  for (const auto& [file_name, names] : wanted) {
    shards_.push_back(SafetensorsFile(path_.parent_path() / file_name));
    const SafetensorsFile& shard = shards_.back();
    for (const std::string& name : names) {
      if (!shard.contains(name)) {
        throw FormatError(detail::concat(where, ": weight_map puts \"", name, "\" in ",
                                         shard.path().string(), ", which has no such tensor"));
      }
      shard_index_.insert_or_assign(name, shards_.size() - 1);
    }
    // The converse: a tensor of the shard the index does not put there. transformers loads
    // every tensor of every shard, so it would be part of the model there and silently absent
    // here (or, if the index puts its name in another shard, one of two copies).
    if (shard.tensors().size() != names.size()) {
      for (const TensorInfo& tensor : shard.tensors()) {
        const auto listed = weight_map->find(tensor.name);
        if (listed == weight_map->end() || listed->get<std::string>() != file_name) {
          throw FormatError(detail::concat(
              where, ": ", shard.path().string(), " holds ", detail::quoted_name(tensor.name),
              listed == weight_map->end()
                  ? ", which the index's weight_map does not list"
                  : detail::concat(", which the index's weight_map puts in ",
                                   listed->get<std::string>())));
        }
      }
    }
  }
}

inline std::vector<std::string> Checkpoint::tensor_names() const {
  return detail::names_of(shard_index_);
}

inline const SafetensorsFile& Checkpoint::shard_of(std::string_view name) const {
  return shards_[detail::find_tensor(shard_index_, name, "Checkpoint", path_)];
}

}  // namespace dissect
