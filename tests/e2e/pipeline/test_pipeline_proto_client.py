"""A client written from client.proto alone (protoc --python_out, grpcio's generic calls, no
generated stubs) can generate text, tokenize and read the status: the .proto is the whole
contract."""
import json

import pytest

# grpc comes through cluster, which skips the module when grpcio is missing
from cluster import MODEL_FLAGS, PPSERVE, grpc, json_line, scaled, single_process, wait_until
from conftest import run

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


PROMPTS = ["The quick brown fox", "hello world, ünïcödé ✓", "a"]


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


@pytest.fixture(scope="module")
def cl(model, module_clusters):
    return module_clusters(model, stages=2, layers=[4, 2])


def run_text(model, prompt, max_tokens, *flags):
    p = run([PPSERVE, "run", "--model", str(model), "--prompt", prompt, "--max-tokens",
             str(max_tokens), "--json", "--threads", "1", *flags])
    return json.loads(json_line(p.stdout))


@pytest.mark.parametrize("prompt", PROMPTS)
def test_generate_text_prompt(cl, protos, prompt):
    c = cl.client()
    ref = run_text(cl.model, prompt, 30, "--ignore-eos")
    r = c.generate(c.request(prompt=prompt, max_tokens=30, ignore_eos=True))
    assert r.code == grpc.StatusCode.OK, r
    assert r.prompt_ids == ref["prompt_ids"], "the coordinator tokenized differently"
    assert r.ids == ref["ids"]
    assert r.finish == protos.client.FINISH_REASON_LENGTH
    # protobuf already refused invalid UTF-8 in a string field; the text is the same as run's
    assert r.text and r.text == ref["text"]
    assert "\ufffd" not in r.text or "\ufffd" in ref["text"]
    # the stream's shape: prompt_ids on the first response only, usage and finish on the last
    assert r.responses[0].prompt_ids
    assert all(not x.prompt_ids for x in r.responses[1:])
    assert all(not x.finish_reason and not x.HasField("usage") for x in r.responses[:-1])
    u = r.usage
    assert u.prompt_tokens == len(ref["prompt_ids"]) and u.completion_tokens == 30
    assert u.decode_tokens_per_s > 0


def test_generate_stops_like_run(cl, protos):
    """Without ignore_eos and with a stop string taken from the greedy text, both end alike."""
    c = cl.client()
    prompt = "once upon a time"
    base = run_text(cl.model, prompt, 60, "--ignore-eos")
    text = base["text"]
    cands = [text[i:i + 2] for i in range(len(text) // 2, len(text) - 2)
             if "\ufffd" not in text[i:i + 2] and text.index(text[i:i + 2]) > 0]
    assert cands, f"no usable stop string in {text!r}"
    ref = run_text(cl.model, prompt, 60, "--stop", cands[0])
    r = c.generate(c.request(prompt=prompt, max_tokens=60, ignore_eos=False, stop=[cands[0]]))
    assert r.code == grpc.StatusCode.OK, r
    assert (r.ids, r.text, {1: "length", 2: "stop"}[r.finish]) == \
        (ref["ids"], ref["text"], ref["finish_reason"])


def test_tokenize(cl, protos, model):
    c = cl.client()
    pb = protos.client
    for text in PROMPTS:
        want = json.loads(run([PPSERVE, "tokenize", "--model", str(cl.model), "--json",
                               "--text", text]).stdout)["ids"]
        got = c.tokenize(pb.TokenizeRequest(text=text), timeout=10)
        assert list(got.ids) == want
        no_bos = c.tokenize(pb.TokenizeRequest(text=text, bos=pb.BOS_MODE_NONE), timeout=10)
        add = c.tokenize(pb.TokenizeRequest(text=text, bos=pb.BOS_MODE_ADD), timeout=10)
        assert list(add.ids) == [1] + list(no_bos.ids)
        assert want in (list(add.ids), list(no_bos.ids))


def test_status(cl, protos):
    s = cl.client().status()
    assert s.state == "serving"
    assert s.model == "model.gguf"
    assert len(s.model_id) >= 8
    inspect = run([PPSERVE, "inspect", "--model", str(cl.model)]).stdout
    assert s.model_id in inspect, "Status.model_id is not the identity `ppserve inspect` shows"
    assert [(x.index, x.first_layer, x.last_layer) for x in s.stages] == [(0, 0, 4), (1, 4, 6)]
    for x in s.stages:
        assert x.healthy and x.address and x.kv_blocks_total > 0

    # the generate tests above ran through every stage; heartbeats (every second) bring the
    # counters, so the last of them may arrive after this test starts
    def counted():
        st = cl.client().status()
        return st if all(x.bytes_in > 0 for x in st.stages) else None
    wait_until(counted, scaled(5), "every stage to report the bytes it received")
    # the standard health service answers too
    h = protos.health
    ch = grpc.insecure_channel(cl.addr, options=[("grpc.enable_http_proxy", 0)])
    check = ch.unary_unary("/grpc.health.v1.Health/Check",
                           request_serializer=h.HealthCheckRequest.SerializeToString,
                           response_deserializer=h.HealthCheckResponse.FromString)
    assert check(h.HealthCheckRequest(service=""), timeout=5).status == \
        h.HealthCheckResponse.SERVING
    ch.close()


@pytest.mark.parametrize("n_prompt,max_tokens,want", [(250, 20, 6), (255, 5, 1), (200, 0, 56),
                                                      (10, 0, 128)])
def test_context_end_and_default_max_tokens(cl, protos, n_prompt, max_tokens, want):
    """Generation stops at the context end (finish LENGTH) as in `ppserve run`; max_tokens 0 is
    the coordinator's default (128), capped by the context too."""
    c = cl.client()
    prompt = [3 + i % 500 for i in range(n_prompt)]
    ref, _ = single_process(cl.model, prompt, max(max_tokens, 128))
    r = c.generate(c.request(prompt_ids=prompt, max_tokens=max_tokens))
    assert r.code == grpc.StatusCode.OK, r
    assert len(r.ids) == want and r.ids == ref["ids"][:want]
    assert r.finish == protos.client.FINISH_REASON_LENGTH
