"""ManagedServer tool calling (hermes), max_completion_tokens and think blocks.

The tiny model writes noise, so completions that must hold a tool call come from
`TokenScriptServer` (real HTTP, vLLM's token-id completions API) with the tiny
model's real tokenizer; rendering checks sample from the real CPU inference server.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from atroposlib.envs.server_handling.chat_prompt import template_renders_tools
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from tests.support.inference_servers import QUESTION, server_config
from tests.support.token_script_server import LOGPROB, TokenScriptServer

transformers = pytest.importorskip("transformers")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]
SMALL_TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {}}}]  # 512 context
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 5}}\n</tool_call>'
NATIVE_TEMPLATE_HEAD = (
    "{% if tools %}<|im_start|>system\nTOOLS:{{ tools | tojson }}<|im_end|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return transformers.AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def script():
    servers: list[TokenScriptServer] = []

    def start(*replies: tuple[list[int], str]) -> TokenScriptServer:
        servers.append(TokenScriptServer(list(replies)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def managed_over(url: str, tokenizer, **options) -> ManagedServer:
    return ManagedServer(VLLMServer(server_config(url)), tokenizer, **options)


def test_tiny_template_ignores_tools_so_they_go_into_a_hermes_system_block(
    inference_server, tokenizer
):
    assert not template_renders_tools(tokenizer), "precondition: the tiny template has no tools"
    managed = managed_over(inference_server.url, tokenizer, tool_parser="hermes")

    async def scenario():
        return await managed.chat_completion(
            messages=QUESTION, tools=SMALL_TOOLS, tool_choice="auto", max_tokens=2
        )

    asyncio.run(scenario())
    node = managed.get_state()["nodes"][0]
    system_turn = node.full_text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nAnswer with one digit.\n\n# Tools")
    tool_lines = system_turn.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in tool_lines] == SMALL_TOOLS
    assert "<tool_call>" in system_turn, "the model is told how to call"
    prompt_text = node.full_text[: node.full_text.rindex("<|im_start|>assistant\n") + 22]
    assert node.tokens[: len(ids(tokenizer, prompt_text))] == ids(tokenizer, prompt_text)


def test_a_template_that_renders_tools_gets_them_through_apply_chat_template(
    inference_server, tiny_model_path
):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = NATIVE_TEMPLATE_HEAD + tok.chat_template
    assert template_renders_tools(tok)
    managed = managed_over(inference_server.url, tok, tool_parser="hermes")

    asyncio.run(managed.chat_completion(messages=QUESTION, tools=SMALL_TOOLS, max_tokens=2))
    node = managed.get_state()["nodes"][0]
    expected = tok.apply_chat_template(
        QUESTION, tools=SMALL_TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert node.full_text.startswith(expected)
    assert "# Tools" not in node.full_text, "no fallback block when the template renders tools"


@pytest.mark.parametrize(
    ("before", "calls"),
    [
        ("", [("add", {"a": 2, "b": 5})]),
        ("Let me add.\n", [("add", {"a": 2, "b": 5}), ("add", {"a": 7, "b": 0})]),
    ],
)
def test_hermes_tool_calls_come_back_as_openai_tool_calls(script, tokenizer, before, calls):
    blocks = "\n".join(
        f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
        for name, args in calls
    )
    output = ids(tokenizer, before + blocks) + [tokenizer.eos_token_id]
    server = script((output, "stop"))
    managed = managed_over(server.url, tokenizer, tool_parser="hermes")

    chat = asyncio.run(managed.chat_completion(messages=QUESTION, tools=TOOLS, tool_choice="auto"))
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == (before or None)
    got = choice.message.tool_calls
    assert [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in got] == [
        (name, args) for name, args in calls
    ]
    assert [tc.function.name for tc in got] == [name for name, _ in calls], "SDK-style access"
    assert all(tc["type"] == "function" and tc["id"] for tc in got)
    assert len({tc["id"] for tc in got}) == len(got)
    node = managed.get_state()["nodes"][0]
    assert node.full_text.endswith(before + blocks + "<|im_end|>"), "nodes keep the raw text"
    assert node.masked_tokens[-len(output) :] == output
    assert node.logprobs[-len(output) :] == [LOGPROB] * len(output)
    assert server.requests[0]["prompt"] == node.tokens[: -len(output)]


@pytest.mark.parametrize(
    ("text", "tool_choice"),
    [(CALL_TEXT, "none"), ("<tool_call>not json</tool_call>", "auto"), ("7", "auto")],
)
def test_text_that_is_not_a_call_stays_content(script, tokenizer, text, tool_choice):
    server = script((ids(tokenizer, text) + [tokenizer.eos_token_id], "stop"))
    managed = managed_over(server.url, tokenizer, tool_parser="hermes")

    chat = asyncio.run(
        managed.chat_completion(messages=QUESTION, tools=TOOLS, tool_choice=tool_choice)
    )
    assert chat.choices[0].message.tool_calls is None
    assert chat.choices[0].message.content == text
    assert chat.choices[0].finish_reason == "stop"


def test_a_two_turn_tool_conversation_extends_one_node(script, tokenizer):
    # compact JSON: only the remembered text, not a rebuilt call, re-renders it exactly
    call = '<tool_call>{"name":"add","arguments":{"a":2,"b":5}}</tool_call>'
    first_out = ids(tokenizer, call) + [tokenizer.eos_token_id]
    second_out = ids(tokenizer, "7") + [tokenizer.eos_token_id]
    server = script((first_out, "stop"), (second_out, "stop"))
    manager = ServerManager([server_config(server.url)])
    manager.tool_parser = "hermes"  # as upstream environments switch tools on

    async def scenario():
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_completion(messages=QUESTION, tools=TOOLS)
            turn_one = managed.get_state()["nodes"][0]
            message = first.choices[0].message
            history = [
                *QUESTION,
                {
                    "role": "assistant",
                    "content": message.content or "",
                    "tool_calls": message.tool_calls,
                },
                {"role": "tool", "tool_call_id": message.tool_calls[0]["id"], "content": "7"},
            ]
            second = await managed.chat_completion(messages=history, tools=TOOLS)
            return turn_one, second, managed.get_state()["nodes"]

    turn_one, second, nodes = asyncio.run(scenario())
    assert second.choices[0].message.content == "7"
    assert len(nodes) == 1, "the second turn extends the first turn's node"
    node = nodes[0]
    done = len(turn_one.tokens)
    assert node.tokens[:done] == turn_one.tokens
    assert node.masked_tokens[:done] == turn_one.masked_tokens
    assert turn_one.masked_tokens[-len(first_out) :] == first_out, "the call is trained on"
    suffix = node.masked_tokens[done : -len(second_out)]
    assert suffix and set(suffix) == {-100}, "the tool result is prompt, masked"
    assert node.masked_tokens[-len(second_out) :] == second_out
    assert node.logprobs[done : -len(second_out)] == [1.0] * len(suffix)
    assert "<tool_response>\n7\n</tool_response>" in tokenizer.decode(
        node.tokens[done : -len(second_out)]
    )
    assert server.requests[1]["prompt"] == node.tokens[: -len(second_out)]


def test_max_completion_tokens_is_sent_as_max_tokens(script, tokenizer):
    server = script((ids(tokenizer, "7"), "length"))
    managed = managed_over(server.url, tokenizer)

    chat = asyncio.run(managed.chat_completion(messages=QUESTION, max_completion_tokens=5))
    assert server.requests[0]["max_tokens"] == 5
    assert "max_completion_tokens" not in server.requests[0]
    assert chat.choices[0].finish_reason == "length"


def test_an_unknown_tool_parser_is_a_clear_error(tokenizer):
    server = VLLMServer(server_config("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="unknown tool parser 'llama3_json'.*hermes"):
        ManagedServer(server, tokenizer, tool_parser="llama3_json")


def think_stripping_tokenizer(tiny_model_path):
    """Like Qwen3's template: earlier assistant turns lose their `<think>` block."""
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_path)
    tok.chat_template = (
        "{% for message in messages %}{% set content = message['content'] %}"
        "{% if message['role'] == 'assistant' and '</think>' in content %}"
        "{% set content = content.split('</think>')[-1] %}{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    return tok


@pytest.mark.parametrize(("preserve", "node_count"), [(False, 1), (True, 2)])
def test_think_blocks_are_kept_for_extension_unless_the_template_handles_them(
    script, tiny_model_path, preserve, node_count
):
    tok = think_stripping_tokenizer(tiny_model_path)
    reply = ids(tok, "<think>2 + 5</think>7") + [tok.eos_token_id]
    server = script((reply, "stop"), (ids(tok, "9") + [tok.eos_token_id], "stop"))
    managed = managed_over(server.url, tok, preserve_think_blocks=preserve)

    async def scenario():
        first = await managed.chat_completion(messages=QUESTION)
        history = [
            *QUESTION,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And 4 + 5?"},
        ]
        await managed.chat_completion(messages=history)
        return managed.get_state()["nodes"]

    nodes = asyncio.run(scenario())
    assert len(nodes) == node_count
    assert ("<think>2 + 5</think>7" in nodes[-1].full_text) is (not preserve)
