// Tests for the examples' expert-load accounting (train_gpt --experts): the shares of the routed
// slots per layer and expert over a report interval, computed by hand from made-up routings.
// ExpertLoad reads only cache.layers[l].ffn.route's assigned, tokens and top_k, so a stand-in
// cache of those fields is all it needs.
#include "common/expert_load.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace {

using dissect::index_t;
using dissect::examples::ExpertLoad;

struct Route {
  index_t tokens = 0, top_k = 0;
  std::vector<index_t> assigned;
};
struct Ffn {
  Route route;
};
struct Layer {
  Ffn ffn;
};
struct Cache {
  std::vector<Layer> layers;
};

// Two layers, three experts, 4 tokens top-2 (8 slots a layer and step).
Cache step(std::vector<index_t> layer0, std::vector<index_t> layer1) {
  return {{{{{4, 2, std::move(layer0)}}}, {{{4, 2, std::move(layer1)}}}}};
}

TEST(ExpertLoad, SharesOfTheIntervalsSlotsPerLayerAndExpert) {
  ExpertLoad load(2, 3);
  load.add(step({4, 4, 0}, {2, 2, 4}));
  load.add(step({2, 6, 0}, {8, 0, 0}));
  load.report(2);
  // Layer 0: (4 + 2, 4 + 6, 0) / 16; layer 1: (2 + 8, 2 + 0, 4 + 0) / 16.
  const std::vector<double> first = {6.0 / 16, 10.0 / 16, 0, 10.0 / 16, 2.0 / 16, 4.0 / 16};
  ASSERT_EQ(load.rows().size(), 1u);
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_DOUBLE_EQ(load.rows()[0][i], first[i]);
  // Expert 0's mean over the layers: (6/16 + 10/16) / 2 = 0.5.
  EXPECT_DOUBLE_EQ(load.mean_series(0).at(0), 0.5);

  // The next interval starts from nothing.
  load.add(step({0, 0, 8}, {0, 8, 0}));
  load.report(3);
  EXPECT_EQ(load.steps(), (std::vector<double>{2, 3}));
  EXPECT_EQ(load.series(0, 2), (std::vector<double>{0, 1}));
  EXPECT_EQ(load.series(1, 1), (std::vector<double>{2.0 / 16, 1}));
}

TEST(ExpertLoad, AnIntervalWithoutStepsReportsZeros) {
  ExpertLoad load(1, 2);
  load.report(0);
  EXPECT_EQ(load.rows().at(0), (std::vector<double>{0, 0}));
}

}  // namespace
