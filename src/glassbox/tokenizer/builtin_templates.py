"""Chat templates for GGUF files that carry none (no ``tokenizer.chat_template``), by architecture.

Some GGUF conversions drop the model's chat template (the Gemma 3 270M file converted by GGUF-my-repo has
none). llama.cpp then falls back to ChatML, whose ``<|im_start|>`` markers Gemma's vocabulary does not
have; glassbox renders the architecture's own turn format instead, so that a chat prompt looks like the
ones the model was trained on and the answer ends at the format's end-of-turn token.
"""

from __future__ import annotations

# Gemma's turn format (as Google's Gemma 3 template renders text-only chats): BOS, then per turn
# "<start_of_turn>{user|model}\n{content, trimmed}<end_of_turn>\n", the assistant's role named "model"; a
# leading system message is put in front of the first user turn, followed by a blank line; turns must
# alternate user/model; the generation prompt opens a model turn. Written for glassbox.
GEMMA_CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- set ns = namespace(prefix="", turns=messages) -%}
{%- if messages and messages[0]["role"] == "system" -%}
  {%- set ns.prefix = messages[0]["content"] ~ "\\n\\n" -%}
  {%- set ns.turns = messages[1:] -%}
{%- endif -%}
{%- for message in ns.turns -%}
  {%- set expected = "user" if loop.index0 % 2 == 0 else "assistant" -%}
  {%- if message["role"] != expected -%}
    {{- raise_exception("Gemma chats alternate user and assistant turns after an optional system message") -}}
  {%- endif -%}
  {{- "<start_of_turn>" ~ ("model" if message["role"] == "assistant" else "user") ~ "\\n" -}}
  {{- (ns.prefix if loop.first else "") ~ (message["content"] | trim) ~ "<end_of_turn>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<start_of_turn>model\\n" -}}
{%- endif -%}
"""

# Gemma 4's turn format (as its published template renders text-only chats without thinking): BOS, then per
# message "<|turn>{system|user|model}\n{content, trimmed}<turn|>\n", the assistant's role named "model", a
# system message (first only) a turn of its own; the generation prompt opens a model turn. Written for glassbox.
GEMMA4_CHAT_TEMPLATE = """\
{{- bos_token -}}
{%- for message in messages -%}
  {%- set role = {"system": "system", "user": "user", "assistant": "model"}.get(message["role"]) -%}
  {%- if role is none or (role == "system" and not loop.first) -%}
    {{- raise_exception("Gemma 4 chats take an optional first system message, then user and assistant turns") -}}
  {%- endif -%}
  {{- "<|turn>" ~ role ~ "\\n" ~ (message["content"] | trim) ~ "<turn|>\\n" -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- "<|turn>model\\n" -}}
{%- endif -%}
"""

# GGUF general.architecture -> the template used when the file has none
BUILTIN_CHAT_TEMPLATES = {"gemma3": GEMMA_CHAT_TEMPLATE, "gemma4": GEMMA4_CHAT_TEMPLATE}
