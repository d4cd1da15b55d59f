"""The HTTP API through the real `openai` client, against `dcpserve serve` on the default
model (SmolLM2-135M-Instruct), plus a two-model config file."""

import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_models(client, model):
    models = client.models.list()
    assert [m.id for m in models.data] == [model]
    assert models.data[0].object == "model"


def test_completion(client, model):
    r = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_prompt_list_and_token_ids(client, model):
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is" in SmolLM2's vocabulary
    r = client.completions.create(
        model=model, prompt=["Hello", "The capital of France is"], max_tokens=4, temperature=0
    )
    assert [c.index for c in r.choices] == [0, 1]
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.choices[0].text == r.choices[1].text
    nested = client.completions.create(model=model, prompt=[ids, ids[:2]], max_tokens=4, temperature=0)
    assert nested.usage.prompt_tokens == len(ids) + 2


def test_chat(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=32, temperature=0
    )
    msg = r.choices[0].message
    assert msg.role == "assistant"
    assert "Paris" in msg.content
    assert r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion"


def test_chat_streaming_matches_whole(client, model):
    whole = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=16, temperature=0
    )
    stream = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_completion_streaming(client, model):
    pieces = [
        c.choices[0].text
        for c in client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True
        )
        if c.choices
    ]
    whole = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=12, temperature=0
    )
    assert "".join(pieces) == whole.choices[0].text
    assert len(pieces) > 1


def test_logprobs_and_echo(client, model):
    prompt = "The capital of France is"
    n_prompt = client.completions.create(model=model, prompt=prompt, max_tokens=1).usage.prompt_tokens
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=2, temperature=0, echo=True, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith(prompt)
    assert len(lp.tokens) == n_prompt + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 4 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in content)
    # Greedy: the chosen token is the most likely one.
    assert all(abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4 for t in content)


def test_n_choices_with_seed(client, model):
    kw = dict(model=model, prompt="My favourite colour is", max_tokens=6, temperature=1.0, n=3, seed=11)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]


def test_stop_sequences(client, model):
    whole = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=32, temperature=0
    ).choices[0].message.content
    assert " of " in whole
    r = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=32, temperature=0, stop=[" of "]
    )
    assert r.choices[0].message.content == whole[: whole.index(" of ")]
    assert r.choices[0].finish_reason == "stop"
    # And while streaming.
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=32, temperature=0, stop=" of ", stream=True
        )
        if c.choices
    )
    assert text == whole[: whole.index(" of ")]


def test_extra_vllm_parameters(client, model):
    r = client.completions.create(
        model=model,
        prompt="Hi",
        max_tokens=5,
        temperature=0.8,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        extra_body={"top_k": 20, "min_p": 0.05, "ignore_eos": True, "min_tokens": 5, "repetition_penalty": 1.2},
    )
    assert r.usage.completion_tokens == 5


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(max_tokens=5000), "maximum context length is 2048 tokens"),
        (dict(logprobs=21), "max allowed: 20"),
        (dict(n=0), "n must be at least 1"),
        (dict(temperature=-1.0), "temperature must be non-negative"),
        (dict(top_p=1.5), "top_p must be in (0, 1]"),
        (dict(prompt=""), "empty"),
    ],
)
def test_bad_requests(client, model, kwargs, needle):
    args = dict(model=model, prompt="Hello", max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)
    assert e.value.status_code == 400
    assert needle in e.value.body["message"]


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)
    assert e.value.body["message"] == "The model `gpt-17` does not exist."


def test_server_still_serves_after_errors(client, model):
    r = client.completions.create(model=model, prompt="Hello", max_tokens=2)
    assert r.usage.completion_tokens >= 1


def test_two_models_from_a_config_file(config_server):
    anon = openai.OpenAI(base_url=config_server, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        anon.models.list()
    c = openai.OpenAI(base_url=config_server, api_key="test-key", max_retries=0, timeout=120)
    assert [m.id for m in c.models.list().data] == ["smollm2", "tiny"]
    # smollm2 takes temperature 0 and 8 tokens from its [models.sampling] defaults.
    r = c.completions.create(model="smollm2", prompt="The capital of France is")
    assert r.model == "smollm2" and "Paris" in r.choices[0].text
    assert r.usage.completion_tokens <= 8
    t = c.completions.create(model="tiny", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True})
    assert t.model == "tiny" and t.usage.completion_tokens == 3
    chat = c.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=3)
    assert chat.model == "tiny"
