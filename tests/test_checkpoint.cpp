// Tests for dissect/io/checkpoint.hpp: a single file, a directory, a sharded checkpoint through
// its index; and the ways an index or a shard can be wrong (reliability row 25), each naming
// the index or the shard file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dissect/io/checkpoint.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_checkpoint {

class CheckpointTest : public ::testing::Test {
 protected:
  CheckpointTest() {
    std::filesystem::create_directory(directory_ / "sharded");
    save_safetensors(shard(1), std::vector<SaveEntry>{{"wte.weight", wte_}, {"h.0.bias", bias_}});
    save_safetensors(shard(2), std::vector<SaveEntry>{{"h.1.bias", bias_, SaveDtype::bf16}},
                     {{"shard", "two"}});
  }

  std::filesystem::path shard(int i) const {
    return directory_ / "sharded" / ("model-0000" + std::to_string(i) + "-of-00002.safetensors");
  }
  std::filesystem::path write_index(const std::string& text) const {
    const auto path = directory_ / "sharded" / "model.safetensors.index.json";
    testing::write_file(path, std::as_bytes(std::span(text)));
    return path;
  }
  std::filesystem::path good_index() const {
    return write_index(R"({"metadata": {"total_size": 40, "format": "pt"}, "weight_map": {
        "wte.weight": "model-00001-of-00002.safetensors",
        "h.0.bias": "model-00001-of-00002.safetensors",
        "h.1.bias": "model-00002-of-00002.safetensors"}})");
  }

  /// Asserts that opening `path` throws Expected whose message holds every one of `parts`.
  template <class Expected>
  void expect_refused(const std::filesystem::path& path, std::vector<std::string> parts) {
    try {
      Checkpoint checkpoint(path);
      ADD_FAILURE() << "opened " << path;
    } catch (const Expected& error) {
      for (const std::string& part : parts) EXPECT_TRUE(testing::contains(error.what(), part));
    } catch (const std::exception& error) {
      ADD_FAILURE() << "wrong exception type; message: " << error.what();
    }
  }

  testing::TemporaryDirectory directory_;
  const Tensor<float, 2> wte_{{3, 2}, {1, 2, 3, 4, 5, 6}};
  const Tensor<float, 1> bias_{{2}, {0.5f, -0.25f}};
};

TEST_F(CheckpointTest, ASingleFileOrItsDirectory) {
  const auto single = directory_ / "model.safetensors";
  save_safetensors(single, std::vector<SaveEntry>{{"w", wte_}}, {{"format", "pt"}});
  for (const auto& path : {single, directory_.path()}) {
    const Checkpoint checkpoint(path);
    EXPECT_EQ(checkpoint.path(), single);
    EXPECT_EQ(checkpoint.shards().size(), 1u);
    EXPECT_EQ(checkpoint.tensor_names(), std::vector<std::string>{"w"});
    EXPECT_EQ(checkpoint.metadata().at("format"), "pt");
    EXPECT_TENSOR_EQ((checkpoint.load<float, 2>("w")), wte_);
    EXPECT_EQ(checkpoint.view<2>("w")(2, 1), 6.0f);
  }
}

TEST_F(CheckpointTest, ShardsThroughTheIndexOrItsDirectory) {
  const auto index = good_index();
  for (const auto& path : {index, directory_ / "sharded"}) {
    const Checkpoint checkpoint(path);
    EXPECT_EQ(checkpoint.path(), index);
    EXPECT_EQ(checkpoint.shards().size(), 2u);
    EXPECT_EQ(checkpoint.tensor_names(),
              (std::vector<std::string>{"h.0.bias", "h.1.bias", "wte.weight"}));
    EXPECT_EQ(checkpoint.metadata().at("total_size"), "40") << "numbers as their JSON text";
    EXPECT_EQ(checkpoint.metadata().at("format"), "pt");
    EXPECT_TRUE(checkpoint.contains("h.1.bias"));
    EXPECT_FALSE(checkpoint.contains("h.2.bias"));
    EXPECT_EQ(checkpoint.shard_of("h.1.bias").path(), shard(2));
    EXPECT_EQ(checkpoint.shard_of("wte.weight").path(), shard(1));
    EXPECT_EQ(checkpoint.info("h.1.bias").dtype, "BF16");
    EXPECT_TENSOR_EQ((checkpoint.load<float, 2>("wte.weight")), wte_);
    EXPECT_TENSOR_EQ((checkpoint.load<double, 1>("h.1.bias")),
                     (Tensor<double, 1>({2}, {0.5, -0.25})));
    Tensor<float, 1> target({2});
    load_into(checkpoint, "h.0.bias", target.view());
    EXPECT_TENSOR_EQ(target, bias_);
  }
}

TEST_F(CheckpointTest, ErrorsNameTheShardOrTheCheckpoint) {
  const Checkpoint checkpoint(good_index());
  EXPECT_THROW_WITH(checkpoint.info("h.9.bias"), Error,
                    checkpoint.path().string() + " has no tensor \"h.9.bias\"");
  EXPECT_THROW_WITH((checkpoint.load<float, 2>("h.1.bias")), ShapeError,
                    "tensor \"h.1.bias\" in " + shard(2).string() + " has shape [2] (rank 1)");
  EXPECT_THROW_WITH(checkpoint.view<1>("h.1.bias"), Error, shard(2).string() + " is BF16");
}

TEST_F(CheckpointTest, CorruptIndexes) {
  const std::string index = (directory_ / "sharded" / "model.safetensors.index.json").string();
  expect_refused<FormatError>(write_index("{\"weight_map\": "), {index, "is not valid JSON"});
  expect_refused<FormatError>(write_index("[]"), {index, "has no \"weight_map\" object"});
  expect_refused<FormatError>(write_index(R"({"weight_map": [1]})"),
                              {index, "has no \"weight_map\" object"});
  expect_refused<FormatError>(write_index(R"({"weight_map": {"w": 1}})"),
                              {index, "weight_map \"w\" is the number 1, not a file name"});
  expect_refused<FormatError>(
      write_index(R"({"weight_map": {"w": "../model.safetensors"}})"),
      {index, "names \"../model.safetensors\", not a file beside the index"});
  expect_refused<FormatError>(write_index(R"({"weight_map": {"w": ".."}})"),
                              {"not a file beside the index"});
  expect_refused<FormatError>(
      write_index(R"({"weight_map": {"w": "model-00001-of-00002.safetensors",)"
                  R"( "w": "model-00002-of-00002.safetensors"}})"),
      {index, "key \"w\" appears twice (in \"weight_map\")"});
  expect_refused<FormatError>(write_index(R"({"metadata": 3, "weight_map": {}})"),
                              {index, "\"metadata\" is the number 3, not an object"});
  expect_refused<FormatError>(
      write_index(R"({"weight_map": {"h.1.bias": "model-00001-of-00002.safetensors"}})"),
      {index,
       "weight_map puts \"h.1.bias\" in " + shard(1).string() + ", which has no such tensor"});
}

TEST_F(CheckpointTest, AShardNameWithANulOrATensorTheIndexLeavesOutIsRefused) {  // row 134
  const std::string index = (directory_ / "sharded" / "model.safetensors.index.json").string();
  // The system ends a name at a NUL: this one would open model-00001-of-00002.safetensors.
  expect_refused<FormatError>(
      write_index(R"({"weight_map": {"wte.weight": "model-00001-of-00002.safetensors\u0000x"}})"),
      {index,
       "weight_map \"wte.weight\" names \"model-00001-of-00002.safetensors\\u0000x\", "
       "not a file beside the index"});
  // Shard 1 holds wte.weight and h.0.bias; an index that lists only wte.weight leaves h.0.bias
  // out (transformers loads every tensor of a shard, so it would be in the model there).
  expect_refused<FormatError>(
      write_index(R"({"weight_map": {"wte.weight": "model-00001-of-00002.safetensors",)"
                  R"( "h.1.bias": "model-00002-of-00002.safetensors"}})"),
      {index, shard(1).string() + " holds \"h.0.bias\", which the index's weight_map does not "
                                  "list"});
  // A tensor held by two shards, the index putting it in one: the other copy is refused too.
  save_safetensors(shard(2), std::vector<SaveEntry>{{"h.1.bias", bias_}, {"h.0.bias", bias_}});
  expect_refused<FormatError>(good_index(),
                              {index, shard(2).string() + " holds \"h.0.bias\", which the index's "
                                                          "weight_map puts in "
                                                          "model-00001-of-00002.safetensors"});
}

TEST_F(CheckpointTest, MissingOrCorruptShards) {
  const auto index = write_index(R"({"weight_map": {"w": "model-00003-of-00003.safetensors"}})");
  const auto absent = directory_ / "sharded" / "model-00003-of-00003.safetensors";
  expect_refused<Error>(index, {"cannot open " + absent.string() + ": No such file or directory"});
  testing::write_file(absent, testing::safetensors_bytes("{\"w\": 1}"));
  expect_refused<FormatError>(index, {absent.string(), "tensor \"w\" is the number 1"});
}

TEST_F(CheckpointTest, DirectoriesWithoutOneObviousFile) {
  const auto empty = directory_ / "empty";
  std::filesystem::create_directory(empty);
  expect_refused<Error>(empty, {empty.string(), "and no other safetensors file"});
  const auto two = directory_ / "two";
  std::filesystem::create_directory(two);
  save_safetensors(two / "a.safetensors", std::vector<SaveEntry>{{"w", wte_}});
  save_safetensors(two / "b.safetensors", std::vector<SaveEntry>{{"w", wte_}});
  expect_refused<Error>(two, {"more than one candidate", "a.safetensors", "b.safetensors"});
  std::filesystem::remove(two / "b.safetensors");
  EXPECT_EQ(Checkpoint(two).path(), two / "a.safetensors") << "the only file is the one";
}

}  // namespace test_checkpoint
}  // namespace dissect
