// Tests for tools/dissect/serve_request.hpp: how `dissect serve` reads a /v1/completions body
// (reliability.md row 113; the server itself is test_serve.cpp) and how it finds stop sequences
// in text that arrives a piece at a time.
#include "tools/dissect/serve_request.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dissect::tools {
namespace test_serve_request {

/// Pushes every piece, then finishes; returns what would have been sent, in order.
std::string scan(std::vector<std::string> stops, const std::vector<std::string>& pieces,
                 bool* stopped = nullptr) {
  StopScanner scanner(std::move(stops));
  std::string sent;
  for (const std::string& piece : pieces) sent += scanner.push(piece);
  sent += scanner.finish();
  if (stopped) *stopped = scanner.stopped();
  return sent;
}

TEST(StopScanner, AStopAcrossPiecesIsFoundAndNothingOfItIsSent) {
  bool stopped = false;
  // "END" arrives as "E", "N", "D": the first two are held back, then dropped.
  EXPECT_EQ(scan({"END"}, {"ab", "cE", "N", "D", "xyz"}, &stopped), "abc");
  EXPECT_TRUE(stopped);
  StopScanner scanner({"END"});
  EXPECT_EQ(scanner.push("abE"), "ab");  // "E" could start "END"
  EXPECT_EQ(scanner.push("N"), "");
  EXPECT_EQ(scanner.push("x"), "ENx");  // it did not: released
  EXPECT_FALSE(scanner.stopped());
}

TEST(StopScanner, TheEarliestOfSeveralStopsWinsAndTextWithoutOneIsWhole) {
  EXPECT_EQ(scan({"zz", "b"}, {"a", "bzz"}), "a");
  EXPECT_EQ(scan({"\n\n", "."}, {"one\n", "two", "."}), "one\ntwo");
  bool stopped = true;
  EXPECT_EQ(scan({"END"}, {"EN", "E", "EN"}, &stopped), "ENEEN");  // held back, then finished
  EXPECT_FALSE(stopped);
  EXPECT_EQ(scan({}, {"a", "", "b"}), "ab");
  EXPECT_EQ(scan({"x"}, {"x"}), "");  // a completion may stop before its first character
}

TEST(StopScanner, NothingIsTakenAfterTheStop) {
  StopScanner scanner({"."});
  EXPECT_EQ(scanner.push("a.b"), "a");
  EXPECT_TRUE(scanner.stopped());
  EXPECT_EQ(scanner.push("more"), "");
  EXPECT_EQ(scanner.finish(), "");
}

TEST(CompletionRequest, FieldsAndDefaults) {
  const auto r = parse_completion_request(
      R"({"model": "m", "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5,
          "top_k": 3, "min_p": 0.1, "repetition_penalty": 1.2, "frequency_penalty": -0.5,
          "presence_penalty": 0.25, "seed": 18446744073709551615, "stop": "\n",
          "stream": true, "n": 1, "echo": false, "logprobs": null, "user": "ignored"})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt_text, "hi");
  EXPECT_FALSE(r.prompt_ids);
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0);
  EXPECT_EQ(r.sampling.top_p, 0.5);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.min_p, 0.1);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.2);
  EXPECT_EQ(r.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(r.sampling.presence_penalty, 0.25);
  EXPECT_EQ(r.seed, 18446744073709551615u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream);
  // OpenAI's defaults, and null as absent.
  const auto d = parse_completion_request(R"({"prompt": [0, 5], "temperature": null})");
  EXPECT_EQ(d.prompt_ids, (std::vector<index_t>{0, 5}));
  EXPECT_EQ(d.max_tokens, 16);
  EXPECT_EQ(d.sampling.temperature, 1.0);
  EXPECT_EQ(d.seed, 0u);
  EXPECT_FALSE(d.stream);
  EXPECT_TRUE(d.stop.empty());
}

TEST(CompletionRequestErrors, EachNamesTheFieldAndTheValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "the request body is not valid JSON: "},
      {"\"hi\"", "the request body must be a JSON object (got \"hi\")"},
      {R"({"prompt": []})", "prompt must be a string or an array of token ids (got [])"},
      {R"({"prompt": [1, 2.5]})", "prompt must be a string or an array of token ids"},
      {R"({"prompt": [[1]]})", "a batch of prompts is not supported"},
      {R"({"prompt": [18446744073709551615]})",
       "prompt: token 0 is 18446744073709551615, beyond int64"},
      {R"({"prompt": "a", "model": 3})", "model must be a string (got 3)"},
      {R"({"prompt": "a", "max_tokens": 1.0})", "max_tokens must be an integer (got 1.0)"},
      {R"({"prompt": "a", "top_p": 1.5})", "completions: top_p must be in (0, 1] (got 1.5)"},
      {R"({"prompt": "a", "presence_penalty": true})",
       "presence_penalty must be a number (got true)"},
      {R"({"prompt": "a", "seed": 1.5})",
       "seed must be an integer in [0, 18446744073709551615] (got 1.5)"},
      {R"({"prompt": "a", "stop": ["a", 1]})", "stop must be a non-empty string or an array"},
      {R"({"prompt": "a", "best_of": 3})", "best_of: only 1 is supported"},
      {R"({"prompt": "a", "n": 0})", "n must be in [1, "},
      {R"({"prompt": "a", "suffix": "z"})", "suffix: not supported"},
  };
  for (const auto& [body, message] : cases) {
    try {
      (void)parse_completion_request(body);
      ADD_FAILURE() << body << " was accepted";
    } catch (const ConfigError& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos)
          << body << " gave " << error.what();
    }
  }
}

}  // namespace test_serve_request
}  // namespace dissect::tools
