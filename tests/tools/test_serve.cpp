// tests/tools/test_serve.cpp — `dissect serve` from the outside: the built program started on a
// free port of 127.0.0.1, asked over HTTP with cpp-httplib's client, its answers checked against
// the library's own generate() on the same model (tokens, then their text), and against a chain
// `dissect generate` was already tested to give. Bad requests get 400 with the library's message
// and the server keeps serving (reliability.md row 113); SIGTERM stops it with status 0.
//
//   test_serve DISSECT_PROGRAM MODEL_DIR EOS_MODEL_DIR CHAT_MODEL_DIR
//
// MODEL_DIR is the GPT-2 fixture (V = 97, context 24) beside char_tokenizer.json, which names no
// EOS; EOS_MODEL_DIR is the same with a tokenizer_config.json that makes <|endoftext|> (96) EOS.
// CHAT_MODEL_DIR is tests/tools/chat-llama: the tiny LLaMA with a character tokenizer and a
// ChatML-style chat template (BOS written by the template, <|end|> an end-of-turn token at id 26).
// Nothing here can hang: every request has a connect and a read timeout, the server is killed with
// the test (PR_SET_PDEATHSIG), and an alarm ends the whole program after 100 s.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dissect/io/open_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/text/decode_stream.hpp"
#include "dissect/text/tokenizer_files.hpp"

// After dissect's headers: httplib.h brings in <resolv.h>, whose macro _res breaks Eigen's
// matrix products (a parameter of theirs is named _res).
#include <httplib.h>

namespace {

using dissect::index_t;
using nlohmann::json;

std::string program;               // argv[1]
std::filesystem::path model;       // argv[2]
std::filesystem::path eos_model;   // argv[3]
std::filesystem::path chat_model;  // argv[4]
constexpr index_t context = 24;    // the fixture's; its V is 97

/// A running `dissect serve MODEL --port 0`, killed when it goes out of scope.
class ServerProcess {
 public:
  explicit ServerProcess(const std::filesystem::path& dir = model) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      execl(program.c_str(), program.c_str(), "serve", dir.c_str(), "--port", "0", "--threads", "4",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];
    // The first line says where it listens; the model loads first, so allow it 30 s.
    const std::string line = read_line(std::chrono::seconds(30));
    const std::string prefix = "listening on http://127.0.0.1:";
    if (line.rfind(prefix, 0) != 0) throw std::runtime_error("unexpected first line: " + line);
    port_ = std::stoi(line.substr(prefix.size()));
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(out_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }

  /// A client with timeouts: 5 s to connect, 60 s to read (the requests queue behind one
  /// another on a loaded machine).
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(std::chrono::seconds(5));
    c.set_read_timeout(std::chrono::seconds(60));
    c.set_write_timeout(std::chrono::seconds(5));
    return c;
  }

  /// Sends SIGTERM and waits up to 20 s: the exit status, or nullopt if it did not exit.
  std::optional<int> terminate() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return std::nullopt;
  }

  /// The next line of the server's stdout, waiting at most `limit`.
  std::string read_line(std::chrono::milliseconds limit) {
    std::string line;
    const auto end = std::chrono::steady_clock::now() + limit;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      pollfd p{out_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return line;
      char c = 0;
      if (read(out_, &c, 1) != 1 || c == '\n') return line;
      line += c;
    }
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  int port_ = 0;
};

/// What the library's generate() gives for the same request: the ids (through `eos`, where the
/// server stops, if given), and their text as `dissect generate` decodes it.
struct Expected {
  std::vector<index_t> ids;
  std::string text;
};

Expected expected(const std::vector<index_t>& prompt, index_t max_tokens,
                  const dissect::SamplingOptions& sampling, std::uint64_t seed,
                  std::optional<index_t> eos = std::nullopt) {
  static const auto gpt2 = dissect::open_model<dissect::GPT2Model<float>>(model);
  static const auto tokenizer = dissect::text::load_tokenizer(model);
  Expected e;
  (void)dissect::generate(gpt2, prompt,
                          {.max_new_tokens = max_tokens, .sampling = sampling, .seed = seed},
                          [&](index_t id) { e.ids.push_back(id); });
  dissect::text::DecodeStream stream(tokenizer);
  for (const index_t id : prompt) (void)stream.push(static_cast<std::int32_t>(id));
  for (std::size_t i = 0; i < e.ids.size(); ++i) {
    if (e.ids[i] == eos) {
      e.ids.resize(i + 1);
      break;
    }
    e.text += stream.push(static_cast<std::int32_t>(e.ids[i]));
  }
  e.text += stream.finish();
  return e;
}

std::vector<index_t> encode(const std::string& text) {
  static const auto tokenizer = dissect::text::load_tokenizer(model);
  std::vector<index_t> ids;
  for (const std::int32_t id : tokenizer.encode(text)) ids.push_back(id);
  return ids;
}

json post(const ServerProcess& server, const json& body, int expected_status = 200,
          const char* path = "/v1/completions") {
  auto client = server.client();
  const auto res = client.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no response: " << httplib::to_string(res.error());
    return json();
  }
  EXPECT_EQ(res->status, expected_status) << res->body;
  return json::parse(res->body);
}

/// The events of a streamed completion: every "data: {…}" parsed; true in `done` if the stream
/// ended with "data: [DONE]".
std::vector<json> stream_events(const ServerProcess& server, json body, bool& done,
                                const char* path = "/v1/completions") {
  body["stream"] = true;
  auto client = server.client();
  const auto res = client.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response";
  if (!res) return {};
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events;
  done = false;
  std::size_t at = 0;
  while (at < res->body.size()) {
    const std::size_t end = res->body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string event = res->body.substr(at, end - at);
    at = end + 2;
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "an event after [DONE]";
    if (event == "data: [DONE]") {
      done = true;
    } else {
      events.push_back(json::parse(event.substr(6)));
    }
  }
  return events;
}

/// A suite whose tests share one server on the model in *dir.
template <const std::filesystem::path* dir>
class SharedServer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess(*dir); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static inline ServerProcess* server_ = nullptr;
};
using Serve = SharedServer<&model>;

TEST_F(Serve, GreedyCompletionIsTheLibrarysGenerate) {
  const auto prompt = encode("hello");
  const Expected want = expected(prompt, 8, {.temperature = 0}, 0);
  const json got =
      post(*server_,
           {{"model", "my-model"}, {"prompt", "hello"}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(got["object"], "text_completion");
  EXPECT_EQ(got["model"], "my-model");  // echoed
  EXPECT_EQ(got["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_TRUE(got["created"].is_number_integer());
  ASSERT_EQ(got["choices"].size(), 1u);
  const json& choice = got["choices"][0];
  EXPECT_EQ(choice["token_ids"].get<std::vector<index_t>>(), want.ids);
  EXPECT_EQ(choice["text"], want.text);
  EXPECT_EQ(choice["index"], 0);
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(choice["finish_reason"], want.ids.size() == 8 ? "length" : "stop");
  EXPECT_EQ(got["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(got["usage"]["completion_tokens"], want.ids.size());
  EXPECT_EQ(got["usage"]["total_tokens"], prompt.size() + want.ids.size());
}

TEST_F(Serve, TokenIdPromptsAndPenaltiesGiveDissectGeneratesChain) {
  // tests/tools: `dissect generate --tokens 5,17,3,5 --temperature 0 --repetition-penalty 3`
  // prints 25,61,72,60,52,89,65,94,23,46.
  const json got = post(*server_, {{"prompt", {5, 17, 3, 5}},
                                   {"max_tokens", 10},
                                   {"temperature", 0},
                                   {"repetition_penalty", 3}});
  EXPECT_EQ(got["choices"][0]["token_ids"].get<std::vector<index_t>>(),
            (std::vector<index_t>{25, 61, 72, 60, 52, 89, 65, 94, 23, 46}));
  EXPECT_EQ(got["model"], "gpt2-with-tokenizer");  // no model given: the file's name
  EXPECT_EQ(got["usage"]["prompt_tokens"], 4);
}

TEST_F(Serve, SampledCompletionsFollowTheSeedAndEveryOption) {
  const auto prompt = encode("the cat");
  const dissect::SamplingOptions sampling{.temperature = 1.5,
                                          .top_k = 40,
                                          .top_p = 0.95,
                                          .min_p = 0.01,
                                          .repetition_penalty = 1.1,
                                          .frequency_penalty = 0.2,
                                          .presence_penalty = 0.1};
  const Expected want = expected(prompt, 12, sampling, 7);
  const json got = post(*server_, {{"prompt", "the cat"},
                                   {"max_tokens", 12},
                                   {"temperature", 1.5},
                                   {"top_k", 40},
                                   {"top_p", 0.95},
                                   {"min_p", 0.01},
                                   {"repetition_penalty", 1.1},
                                   {"frequency_penalty", 0.2},
                                   {"presence_penalty", 0.1},
                                   {"seed", 7}});
  EXPECT_EQ(got["choices"][0]["token_ids"].get<std::vector<index_t>>(), want.ids);
  EXPECT_EQ(got["choices"][0]["text"], want.text);
  // Another seed draws another completion (else the seed would not reach the sampler).
  const json other = post(
      *server_, {{"prompt", "the cat"}, {"max_tokens", 12}, {"temperature", 1.5}, {"seed", 8}});
  EXPECT_EQ(other["choices"][0]["token_ids"].get<std::vector<index_t>>(),
            expected(prompt, 12, {.temperature = 1.5}, 8).ids);
}

TEST_F(Serve, StreamedChunksAddUpToTheCompletion) {
  const json request = {{"prompt", "hello"}, {"max_tokens", 16}, {"temperature", 1.2}, {"seed", 3}};
  const json whole = post(*server_, request);
  const std::string text = whole["choices"][0]["text"];
  ASSERT_FALSE(text.empty());
  bool done = false;
  const auto events = stream_events(*server_, request, done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 2u);
  std::string joined;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_EQ(e["id"], events[0]["id"]);
    joined += e["choices"][0]["text"].get<std::string>();
    // Only the last chunk has a finish_reason (and the usage).
    EXPECT_EQ(e["choices"][0]["finish_reason"].is_null(), i + 1 < events.size());
  }
  EXPECT_EQ(joined, text);
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
  EXPECT_EQ(events.back()["usage"], whole["usage"]);
}

TEST_F(Serve, AStopSequenceEndsTheTextBeforeIt) {
  const json request = {{"prompt", "hello"}, {"max_tokens", 16}, {"temperature", 1.2}, {"seed", 3}};
  const std::string text = post(*server_, request)["choices"][0]["text"];
  ASSERT_GE(text.size(), 5u);
  // Two characters from the middle: the completion stops at their first appearance.
  const std::string stop = text.substr(3, 2);
  const std::string want = text.substr(0, text.find(stop));
  json stopped = request;
  stopped["stop"] = {"never there", stop};
  const json got = post(*server_, stopped);
  EXPECT_EQ(got["choices"][0]["text"], want);
  EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
  bool done = false;
  std::string joined;
  for (const json& e : stream_events(*server_, stopped, done)) {
    joined += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(joined, want);  // the held-back start of the stop sequence was never sent
}

TEST_F(Serve, ConcurrentRequestsEachGetTheirOwnCompletion) {
  // Four clients at once, each its own seed (two streaming): every answer is its seed's.
  constexpr int clients = 4;
  const auto prompt = encode("hello");
  std::vector<std::vector<index_t>> want(clients), got(clients);
  for (int i = 0; i < clients; ++i)
    want[i] = expected(prompt, 20, {.temperature = 1.0}, 100 + i).ids;
  std::vector<std::thread> threads;
  std::vector<std::string> texts(clients), whole(clients);
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto client = server_->client();
      const json body = {{"prompt", "hello"},
                         {"max_tokens", 20},
                         {"temperature", 1.0},
                         {"seed", 100 + i},
                         {"stream", i % 2 == 1}};
      const auto res = client.Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) return;  // checked below: got[i] stays empty
      if (i % 2 == 0) {
        const json j = json::parse(res->body);
        got[i] = j["choices"][0]["token_ids"].get<std::vector<index_t>>();
      } else {
        texts[i] = res->body;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < clients; i += 2) EXPECT_EQ(got[i], want[i]) << "client " << i;
  // The streaming clients: their text is what their seed's tokens decode to.
  const auto tokenizer = dissect::text::load_tokenizer(model);
  for (int i = 1; i < clients; i += 2) {
    EXPECT_NE(texts[i].find("data: [DONE]"), std::string::npos) << "client " << i;
    std::string joined;
    std::size_t at = 0;
    while ((at = texts[i].find("data: {", at)) != std::string::npos) {
      const std::size_t end = texts[i].find("\n\n", at);
      joined += json::parse(texts[i].substr(at + 6, end - at - 6))["choices"][0]["text"]
                    .get<std::string>();
      at = end;
    }
    EXPECT_EQ(joined, expected(prompt, 20, {.temperature = 1.0}, 100 + i).text) << "client " << i;
  }
}

TEST_F(Serve, BadRequestsGet400WithTheMessageAndTheServerGoesOn) {
  // reliability.md row 113: each refused before any generation, with OpenAI's error shape.
  std::vector<index_t> too_long(context + 1, 1);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"hi\",", "the request body is not valid JSON: "},
      {"[1, 2]", "the request body must be a JSON object (got [1,2])"},
      {"{}", "prompt is required"},
      {"{\"prompt\": 5}", "prompt must be a string or an array of token ids (got 5)"},
      {"{\"prompt\": [\"a\", \"b\"]}", "a batch of prompts is not supported"},
      {"{\"prompt\": [1, 97]}",
       "prompt: token 1 has id 97, outside the model's vocabulary [0, 97)"},
      {"{\"prompt\": [1, -3]}", "prompt: token 1 is -3, not a token id"},
      {json{{"prompt", too_long}}.dump(),
       "prompt: 25 tokens; the model's context holds at most 24"},
      {"{\"prompt\": \"hi\", \"temperature\": \"hot\"}",
       "temperature must be a number (got \"hot\")"},
      {"{\"prompt\": \"hi\", \"temperature\": -1}",
       "completions: temperature must be finite and >= 0 (got -1)"},
      {"{\"prompt\": \"hi\", \"top_p\": 0}", "completions: top_p must be in (0, 1] (got 0)"},
      {"{\"prompt\": \"hi\", \"min_p\": 1.5}", "completions: min_p must be in [0, 1] (got 1.5)"},
      {"{\"prompt\": \"hi\", \"repetition_penalty\": 0}",
       "completions: repetition_penalty must be finite and > 0 (got 0)"},
      {"{\"prompt\": \"hi\", \"top_k\": 2.5}", "top_k must be an integer (got 2.5)"},
      {"{\"prompt\": \"hi\", \"max_tokens\": -1}", "max_tokens must be in [0, "},
      {"{\"prompt\": \"hi\", \"seed\": -1}",
       "seed must be an integer in [0, 18446744073709551615]"},
      {"{\"prompt\": \"hi\", \"stream\": \"yes\"}", "stream must be true or false (got \"yes\")"},
      {"{\"prompt\": \"hi\", \"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]}",
       "stop must be a non-empty string or an array of at most 4 of them"},
      {"{\"prompt\": \"hi\", \"stop\": \"\"}", "stop must be a non-empty string"},
      {"{\"prompt\": \"hi\", \"n\": 2}", "n: only 1 completion per request is supported"},
      {"{\"prompt\": \"hi\", \"logprobs\": 3}", "logprobs: not supported"},
      {"{\"prompt\": \"hi\", \"echo\": true}", "echo: only false is supported"},
  };
  for (const auto& [body, message] : cases) {
    auto client = server_->client();
    const auto res = client.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(res) << body;
    EXPECT_EQ(res->status, 400) << body;
    const json error = json::parse(res->body);
    EXPECT_EQ(error["error"]["type"], "invalid_request_error") << body;
    EXPECT_NE(error["error"]["message"].get<std::string>().find(message), std::string::npos)
        << body << " gave " << error["error"]["message"];
  }
  // A body over 1 MiB is refused before it is read: 413, in the same shape.
  auto client = server_->client();
  const auto big =
      client.Post("/v1/completions", std::string((1 << 20) + 1, ' '), "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_NE(json::parse(big->body)["error"]["message"].get<std::string>().find("larger than"),
            std::string::npos);
  const auto missing = client.Get("/v1/chat");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  // And it still serves.
  const json after = post(*server_, {{"prompt", "hello"}, {"max_tokens", 2}, {"temperature", 0}});
  EXPECT_EQ(after["choices"][0]["token_ids"].get<std::vector<index_t>>(),
            expected(encode("hello"), 2, {.temperature = 0}, 0).ids);
}

TEST_F(Serve, ModelsAndHealth) {
  auto client = server_->client();
  const auto models = client.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  const json list = json::parse(models->body);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "gpt2-with-tokenizer");
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
}

TEST(ServeEos, TheTokenizersEosEndsTheCompletionWithStop) {
  // With seed 102 the fixture draws <|endoftext|> (96) as its 14th token after "hello" (the
  // expectation below checks that it does, so the test cannot pass by never meeting an EOS).
  const auto prompt = encode("hello");
  const Expected want = expected(prompt, 20, {.temperature = 1.0}, 102, 96);
  ASSERT_LT(want.ids.size(), 20u);
  ASSERT_EQ(want.ids.back(), 96);
  ServerProcess server(eos_model);
  const json got =
      post(server, {{"prompt", "hello"}, {"max_tokens", 20}, {"temperature", 1.0}, {"seed", 102}});
  EXPECT_EQ(got["choices"][0]["token_ids"].get<std::vector<index_t>>(), want.ids);
  EXPECT_EQ(got["choices"][0]["text"], want.text);  // the EOS is not text
  EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(got["usage"]["completion_tokens"], want.ids.size());
  // Without the config, the same request runs on to max_tokens.
  const json plain =
      post(*std::make_unique<ServerProcess>(),
           {{"prompt", "hello"}, {"max_tokens", 20}, {"temperature", 1.0}, {"seed", 102}});
  EXPECT_EQ(plain["choices"][0]["token_ids"].size(), 20u);
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "length");
}

TEST(ServeShutdown, SigtermStopsTheListenerAndExitsZero) {
  ServerProcess server;
  const json got = post(server, {{"prompt", "hello"}, {"max_tokens", 1}, {"temperature", 0}});
  EXPECT_EQ(got["choices"][0]["token_ids"].size(), 1u);
  const std::optional<int> status = server.terminate();
  ASSERT_TRUE(status) << "still running 20 s after SIGTERM";
  EXPECT_EQ(*status, 0);
  EXPECT_EQ(server.read_line(std::chrono::seconds(5)), "stopped");
  // Nothing listens there any more.
  auto client = server.client();
  client.set_connection_timeout(std::chrono::seconds(2));
  EXPECT_FALSE(client.Get("/health"));
}

// ---- /v1/chat/completions (issue 48 item 2; reliability.md rows 142-144) ----------------------

/// What `dissect template CHAT_MODEL --messages … --add-generation-prompt` prints.
std::string rendered(const json& request) {
  const auto file = std::filesystem::temp_directory_path() /
                    ("test_serve_chat_" + std::to_string(getpid()) + ".json");
  {
    std::ofstream out(file);
    out << request.dump();
  }
  const std::string command = program + " template " + chat_model.string() + " --messages " +
                              file.string() + " --add-generation-prompt";
  std::string text;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
    EXPECT_EQ(pclose(pipe), 0) << command;
  }
  std::filesystem::remove(file);
  return text;
}

const json conversation = json::array(
    {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there"}}});

using ServeChat = SharedServer<&chat_model>;

TEST_F(ServeChat, AnswerHasOpenAIsShapeAndCountsTheRenderedPrompt) {
  // Row 142: the prompt is the template's text with the generation prompt, tokenized without the
  // post-processor's BOS (the template wrote one): encode(text, true) would give a second.
  const auto tokenizer = dissect::text::load_tokenizer(chat_model);
  for (const json& tools :
       {json(nullptr),
        json::array({{{"type", "function"},
                      {"function", {{"name", "get_time"}, {"parameters", json::object()}}}}})}) {
    json request = {{"messages", conversation}};
    if (!tools.is_null()) request["tools"] = tools;
    const std::string text = rendered(request);
    ASSERT_EQ(text.rfind("<s><|im_start|>", 0), 0u) << text;
    EXPECT_EQ(tools.is_null(), text.find("get_time;") == std::string::npos) << text;
    const auto ids = tokenizer.encode(text, false);
    ASSERT_EQ(tokenizer.encode(text, true).size(), ids.size() + 1);  // the double BOS avoided
    request["max_tokens"] = 3;
    request["temperature"] = 0;
    const json got = post(*server_, request, 200, "/v1/chat/completions");
    EXPECT_EQ(got["object"], "chat.completion");
    EXPECT_EQ(got["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(got["model"], "chat-llama");
    ASSERT_EQ(got["choices"].size(), 1u);
    EXPECT_EQ(got["choices"][0]["index"], 0);
    EXPECT_EQ(got["choices"][0]["message"]["role"], "assistant");
    EXPECT_TRUE(got["choices"][0]["message"]["content"].is_string());
    EXPECT_EQ(got["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(got["usage"]["prompt_tokens"], ids.size());
    EXPECT_EQ(got["usage"]["completion_tokens"], 3);
    EXPECT_EQ(got["usage"]["total_tokens"], ids.size() + 3);
  }
}

TEST_F(ServeChat, StreamedDeltasAddUpToTheMessage) {
  for (const json& sampling : {json{{"temperature", 0}}, json{{"temperature", 1.0}, {"seed", 7}}}) {
    json request = sampling;
    request["messages"] = json::array({{{"role", "user"}, {"content", "Tell me a story"}}});
    request["max_tokens"] = 12;
    const json whole = post(*server_, request, 200, "/v1/chat/completions");
    bool done = false;
    const std::vector<json> events = stream_events(*server_, request, done, "/v1/chat/completions");
    ASSERT_TRUE(done);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
    std::string content;
    for (std::size_t i = 0; i < events.size(); ++i) {
      const json& choice = events[i]["choices"][0];
      EXPECT_EQ(events[i]["object"], "chat.completion.chunk");
      EXPECT_EQ(choice["finish_reason"].is_null(), i + 1 < events.size());
      if (choice["delta"].contains("content"))
        content += choice["delta"]["content"].get<std::string>();
    }
    EXPECT_EQ(content, whole["choices"][0]["message"]["content"]) << sampling;
    EXPECT_EQ(events.back()["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"]);
    EXPECT_EQ(events.back()["usage"], whole["usage"]);
  }
}

TEST_F(ServeChat, AnEndOfTurnTokenEndsTheReplyAndIsNotInIt) {
  // Row 143: greedy decoding of this fixture answers 9 # 6 B <|end|> (ids 96 4 23 35 26, see
  // chat-llama/make_fixture.py). <|end|> is neither the EOS nor in the prompt: only the
  // end-of-turn rule stops there. /v1/completions (EOS only) runs through it, which shows the
  // model does pick it.
  const json request = {{"messages", conversation}, {"max_tokens", 12}, {"temperature", 0}};
  const json got = post(*server_, request, 200, "/v1/chat/completions");
  EXPECT_EQ(got["choices"][0]["message"]["content"], "9#6B");
  EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(got["usage"]["completion_tokens"], 5);
  bool done = false;
  const std::vector<json> events = stream_events(*server_, request, done, "/v1/chat/completions");
  std::string streamed;
  for (const json& event : events) {
    if (event["choices"][0]["delta"].contains("content"))
      streamed += event["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, "9#6B");
  const auto tokenizer = dissect::text::load_tokenizer(chat_model);
  std::vector<index_t> prompt;
  for (const std::int32_t id : tokenizer.encode(rendered({{"messages", conversation}}), false))
    prompt.push_back(id);
  const json plain = post(*server_, {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(plain["choices"][0]["text"].get<std::string>().rfind("9#6B<|end|>", 0), 0u)
      << plain["choices"][0]["text"];
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "length");
}

TEST(ServeChatGenerationConfig, ItsEosTokenIdsEndTheReplyToo) {
  // Row 143: generation_config.json's eos_token_id list is read; '#' (id 4), the second token of
  // the greedy reply above, made an end of generation ends it after "9".
  const auto dir = std::filesystem::temp_directory_path() /
                   ("test_serve_generation_config_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(chat_model))
    std::filesystem::copy_file(entry.path(), dir / entry.path().filename(),
                               std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [93, 4]})";
  {
    ServerProcess server(dir);
    const json got =
        post(server, {{"messages", conversation}, {"max_tokens", 12}, {"temperature", 0}}, 200,
             "/v1/chat/completions");
    EXPECT_EQ(got["choices"][0]["message"]["content"], "9");
    EXPECT_EQ(got["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(got["usage"]["completion_tokens"], 2);
  }
  // An id outside the vocabulary is the file's error, said when the server starts.
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": 1000})";
  // timeout: a server that started anyway must fail the test, not hang it.
  const std::string command = "timeout 20 " + program + " serve " + dir.string() + " --port 0 2>&1";
  std::string output;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
    EXPECT_EQ(WEXITSTATUS(pclose(pipe)), 2) << output;
  }
  EXPECT_NE(output.find("generation_config.json: eos_token_id 1000 is not an id"),
            std::string::npos)
      << output;
  std::filesystem::remove_all(dir);
}

TEST_F(ServeChat, BadChatRequestsGet400NamingTheField) {
  // Row 144: each refused with OpenAI's error shape, the message naming what is wrong.
  const json user = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"messages", "Hi"}}, "messages must be a non-empty array"},
      {json::object(), "messages must be a non-empty array"},
      {{{"messages", json::array({{{"content", "Hi"}}})}}, "messages[0].role must be a string"},
      {{{"messages", json::array({{{"role", "user"}, {"content", 3}}})}},
       "messages[0].content must be a string"},
      {{{"messages",
         json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}},
       "messages[0].content[0]: only"},
      {{{"messages", user}, {"response_format", {{"type", "json_object"}}}},
       "response_format: not supported"},
      {{{"messages", user}, {"logit_bias", {{"5", 100}}}}, "logit_bias: not supported"},
      {{{"messages", user}, {"tool_choice", "required"}},
       "tool_choice: only \"auto\" and \"none\""},
      {{{"messages", user}, {"logprobs", true}}, "logprobs: not supported"},
      {{{"messages", user}, {"n", 2}}, "n: only 1 completion"},
      {{{"messages", user}, {"top_p", 0}}, "top_p must be in (0, 1]"},
      {{{"messages", user}, {"tools", "get_time"}}, "tools must be an array"},
      {{{"messages", user}, {"max_tokens", 3}, {"max_completion_tokens", 3}},
       "max_completion_tokens: give it or max_tokens, not both"},
      // A conversation longer than the context: 300 + 20 tokens rendered, 256 at most.
      {{{"messages", json::array({{{"role", "user"}, {"content", std::string(300, 'a')}}})}},
       "messages, as the chat template renders them: prompt: 320 tokens; the model's context holds "
       "at most 256"},
      // The template's own raise_exception, its message carried.
      {{{"messages", json::array({{{"role", "assistant"}, {"content", "Hi"}}})}},
       "raise_exception: Conversations must start with a system or user message"},
  };
  for (const auto& [body, message] : cases) {
    const json got = post(*server_, body, 400, "/v1/chat/completions");
    if (!got.contains("error")) {
      ADD_FAILURE() << body << " was not refused: " << got;
      continue;
    }
    EXPECT_EQ(got["error"]["type"], "invalid_request_error") << body;
    EXPECT_NE(got["error"]["message"].get<std::string>().find(message), std::string::npos)
        << body << " -> " << got["error"]["message"];
  }
  // The server goes on; max_completion_tokens is OpenAI's newer max_tokens.
  const json ok = post(*server_, {{"messages", user}, {"max_completion_tokens", 2}}, 200,
                       "/v1/chat/completions");
  EXPECT_EQ(ok["usage"]["completion_tokens"], 2);
}

TEST_F(Serve, AModelWithoutAChatTemplateAnswersChat400) {
  // Row 144: the GPT-2 fixture has no tokenizer_config.json or chat_template.jinja.
  const json got =
      post(*server_, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}, 400,
           "/v1/chat/completions");
  ASSERT_TRUE(got.contains("error")) << got;
  EXPECT_NE(got["error"]["message"].get<std::string>().find("no chat template"), std::string::npos)
      << got;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: test_serve DISSECT_PROGRAM MODEL_DIR EOS_MODEL_DIR CHAT_MODEL_DIR\n");
    return 2;
  }
  program = argv[1];
  model = argv[2];
  eos_model = argv[3];
  chat_model = argv[4];
  signal(SIGPIPE, SIG_IGN);  // a server that died must fail a test, not kill the program
  alarm(100);                // the last guard against a hang; ctest's TIMEOUT is above it
  return RUN_ALL_TESTS();
}
