#!/usr/bin/env python3
# tests/tools/chat-llama/make_fixture.py — writes this directory's config.json, tokenizer.json and
# tokenizer_config.json: the tiny LLaMA of tests/reference/fixtures/hf/llama (V = 97; its weights
# are copied beside these files by tests/tools/CMakeLists.txt) with a character tokenizer whose
# special tokens are the ones its ChatML-style chat template writes. Run once; the outputs are
# committed and the tests never run Python.
#
# The context is raised from 32 to 256 (RoPE has no learned position table, so the weights do not
# change) so that a rendered conversation fits. <|end|> is an end-of-turn marker the template never
# writes; it takes the id (26) the model picks greedily as its 5th reply token to the conversations
# test_serve.cpp sends (END_ID below, found by running the server with <|end|> elsewhere), so that
# the test sees generation stop at it.
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parent.parent / "reference" / "fixtures" / "hf" / "llama" / "config.json"
END_ID = 26  # see above

chars = ["\n"] + [chr(c) for c in range(0x20, 0x7F) if chr(c) not in "`~^\\"]
specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|end|>"]
tokens = chars + specials
assert len(tokens) == 97
# <|end|> swaps places with the token at END_ID.
end = tokens.index("<|end|>")
tokens[end], tokens[END_ID] = tokens[END_ID], tokens[end]
vocab = {t: i for i, t in enumerate(tokens)}

tokenizer = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True} for t in specials],
    "normalizer": None, "pre_tokenizer": None,
    "post_processor": {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}},
    "decoder": {"type": "Fuse"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
              "byte_fallback": False, "vocab": vocab, "merges": []},
}

template = (
    "{% if messages[0]['role'] == 'assistant' %}"
    "{{ raise_exception('Conversations must start with a system or user message') }}{% endif %}"
    "{{ bos_token }}"
    "{% if tools %}{{ '<|im_start|>tools\\n' }}{% for tool in tools %}"
    "{{ tool['function']['name'] + ';' }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}

config = json.loads(SOURCE.read_text())
config["max_position_embeddings"] = 256

def write(name, value):
    (HERE / name).write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n")

write("config.json", config)
write("tokenizer.json", tokenizer)
write("tokenizer_config.json", tokenizer_config)
