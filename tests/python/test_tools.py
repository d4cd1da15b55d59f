"""Tool calls and reasoning content through the real `openai` client.

Forced tool calls (a named function, and `tool_choice: "required"`) are generated under the
JSON schema of the tools' parameters by the grammar engine, so their arguments must parse
and validate with `jsonschema`: on the default model (the server run.sh started), on the
tiny fixture at tp=4 dcp=2, and with n-gram speculation. A streamed call reassembled by
the client equals the non-streamed one (greedy). `tool_choice: "auto"` and the reasoning
parser are checked on a server with `--tool-call-parser hermes --enable-auto-tool-choice
--reasoning-parser qwen3`, where a `guided_regex` makes the small model write the Hermes
syntax (it would not on its own)."""

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from conftest import DEFAULT_MODEL, TINY_TP4_DCP2, start_server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days", "unit"],
    "additionalProperties": False,
}

BOOKING = {
    "type": "object",
    "properties": {
        "guests": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 10},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
                "additionalProperties": False,
            },
        },
        "vip": {"type": "boolean"},
    },
    "required": ["guests", "vip"],
    "additionalProperties": False,
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast of a city.",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Books a table at the restaurant.",
            "parameters": BOOKING,
        },
    },
]
SCHEMA = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]

SAMPLES = 12


def named(name):
    return {"type": "function", "function": {"name": name}}


def concurrently(fn, n):
    with ThreadPoolExecutor(max_workers=min(n, 16)) as pool:
        return list(pool.map(fn, range(n)))


def check_calls(choice, only=None):
    """The choice is tool calls only, each valid against its function's schema."""
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls, choice
    for c in calls:
        assert c.type == "function"
        assert c.id.startswith("call_") and len(c.id) > 10
        assert c.function.name in SCHEMA
        if only:
            assert c.function.name == only
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA[c.function.name])
    return calls


def forced_calls(client, model, tool_choice, n=SAMPLES, temperature=1.0, **kw):
    def one(i):
        r = client.chat.completions.create(
            model=model,
            messages=ASK,
            tools=TOOLS,
            tool_choice=tool_choice,
            max_tokens=300,
            temperature=temperature,
            seed=500 + i,
            **kw,
        )
        return r.choices[0]

    return concurrently(one, n)


def check_forced(client, model):
    for name in SCHEMA:
        for c in forced_calls(client, model, named(name)):
            calls = check_calls(c, only=name)
            assert len(calls) == 1
    finished = 0
    for c in forced_calls(client, model, "required"):
        if c.finish_reason == "length":
            # `required` bounds the number of calls from below only (vLLM's schema): a
            # sampled array can run on until max_tokens. Every call before the cut one
            # is complete and valid.
            calls = c.message.tool_calls
            assert calls and len(calls) >= 2, c
            for x in calls[:-1]:
                jsonschema.validate(json.loads(x.function.arguments), SCHEMA[x.function.name])
        else:
            check_calls(c)
            finished += 1
    assert finished >= 1


def streamed(client, **kw):
    """A streamed chat completion reassembled as a client does: content, reasoning and
    tool calls joined by index."""
    content, reasoning, calls, finish = "", "", [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += getattr(d, "reasoning_content", None) or ""
            for tc in d.tool_calls or []:
                if tc.id:
                    assert tc.index == len(calls)
                    assert tc.function.name
                    calls.append({"id": tc.id, "name": tc.function.name, "arguments": ""})
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return content, reasoning, calls, finish


def as_pairs(calls):
    return [(c.function.name, c.function.arguments) for c in calls or []]


# --- the default model (the server run.sh started) --------------------------------------


def test_forced_tool_calls_validate(client, model):
    check_forced(client, model)


def test_streamed_tool_call_equals_whole(client, model):
    for choice in [named("book_table"), "required"]:
        kw = dict(model=model, messages=ASK, tools=TOOLS, tool_choice=choice,
                  max_tokens=300, temperature=0.0)
        whole = client.chat.completions.create(**kw).choices[0]
        if choice != "required":
            # (Greedy `required` on this model repeats calls until max_tokens.)
            check_calls(whole)
        content, reasoning, calls, finish = streamed(client, **kw)
        assert (content, reasoning, finish) == ("", "", whole.finish_reason)
        assert [(c["name"], c["arguments"]) for c in calls] == as_pairs(whole.message.tool_calls)


def test_tool_results_go_back_through_the_template(client, model, base_url):
    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc123",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 3, "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc123", "content": "Sunny, 24 C, light wind"},
    ]
    r = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8,
        temperature=0.0)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content is not None
    # The rendered prompt has the tool's result.
    root = base_url.removesuffix("/v1")
    body = json.dumps({"model": model, "messages": messages, "tools": TOOLS}).encode()
    req = urllib.request.Request(root + "/tokenize", body, {"Content-Type": "application/json"})
    tokens = json.load(urllib.request.urlopen(req, timeout=30))["tokens"]
    body = json.dumps({"model": model, "tokens": tokens}).encode()
    req = urllib.request.Request(root + "/detokenize", body, {"Content-Type": "application/json"})
    prompt = json.load(urllib.request.urlopen(req, timeout=30))["prompt"]
    assert "Sunny, 24 C, light wind" in prompt
    assert r.usage.prompt_tokens == len(tokens)


@pytest.mark.parametrize(
    "kwargs,param,needle",
    [
        (dict(tools=TOOLS, tool_choice=named("nope")), "tool_choice", "nope"),
        (dict(tools=TOOLS, tool_choice="auto"), "tool_choice", "--enable-auto-tool-choice"),
        (dict(tools=TOOLS), "tool_choice", "--enable-auto-tool-choice"),
        (dict(tool_choice="required"), "tool_choice", "`tools` must be set"),
        (dict(tools=[{"type": "function", "function": {"description": "x"}}],
              tool_choice="none"), "tools", "name"),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": 3}}],
              tool_choice="none"), "tools", "parameters"),
        (dict(tools={"name": "f"}, tool_choice="none"), "tools", "list"),
        (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "must be"),
    ],
)
def test_bad_tool_requests_are_400(client, model, kwargs, param, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **kwargs)
    err = e.value.body
    assert err["param"] == param, err
    assert needle in err["message"], err


# --- the tiny fixture at tp=4 dcp=2, with and without n-gram speculation ---------------

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'


@pytest.fixture(scope="module")
def tiny_tools(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("tiny-tools"), TINY_TP4_DCP2)


@pytest.fixture(scope="module")
def tiny_tools_ngram(tmp_path_factory):
    yield from start_server(
        tmp_path_factory.mktemp("tiny-tools-ngram"),
        TINY_TP4_DCP2 + ["--speculative-config", NGRAM])


def tiny_client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_tiny_tp4_dcp2_forced_tool_calls_validate(tiny_tools):
    check_forced(tiny_client(tiny_tools), "tiny")


def test_tiny_tp4_dcp2_ngram_forced_tool_calls_validate(tiny_tools_ngram):
    check_forced(tiny_client(tiny_tools_ngram), "tiny")


def test_tiny_tp4_dcp2_streamed_tool_call_equals_whole(tiny_tools_ngram):
    c = tiny_client(tiny_tools_ngram)
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
              max_tokens=300, temperature=0.0)
    whole = c.chat.completions.create(**kw).choices[0]
    assert whole.message.tool_calls
    _, _, calls, finish = streamed(c, **kw)
    assert finish == whole.finish_reason
    assert [(x["name"], x["arguments"]) for x in calls] == as_pairs(whole.message.tool_calls)


# --- auto tool choice and reasoning (hermes + qwen3 parsers, n-gram speculation) -------


@pytest.fixture(scope="module")
def parsers_server(tmp_path_factory):
    yield from start_server(
        tmp_path_factory.mktemp("parsers"),
        [str(DEFAULT_MODEL), "--served-model-name", "smol-tools",
         "--kv-cache-memory-bytes", "134217728", "--max-model-len", "2048", "--threads", "2",
         "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
         "--reasoning-parser", "qwen3", "--speculative-config", NGRAM])


HERMES_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": '
    r'\{"city": "(Paris|Rome)", "days": [1-7], "unit": "celsius"\}\}\n</tool_call>'
)


def test_auto_tool_choice_parses_hermes_calls(parsers_server):
    c = tiny_client(parsers_server)
    kw = dict(model="smol-tools", messages=ASK, tools=TOOLS, max_tokens=120, temperature=0.0,
              extra_body={"guided_regex": "Checking\\.\\n" + HERMES_CALL})
    whole = c.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content == "Checking."
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    content, reasoning, calls, finish = streamed(c, **kw)
    assert (content, reasoning, finish) == ("Checking.", "", "tool_calls")
    assert [(x["name"], x["arguments"]) for x in calls] == as_pairs(whole.message.tool_calls)
    # Without a call in the output, the answer is content.
    plain = c.chat.completions.create(
        model="smol-tools", messages=ASK, tools=TOOLS, max_tokens=12, temperature=0.0,
        extra_body={"guided_regex": "It is sunny[.]"}).choices[0]
    assert (plain.message.content, plain.message.tool_calls) == ("It is sunny.", None)
    assert plain.finish_reason == "stop"
    # tool_choice "none": no parsing, even of the syntax.
    none = c.chat.completions.create(tool_choice="none", **kw).choices[0]
    assert none.message.tool_calls is None and "<tool_call>" in none.message.content


def test_reasoning_content_is_split_off(parsers_server):
    c = tiny_client(parsers_server)
    kw = dict(model="smol-tools", messages=ASK, max_tokens=60, temperature=0.0,
              extra_body={"guided_regex": "<think>\\nThe user asks [a-z ]{3,20}\\.\\n</think>\\n\\nSunny[.]"})
    m = c.chat.completions.create(**kw).choices[0].message
    assert m.reasoning_content.startswith("\nThe user asks ")
    assert m.content == "\n\nSunny."
    content, reasoning, calls, _ = streamed(c, **kw)
    assert (content, reasoning, calls) == (m.content, m.reasoning_content, [])
