"""Structured outputs through the real `openai` client: `response_format` (json_object,
json_schema), vLLM's `guided_*` fields and `structured_outputs`, on the default model (the
server run.sh started) and on the tiny fixture at tp=4 dcp=2, with and without n-gram
speculation. Every sampled output must parse and validate against its schema with
`jsonschema`; the requests of a batch run concurrently to keep the suite short."""

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from conftest import TINY_TP4_DCP2, start_server

SAMPLES = 50

# Bounded strings, arrays and numbers (maxLength, maxItems, enums, bounds) so that even a
# random model finishes well within max_tokens; validation is the full schema.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "verified": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "verified"],
    "additionalProperties": False,
}

PLACE = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 9999},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "location": {
            "type": "object",
            "properties": {
                # A bounded number with finitely many digits (multipleOf): free
                # fraction digits would let a sampled model write digits forever.
                "lat": {"type": "number", "minimum": -90, "maximum": 90, "multipleOf": 0.25},
                "lon": {"type": "integer", "minimum": -180, "maximum": 180},
            },
            "required": ["lat", "lon"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "tags", "location"],
    "additionalProperties": False,
}

ORDER = {
    "type": "object",
    "properties": {
        "lines": {
            "type": "array",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "qty", "gift"],
                "additionalProperties": False,
            },
        },
        "status": {"enum": ["open", "paid", "shipped"]},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]},
    },
    "required": ["lines", "status", "note"],
    "additionalProperties": False,
}

SCHEMAS = {"person": PERSON, "place": PLACE, "order": ORDER}

PROMPT = [{"role": "user", "content": "Describe one example record as JSON."}]


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def concurrently(fn, n: int):
    with ThreadPoolExecutor(max_workers=min(n, 25)) as pool:
        return list(pool.map(fn, range(n)))


def sampled_json(client, model, schema, max_tokens, messages=PROMPT, n=SAMPLES):
    def one(i):
        r = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=1.0,
            seed=1000 + i,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "record", "schema": schema, "strict": True},
            },
        )
        return r.choices[0]

    return concurrently(one, n)


def check_all_valid(choices, schema):
    for c in choices:
        assert c.finish_reason == "stop", f"did not finish: {c.message.content!r}"
        value = json.loads(c.message.content)
        jsonschema.validate(value, schema)
    # Temperature 1: the samples are not all the same.
    assert len({c.message.content for c in choices}) > 1


def check_regex_choice_object(client, model, max_tokens):
    def regex(i):
        return client.completions.create(
            model=model, prompt="Call me at ", max_tokens=max_tokens, temperature=1.0, seed=i,
            extra_body={"guided_regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"},
        ).choices[0]

    for c in concurrently(regex, 16):
        assert c.finish_reason == "stop"
        assert re.fullmatch(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", c.text), c.text

    colors = ["red", "green", "blue", "dark purple"]

    def choice(i):
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Pick a color."}],
            max_tokens=max_tokens, temperature=1.0, seed=i,
            extra_body={"guided_choice": colors},
        ).choices[0]

    picked = [c.message.content for c in concurrently(choice, 16)]
    assert all(p in colors for p in picked), picked

    def obj(i):
        return client.chat.completions.create(
            model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0.7, seed=i,
            response_format={"type": "json_object"},
        ).choices[0]

    for c in concurrently(obj, 8):
        # An unbounded object may run out of tokens; whatever finishes is an object.
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.message.content), dict), c.message.content
        else:
            assert c.message.content.startswith("{")


# --- the default model (server from run.sh) ------------------------------------------


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_default_model_sampled_outputs_validate(client, model, name):
    check_all_valid(sampled_json(client, model, SCHEMAS[name], max_tokens=200), SCHEMAS[name])


def test_default_model_regex_choice_and_json_object(client, model):
    check_regex_choice_object(client, model, max_tokens=40)


def test_guided_json_and_structured_outputs_fields(client, model):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    for extra in [
        {"guided_json": schema},
        {"guided_json": json.dumps(schema)},
        {"structured_outputs": {"json": schema}},
    ]:
        r = client.chat.completions.create(
            model=model, messages=PROMPT, max_tokens=20, temperature=0.0, extra_body=extra)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.completions.create(
        model=model, prompt="The answer is", max_tokens=10, temperature=0.0,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].text in ("yes", "no")
    r = client.completions.create(
        model=model, prompt="Count: ", max_tokens=20, temperature=0.0,
        extra_body={"guided_grammar": 'start: "one" | "one, " item | "one, " item ", " item\nitem: "two" | "three"'})
    assert r.choices[0].finish_reason == "stop"
    assert re.fullmatch(r"one(, (two|three)){0,2}", r.choices[0].text), r.choices[0].text
    # `text` is no constraint at all.
    r = client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=5, response_format={"type": "text"})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_streaming_equals_whole_for_a_greedy_constrained_request(client, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    whole = client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=100, temperature=0.0, response_format=fmt)
    parts, finish = [], None
    for chunk in client.chat.completions.create(
        model=model, messages=PROMPT, max_tokens=100, temperature=0.0, response_format=fmt,
        stream=True,
    ):
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), PERSON)

    args = dict(model=model, prompt="A phone number: ", max_tokens=30, temperature=0.0,
                extra_body={"guided_regex": r"\+1 [0-9]{3} [0-9]{4}"})
    text = client.completions.create(**args).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert streamed == text and re.fullmatch(r"\+1 [0-9]{3} [0-9]{4}", text)


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
         "response_format constraint cannot be compiled"),
        ({"guided_json": "{not json"}, "not valid JSON"),
        ({"guided_regex": "(unclosed"}, "guided_regex constraint cannot be compiled"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar constraint cannot be compiled"),
        ({"guided_choice": []}, "non-empty list"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "Only one kind of structured output"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
         "Only one kind of structured output"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"guided_regex": "a+", "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_bad_constraints_are_400(client, model, extra, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=PROMPT, max_tokens=5, extra_body=extra)
    assert e.value.status_code == 400
    assert needle in e.value.body["message"], e.value.body["message"]


# --- the tiny fixture at tp=4 dcp=2, with and without n-gram speculation ------------


@pytest.fixture(scope="module")
def tiny_tp4_dcp2(tmp_path_factory):
    yield from start_server(tmp_path_factory.mktemp("tiny"), TINY_TP4_DCP2)


@pytest.fixture(scope="module")
def tiny_tp4_dcp2_ngram(tmp_path_factory):
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
    yield from start_server(
        tmp_path_factory.mktemp("tiny-ngram"), TINY_TP4_DCP2 + ["--speculative-config", spec])


def tiny_client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_tiny_tp4_dcp2_sampled_outputs_validate(tiny_tp4_dcp2, name):
    c = tiny_client(tiny_tp4_dcp2)
    check_all_valid(sampled_json(c, "tiny", SCHEMAS[name], max_tokens=400), SCHEMAS[name])


def test_tiny_tp4_dcp2_regex_choice_and_json_object(tiny_tp4_dcp2):
    check_regex_choice_object(tiny_client(tiny_tp4_dcp2), "tiny", max_tokens=60)


# A prompt full of JSON in the schema's shape: the n-gram proposer finds continuations in
# it, so drafts are proposed (and the grammar rejects many of them).
SPEC_PROMPT = [{"role": "user", "content": " ".join(
    json.dumps({"name": n, "age": a, "role": r, "verified": v})
    for n, a, r, v in [("ann", 31, "admin", True), ("bob", 7, "user", False),
                       ("cy", 52, "guest", True), ("dee", 18, "user", True)]
)}]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_tiny_tp4_dcp2_ngram_speculation_outputs_validate(tiny_tp4_dcp2_ngram, name):
    c = tiny_client(tiny_tp4_dcp2_ngram)
    before = metric(tiny_tp4_dcp2_ngram, "dcpserve:spec_decode_num_draft_tokens_total")
    choices = sampled_json(c, "tiny", SCHEMAS[name], max_tokens=400, messages=SPEC_PROMPT)
    check_all_valid(choices, SCHEMAS[name])
    drafted = metric(tiny_tp4_dcp2_ngram, "dcpserve:spec_decode_num_draft_tokens_total") - before
    assert drafted > 0, "the n-gram proposer drafted nothing: speculation was not exercised"


def test_tiny_tp4_dcp2_ngram_greedy_equals_no_speculation(tiny_tp4_dcp2, tiny_tp4_dcp2_ngram):
    # Greedy decoding under a grammar is the same with and without drafts.
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    outs = [
        tiny_client(url).chat.completions.create(
            model="tiny", messages=SPEC_PROMPT, max_tokens=200, temperature=0.0,
            response_format=fmt).choices[0].message.content
        for url in (tiny_tp4_dcp2, tiny_tp4_dcp2_ngram)
    ]
    assert outs[0] == outs[1]
    jsonschema.validate(json.loads(outs[0]), PERSON)
