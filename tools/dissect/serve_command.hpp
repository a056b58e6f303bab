// tools/dissect/serve_command.hpp — `dissect serve`: one model behind OpenAI's /v1/completions,
// over HTTP with cpp-httplib (Debian's libcpp-httplib-dev), the way llama.cpp's users run theirs.
//
//   dissect serve CHECKPOINT|FILE.gguf [--host 127.0.0.1] [--port 8080] [--threads 4]
//                 [--name NAME] [--allow-remote]
//
// Routes: POST /v1/completions and POST /v1/chat/completions (JSON, or server-sent events with
// "stream": true), GET /v1/models, GET /health. Requests are read by serve_request.hpp; a chat's
// messages go through the model's own chat template (dissect/text/chat_template.hpp); the
// generation is the library's generate(), its prompt encoded and its tokens decoded as `dissect
// generate` does it (dissect/text/prompt_codec.hpp).
//
// One generation runs at a time: the model's forward is not made for concurrent calls, so a
// mutex serialises them, and the HTTP threads (--threads) bound how many requests are open at
// once; the others wait for a thread. max_tokens is cut by the context, as generate() cuts it;
// a body is at most 1 MiB; a connection that says nothing for 10 s is closed. SIGINT or SIGTERM
// stops the listener, lets the requests in flight finish, and exits 0.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/text/chat_template.hpp"
#include "dissect/text/chat_template_gguf.hpp"
#include "dissect/text/prompt_codec.hpp"
#include "tools/common/parse.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/model_loading.hpp"
#include "tools/dissect/serve_request.hpp"

// After dissect's headers: httplib.h brings in <resolv.h>, whose macro _res breaks Eigen's
// matrix products (a parameter of theirs is named _res).
#include <httplib.h>

namespace dissect::tools {

// ---- declarations -------------------------------------------------------------------------------

/// serve's flags, each read and checked before the model file is opened.
struct ServeOptions {
  std::filesystem::path checkpoint;
  std::string host = "127.0.0.1";
  int port = 8080;      ///< 0: any free port (the line "listening on …" says which)
  index_t threads = 4;  ///< HTTP threads: requests open at once
  std::string name;     ///< the model's id in /v1/models; the file's name when empty
  bool allow_remote = false;
};

/// The largest request body, in bytes: a prompt of the longest contexts dissect runs fits many
/// times over, and a client cannot make the server buffer more.
inline constexpr std::size_t max_request_bytes = std::size_t{1} << 20;

/// Whether `host` names this machine alone: 127.0.0.0/8, ::1 or localhost.
bool is_loopback_host(std::string_view host);

/// Loads the model and serves it until SIGINT or SIGTERM. @throws as with_model; Error when the
/// address cannot be bound.
int serve(const ServeOptions& o);

// ---- implementation -----------------------------------------------------------------------------

inline bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

namespace serve_detail {

inline nlohmann::json error_json(std::string_view message, std::string_view type) {
  return {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
}

inline void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

/// What a chat request needs besides the model: the template and the special tokens it sees,
/// or why there is none, and the ids that end a turn.
struct ChatSetup {
  std::optional<text::ChatTemplate> chat_template;
  text::ChatTemplateOptions options;  ///< bos_token, eos_token and the other special tokens
  std::string unavailable;            ///< why chat_template is empty
  std::vector<index_t> end_ids;       ///< end of generation: EOS and the end-of-turn tokens
};

/// The texts of end-of-turn tokens, as llama.cpp's end-of-generation list has them (Llama 3's
/// <|eot_id|> and <|eom_id|>, ChatML's <|im_end|>, Phi's <|end|>, Gemma's <end_of_turn>,
/// gpt-oss's <|return|> and <|call|>, DeepSeek's end of sentence …).
inline constexpr std::string_view end_of_turn_texts[] = {"<|eot_id|>",
                                                         "<|eom_id|>",
                                                         "<|im_end|>",
                                                         "<|end|>",
                                                         "<end_of_turn>",
                                                         "<|endoftext|>",
                                                         "<|end_of_text|>",
                                                         "<|return|>",
                                                         "<|call|>",
                                                         "<EOT>",
                                                         "[EOT]",
                                                         "<end_of_utterance>",
                                                         "<\uff5cend\u2581of\u2581sentence\uff5c>"};

/// The model's chat template and what ends a chat's turn. The ids are, together: the tokenizer's
/// EOS, the id of the template's eos_token, every id in generation_config.json's eos_token_id (an
/// id or a list, beside a checkpoint), GGUF's tokenizer.ggml.eot_token_id and eom_token_id, and
/// every added token marked special whose text is in end_of_turn_texts. A model without a
/// template (or with one dissect cannot parse) still serves completions; its chat requests get
/// 400 with the reason. @throws FormatError naming generation_config.json when it is not JSON or
/// an eos_token_id is not an id of the model's vocabulary.
inline ChatSetup read_chat_setup(const std::filesystem::path& checkpoint, const ModelText& text) {
  ChatSetup setup;
  std::error_code ec;
  const bool gguf = text.gguf;
  std::optional<text::ChatTemplateFiles> files;
  std::optional<GgufFile> file;
  try {
    if (gguf) {
      file.emplace(checkpoint);
      files = text::read_gguf_templates(*file);
      if (files->templates.empty())
        throw ConfigError(concat(checkpoint.string(), " has no tokenizer.chat_template"));
    } else {
      const auto dir =
          std::filesystem::is_directory(checkpoint, ec) ? checkpoint : checkpoint.parent_path();
      files = text::find_chat_templates(dir.empty() ? std::filesystem::path(".") : dir);
    }
    setup.chat_template = files->parse();
    setup.options = files->options();
    setup.options.add_generation_prompt = true;
  } catch (const Error& error) {
    setup.unavailable = error.what();
  }
  if (!text.tokenizer) return setup;
  const text::Tokenizer& tokenizer = *text.tokenizer;
  const auto add = [&](std::optional<std::int32_t> id) {
    if (id && std::find(setup.end_ids.begin(), setup.end_ids.end(), *id) == setup.end_ids.end())
      setup.end_ids.push_back(*id);
  };
  add(tokenizer.eos_id());
  if (files && files->eos_token) add(tokenizer.token_to_id(*files->eos_token));
  for (const text::AddedToken& token : tokenizer.added_tokens()) {
    if (token.special && std::find(std::begin(end_of_turn_texts), std::end(end_of_turn_texts),
                                   token.content) != std::end(end_of_turn_texts))
      add(token.id);
  }
  if (file) {
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
      const GgufValue* value = file->find(key);
      const auto id = value ? value->as_unsigned() : std::nullopt;
      if (id && *id < static_cast<std::uint64_t>(text.config.vocab))
        add(static_cast<std::int32_t>(*id));
    }
  } else {
    const auto dir =
        std::filesystem::is_directory(checkpoint, ec) ? checkpoint : checkpoint.parent_path();
    const auto generation_config = dir / "generation_config.json";
    if (std::filesystem::is_regular_file(generation_config, ec)) {
      const nlohmann::json config = io::parse_json_strictly(
          text::detail::read_text_file(generation_config, "serve"), generation_config.string());
      if (const auto it = config.find("eos_token_id"); it != config.end()) {
        const nlohmann::json ids = it->is_array() ? *it : nlohmann::json::array({*it});
        for (const nlohmann::json& id : ids) {
          if (!id.is_number_unsigned() ||
              id.get<std::uint64_t>() >= static_cast<std::uint64_t>(text.config.vocab))
            throw FormatError(concat(generation_config.string(), ": eos_token_id ", id.dump(),
                                     " is not an id of the model's vocabulary"));
          add(static_cast<std::int32_t>(id.get<std::uint64_t>()));
        }
      }
    }
  }
  return setup;
}

/// Thrown from generate()'s callback to end a generation early (a stop sequence, EOS, a client
/// gone): generate() holds only its own locals, so unwinding through it leaves nothing behind.
struct StopGeneration {};

/// What one completion produced.
struct Completion {
  std::string text;          ///< the text sent, stop sequence excluded
  std::vector<index_t> ids;  ///< every id generated, through the one that ended it
  bool stopped = false;      ///< by EOS or a stop sequence: finish_reason "stop"
  bool client_gone = false;  ///< a stream whose client stopped reading
};

/// Why a text prompt cannot be encoded for a model without a tokenizer dissect can use.
inline std::string why_no_text(const ModelText& text) {
  return concat(
      "this model carries no tokenizer",
      text.tokenizer_error.empty() ? "" : concat(" dissect can use (", text.tokenizer_error, ")"),
      "; send the prompt as an array of token ids");
}

/// The model with everything a request needs, and the lock that serialises its use.
template <class Model>
class CompletionService {
 public:
  CompletionService(const Model& model, const ModelText& text)
      : model_(model), text_(text), codec_(prompt_codec(text, why_no_text(text))) {}

  /// The prompt's ids, checked: inside the vocabulary, 1 to context of them.
  /// @throws ConfigError naming prompt.
  std::vector<index_t> prompt_of(const CompletionRequest& r) const {
    const text::PromptLimits limits{.vocab = text_.config.vocab, .context = text_.config.context};
    if (r.prompt_ids) {
      text::check_prompt(*r.prompt_ids, limits, "prompt");
      return *r.prompt_ids;
    }
    // The tokenizer is not promised to be thread-safe: it encodes under the generations' lock.
    std::unique_lock lock(mutex_, std::defer_lock);
    if (text_.tokenizer) lock.lock();
    return codec_.prompt(*r.prompt_text, limits, "prompt", r.add_special_tokens);
  }

  /// The tokenizer's EOS, which ends a completion (a chat ends at ChatSetup::end_ids).
  std::vector<index_t> eos_ids() const {
    if (text_.vocab || !text_.tokenizer || !text_.tokenizer->eos_id()) return {};
    return {*text_.tokenizer->eos_id()};
  }

  /// Generates for `prompt` until one of `end_ids` (not part of the text), a stop sequence or
  /// max_tokens, calling on_text(piece) with each piece of text as it becomes safe to send
  /// (decoded whole characters, held back while it could start a stop sequence); on_text
  /// returns false when its client is gone. Waits for any other generation to finish first.
  Completion complete(const CompletionRequest& r, const std::vector<index_t>& prompt,
                      const std::vector<index_t>& end_ids,
                      const std::function<bool(std::string_view)>& on_text) const {
    const std::lock_guard lock(mutex_);
    Completion out;
    StopScanner scanner(r.stop);
    // The prompt goes through the decoder first, so that decoders that look at context (LLaMA's
    // first-space Strip) treat the continuation as the middle of the text it is.
    text::PromptCodec::Decoder decoder = codec_.decoder();
    for (const index_t id : prompt) (void)decoder.push(id);
    const auto send = [&](const std::string& piece) {
      if (piece.empty()) return;
      out.text += piece;
      if (!on_text(piece)) {
        out.client_gone = true;
        throw StopGeneration{};
      }
    };
    const GenerationOptions options{
        .max_new_tokens = r.max_tokens, .sampling = r.sampling, .seed = r.seed};
    try {
      (void)generate(model_, prompt, options, [&](index_t id) {
        out.ids.push_back(id);
        if (std::find(end_ids.begin(), end_ids.end(), id) != end_ids.end()) {
          out.stopped = true;
          throw StopGeneration{};
        }
        send(scanner.push(decoder.push(id).value_or("")));  // an id without text adds none
        if (scanner.stopped()) {
          out.stopped = true;
          throw StopGeneration{};
        }
      });
    } catch (const StopGeneration&) {
      if (out.client_gone) return out;
    }
    if (!scanner.stopped()) {
      // Bytes of an unfinished character (a truncated UTF-8 sequence), then what was held back.
      send(scanner.push(decoder.finish()));
      if (scanner.stopped()) {
        out.stopped = true;
      } else {
        send(scanner.finish());
      }
    }
    return out;
  }

 private:
  const Model& model_;
  const ModelText& text_;
  text::PromptCodec codec_;  ///< borrows text_'s tokenizer
  mutable std::mutex mutex_;
};

inline nlohmann::json usage_json(index_t prompt_tokens, index_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

/// One choice of an answer. A completion's carries text; a chat's a message, or in a stream a
/// delta — the role in the first chunk, content in the others, nothing in the last.
inline nlohmann::json choice_json(bool chat, bool streamed, const nlohmann::json& content,
                                  const nlohmann::json& finish_reason) {
  nlohmann::json choice = {{"index", 0}};
  if (!chat) {
    choice["text"] = content.is_null() ? nlohmann::json("") : content;
  } else if (!streamed) {
    choice["message"] = {{"role", "assistant"}, {"content", content}};
  } else if (content.is_null()) {
    choice["delta"] = nlohmann::json::object();
  } else {
    choice["delta"] = {{"content", content}};
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish_reason;
  return choice;
}

/// Answers a checked request, as JSON or as server-sent events: one "data: {chunk}" per piece of
/// text (a chat's first one carrying the role), a last chunk with the finish_reason and, as
/// OpenAI's stream_options.include_usage gives it, the usage, then "data: [DONE]". Everything that
/// can be refused was refused before this, before the 200.
template <class Model>
void answer(const CompletionService<Model>& service, httplib::Response& res, bool chat,
            nlohmann::json head, const CompletionRequest& request, std::vector<index_t> prompt,
            std::vector<index_t> end_ids) {
  if (!request.stream) {
    const Completion done =
        service.complete(request, prompt, end_ids, [](std::string_view) { return true; });
    nlohmann::json body = head;
    body["object"] = chat ? "chat.completion" : "text_completion";
    body["choices"] = nlohmann::json::array(
        {choice_json(chat, false, done.text, done.stopped ? "stop" : "length")});
    if (!chat) body["choices"][0]["token_ids"] = done.ids;  // dissect's own: what the text decodes
    body["usage"] =
        usage_json(static_cast<index_t>(prompt.size()), static_cast<index_t>(done.ids.size()));
    send_json(res, 200, body);
    return;
  }
  head["object"] = chat ? "chat.completion.chunk" : "text_completion";
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", [&service, chat, head, request,
                                                         prompt = std::move(prompt),
                                                         end_ids = std::move(end_ids)](
                                                            std::size_t, httplib::DataSink& sink) {
    const auto event = [&](const nlohmann::json& data) {
      const std::string line =
          "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
      return sink.write(line.data(), line.size());
    };
    const auto chunk = [&](const nlohmann::json& content, const nlohmann::json& finish) {
      nlohmann::json out = head;
      out["choices"] = nlohmann::json::array({choice_json(chat, true, content, finish)});
      return out;
    };
    try {
      if (chat) {
        nlohmann::json first = chunk("", nullptr);
        first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
        if (!event(first)) return false;
      }
      const Completion done =
          service.complete(request, prompt, end_ids,
                           [&](std::string_view piece) { return event(chunk(piece, nullptr)); });
      if (done.client_gone) return false;
      nlohmann::json last = chunk(nullptr, done.stopped ? "stop" : "length");
      last["usage"] =
          usage_json(static_cast<index_t>(prompt.size()), static_cast<index_t>(done.ids.size()));
      const std::string end = "data: [DONE]\n\n";
      if (!event(last) || !sink.write(end.data(), end.size())) return false;
      sink.done();
      return true;
    } catch (const std::exception& error) {
      (void)event(error_json(error.what(), "server_error"));
      return false;
    }
  });
}

template <class Model>
int serve_model(const Model& model, const ModelText& text, const ServeOptions& o) {
  const CompletionService<Model> service(model, text);
  const ChatSetup chat_setup = read_chat_setup(o.checkpoint, text);
  const std::string name = o.name.empty() ? o.checkpoint.filename().string() : o.name;
  const auto started = static_cast<std::int64_t>(std::time(nullptr));
  std::atomic<std::uint64_t> next_id{1};

  httplib::Server server;
  const auto threads = static_cast<std::size_t>(o.threads);
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server.set_payload_max_length(max_request_bytes);
  server.set_read_timeout(std::chrono::seconds(10));
  server.set_write_timeout(std::chrono::seconds(10));
  server.set_keep_alive_timeout(5);
  // httplib answers 404, 413 and the like with an empty body; give them OpenAI's error shape.
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string message =
            res.status == 404
                ? concat("no route ", req.method, " ", req.path,
                         " (POST /v1/completions, POST /v1/chat/completions, GET /v1/models, "
                         "GET /health)")
            : res.status == 413
                ? concat("the request body is larger than ", max_request_bytes, " bytes")
                : concat("HTTP status ", res.status);
        send_json(res, res.status, error_json(message, "invalid_request_error"));
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string message = "unknown error";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          message = e.what();
        } catch (...) {
        }
        send_json(res, 500, error_json(message, "server_error"));
      });

  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "ok"}});
  });
  server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", nlohmann::json::array({{{"id", name},
                                                {"object", "model"},
                                                {"created", started},
                                                {"owned_by", "dissect"}}})}});
  });
  const auto head = [&](const CompletionRequest& request, std::string_view prefix) {
    return nlohmann::json{{"id", concat(prefix, started, "-", next_id++)},
                          {"object", nullptr},
                          {"created", static_cast<std::int64_t>(std::time(nullptr))},
                          {"model", request.model.empty() ? name : request.model}};
  };
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    CompletionRequest request;
    std::vector<index_t> prompt;
    try {
      request = parse_completion_request(req.body);
      prompt = service.prompt_of(request);
    } catch (const Error& error) {
      send_json(res, 400, error_json(error.what(), "invalid_request_error"));
      return;
    }
    answer(service, res, false, head(request, "cmpl-"), request, std::move(prompt),
           service.eos_ids());
  });
  // A chat: the messages through the model's own template with the generation prompt, the text
  // tokenized as it stands (the template wrote BOS if the model wants one), generation ended by
  // EOS or an end-of-turn token (read_chat_setup), neither of them part of the content.
  server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    ChatRequest chat;
    std::vector<index_t> prompt;
    try {
      chat = parse_chat_request(req.body);
      if (!chat_setup.chat_template)
        throw ConfigError(concat("this model has no chat template dissect can use (",
                                 chat_setup.unavailable,
                                 "); send the prompt to /v1/completions instead"));
      text::ChatTemplateOptions options = chat_setup.options;
      options.tools = chat.tools;
      chat.completion.prompt_text = chat_setup.chat_template->render(chat.messages, options);
      try {
        prompt = service.prompt_of(chat.completion);
      } catch (const ConfigError& error) {  // "prompt: …" names no field of the request
        throw ConfigError(concat("messages, as the chat template renders them: ", error.what()));
      }
    } catch (const Error& error) {
      send_json(res, 400, error_json(error.what(), "invalid_request_error"));
      return;
    }
    answer(service, res, true, head(chat.completion, "chatcmpl-"), chat.completion,
           std::move(prompt), chat_setup.end_ids);
  });

  const int port = o.port == 0 ? server.bind_to_any_port(o.host)
                               : (server.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port < 0) {
    throw Error(concat("serve: cannot listen on ", o.host, ":", o.port,
                       " (the port is in use, or the host is not an address of this machine)"));
  }
  // SIGINT and SIGTERM are blocked in every thread (httplib's start after this) and taken by one
  // that stops the listener: a handler could not safely do what stop() does.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atomic<bool> finished{false};
  std::thread waiter([&] {
    int signal = 0;
    (void)sigwait(&signals, &signal);
    // stop() does nothing until listen_after_bind has started: retry until it returns.
    while (!finished) {
      server.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const bool ipv6 = o.host.find(':') != std::string::npos;
  std::cout << "listening on http://" << (ipv6 ? "[" : "") << o.host << (ipv6 ? "]" : "") << ":"
            << port << std::endl;  // flushed: a client (or a test) waits for this line
  const bool listened = server.listen_after_bind();
  finished = true;
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes it if no signal came
  waiter.join();
  if (!listened) throw Error(concat("serve: the listener on port ", port, " failed"));
  std::cout << "stopped" << std::endl;
  return 0;
}

}  // namespace serve_detail

inline int serve(const ServeOptions& o) {
  // Inference only: no gradient buffers, no random values the file overwrites; float weights
  // packed once for the GEMM, as `dissect generate` does.
  const ConstructionScope inference({.gradients = false});
  return with_model(
      o.checkpoint, "serve", [](const ModelText&) {},
      [&](auto& model, const ModelText& text) {
        (void)pack_for_inference(model);
        return serve_detail::serve_model(model, text, o);
      });
}

/// `dissect serve` and its flags.
class ServeCommand final : public Command {
 public:
  explicit ServeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "serve",
            "OpenAI's /v1/completions and /v1/chat/completions over HTTP (streaming with "
            "server-sent events)")) {
    CLI::App* serve_command = &this->app();
    serve_command
        ->add_option("checkpoint", options_.checkpoint,
                     ".safetensors file, index .json, a directory, or a .gguf file")
        ->required();
    serve_command
        ->add_option("--host", options_.host,
                     "the address to listen on: a loopback one unless --allow-remote")
        ->capture_default_str();
    serve_command->add_option("--port", port_, "0 to 65535; 0: any free port")
        ->capture_default_str();
    serve_command
        ->add_option("--threads", serve_threads_,
                     "1 to 64 HTTP threads: requests open at once (one generates at a time)")
        ->capture_default_str();
    serve_command->add_option("--name", options_.name,
                              "the model's id in /v1/models (default: the file's name)");
    serve_command->add_flag("--allow-remote", options_.allow_remote,
                            "listen on a non-loopback --host: anyone who reaches it may use the "
                            "model (there is no authentication)");
  }

  int run() override {
    ServeOptions& o = options_;
    const index_t port_number = tools::parse_integer(port_, "--port");
    if (port_number > 65535) {
      throw dissect::ConfigError(
          dissect::concat("--port: must be in [0, 65535] (got \"", port_, "\")"));
    }
    o.port = static_cast<int>(port_number);
    o.threads = tools::parse_integer(serve_threads_, "--threads", 1);
    if (o.threads > 64) {
      throw dissect::ConfigError(
          dissect::concat("--threads: must be in [1, 64] (got \"", serve_threads_, "\")"));
    }
    if (o.host.empty()) throw dissect::ConfigError("--host: the address is empty");
    if (!o.allow_remote && !tools::is_loopback_host(o.host)) {
      throw dissect::ConfigError(dissect::concat(
          "--host: ", o.host,
          " is not a loopback address; dissect serve has no authentication, so listening "
          "there needs --allow-remote"));
    }
    return tools::serve(o);
  }

 private:
  ServeOptions options_;
  std::string port_ = "8080", serve_threads_ = "4";
};

}  // namespace dissect::tools
