"""Bad bytes and bad requests, at the coordinator's client API and directly on a stage's Forward
stream, each get the right gRPC status and a message that says what was wrong; the daemons keep
serving (a good request after each gives the single-process tokens)."""
import numpy as np
import pytest

# grpc comes through cluster, which skips the module when grpcio is missing
from cluster import (MODEL_CTX, MODEL_DIM, MODEL_FLAGS, MODEL_VOCAB, HopStream, collect, grpc,
                     scaled, single_process, wait_until)

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


C = grpc.StatusCode
GOOD_PROMPT = [1, 50, 60, 70, 80]


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


@pytest.fixture(scope="module")
def cl(model, module_clusters):
    return module_clusters(model, stages=3, layers=[2, 2, 2])


@pytest.fixture(scope="module")
def good_ids(cl):
    return single_process(cl.model, GOOD_PROMPT, 12)[0]["ids"]


def still_serves(cl, good_ids):
    c = cl.client()
    r = c.generate(c.request(prompt_ids=GOOD_PROMPT, max_tokens=12), timeout=60)
    assert r.code == C.OK and r.ids == good_ids, f"after the bad input: {r!r}"
    cl.check_alive()


# ---- the client API ----------------------------------------------------------------------------

def req(pb, **kw):
    sampling = kw.pop("sampling", {})
    r = pb.GenerateRequest(max_tokens=kw.pop("max_tokens", 4), sampling=pb.Sampling(**sampling))
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(r, k).extend(v)
        else:
            setattr(r, k, v)
    return r


# (name, request or raw bytes, code, words the message must contain)
def bad_requests(pb):
    ok = {"prompt_ids": [1, 2, 3]}
    return [
        ("malformed", b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", C.INVALID_ARGUMENT, []),
        ("truncated", b"\x0a\x10only-five", C.INVALID_ARGUMENT, []),
        ("too-long-ids", req(pb, prompt_ids=[5] * (MODEL_CTX + 44)), C.OUT_OF_RANGE,
         [str(MODEL_CTX + 44)]),
        ("too-long-text", req(pb, prompt="a b " * MODEL_CTX), C.OUT_OF_RANGE, []),
        ("both", req(pb, prompt="hi", prompt_ids=[1, 2]), C.INVALID_ARGUMENT, ["prompt"]),
        ("neither", req(pb), C.INVALID_ARGUMENT, ["prompt"]),
        ("id-vocab", req(pb, prompt_ids=[1, MODEL_VOCAB, 3]), C.INVALID_ARGUMENT,
         [str(MODEL_VOCAB)]),
        ("id-negative", req(pb, prompt_ids=[1, -7]), C.INVALID_ARGUMENT, ["-7"]),
        ("temperature", req(pb, **ok, sampling={"temperature": -1}), C.INVALID_ARGUMENT,
         ["temperature"]),
        ("top_p", req(pb, **ok, sampling={"top_p": 1.5}), C.INVALID_ARGUMENT, ["top_p"]),
        ("min_p", req(pb, **ok, sampling={"min_p": 1}), C.INVALID_ARGUMENT, ["min_p"]),
        ("repeat_penalty", req(pb, **ok, sampling={"repeat_penalty": -2}), C.INVALID_ARGUMENT,
         ["repeat_penalty"]),
        ("top_k", req(pb, **ok, sampling={"top_k": -1}), C.INVALID_ARGUMENT, ["top_k"]),
        ("9MiB", req(pb, prompt="x" * (9 << 20)), C.RESOURCE_EXHAUSTED, []),
    ]


CASES = ["malformed", "truncated", "too-long-ids", "too-long-text", "both", "neither", "id-vocab",
         "id-negative", "temperature", "top_p", "min_p", "repeat_penalty", "top_k", "9MiB"]


def norm(s):
    return s.lower().replace("-", "_").replace(" ", "_")


@pytest.mark.parametrize("case", CASES)
def test_generate_refuses(cl, protos, good_ids, case):
    c = cl.client()
    _, body, code, words = next(b for b in bad_requests(protos.client) if b[0] == case)
    if isinstance(body, bytes):
        call = c.generate_raw(body, timeout=30)
    else:
        call = c.stream(body, timeout=30)
    r = collect(call, protos.client)
    assert r.code == code, f"{case}: want {code}, got {r!r}"
    assert r.ids == [], f"{case}: tokens were generated"
    assert r.details.strip(), f"{case}: no message"
    for w in words:
        assert norm(w) in norm(r.details), f"{case}: {w!r} not in the message {r.details!r}"
    still_serves(cl, good_ids)


# ---- a stage's Forward stream ------------------------------------------------------------------

MB = 1 << 40  # microbatch ids far from the coordinator's


@pytest.fixture(scope="module")
def stages(cl):
    s = cl.status()
    return s["model_id"], sorted(s["stages"], key=lambda x: x["index"])


def refused(hs, code, timeout=10.0):
    """The stream refuses: it ends with code, or answers a HopAck carrying code. The message."""
    ev = hs.recv(timeout)
    if isinstance(ev, tuple):
        _, got, details = ev
        assert got == code, f"want the stream to end with {code}, got {got}: {details!r}"
        return details
    assert ev.code == code.value[0], f"want an ack with {code}, got {ev}"
    return ev.message


def activations(n, dim=MODEL_DIM, seed=0):
    return (np.random.default_rng(seed).standard_normal((n, dim)) * 0.1).astype("<f4").tobytes()


def part(pb, seq_id, pos, ids, last=False):
    """One sequence's part; every stage checks one token id per token (stage 0 against the
    payload, the last stage keeps them for the repetition penalty)."""
    return pb.SeqPart(seq_id=seq_id, pos=pos, n_tokens=len(ids), want_logits=last, token_ids=ids,
                      step=0)


def test_handshake_version(cl, protos, stages, good_ids):
    model_id, st = stages
    hs = HopStream(protos, st[1]["address"])
    hs.handshake(model_id, st[1]["first_layer"], version=99)
    msg = refused(hs, C.FAILED_PRECONDITION)
    assert "99" in msg and "version" in msg.lower(), msg
    hs.cancel()
    still_serves(cl, good_ids)


def test_handshake_model_id(cl, protos, stages, good_ids):
    model_id, st = stages
    wrong = "ppid1-" + "0" * 32
    hs = HopStream(protos, st[1]["address"])
    hs.handshake(wrong, st[1]["first_layer"])
    msg = refused(hs, C.FAILED_PRECONDITION)
    assert wrong in msg and model_id in msg, msg
    hs.cancel()
    still_serves(cl, good_ids)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_handshake_next_layer(cl, protos, stages, good_ids, index):
    model_id, st = stages
    hs = HopStream(protos, st[index]["address"])
    wrong = st[index]["first_layer"] + 1
    hs.handshake(model_id, wrong)
    msg = refused(hs, C.FAILED_PRECONDITION)
    assert str(wrong) in msg and str(st[index]["first_layer"]) in msg, msg
    hs.cancel()
    still_serves(cl, good_ids)


def test_malformed_bytes_after_handshake(cl, protos, stages, good_ids):
    model_id, st = stages
    hs = HopStream(protos, st[1]["address"])
    hs.handshake(model_id, st[1]["first_layer"])
    hs.send(b"\x12\x05\x0a\xff\xff\xff\xff")
    refused(hs, C.INVALID_ARGUMENT)
    hs.cancel()
    still_serves(cl, good_ids)


def test_malformed_first_message(cl, protos, stages, good_ids):
    _, st = stages
    hs = HopStream(protos, st[0]["address"])
    hs.send(b"\xff\xff\xff")
    refused(hs, C.INVALID_ARGUMENT)
    hs.cancel()
    still_serves(cl, good_ids)


def test_chunk_before_handshake(cl, protos, stages, good_ids):
    _, st = stages
    pb = protos.stage
    hs = HopStream(protos, st[1]["address"])
    hs.microbatch(MB + 1, [part(pb, 1, 0, [4, 5])], pb.DTYPE_F32, [2, MODEL_DIM], activations(2))
    msg = refused(hs, C.INVALID_ARGUMENT)
    assert "handshake" in msg.lower(), msg
    hs.cancel()
    still_serves(cl, good_ids)


@pytest.mark.parametrize("case", ["ids-to-middle", "f32-to-first", "shape-dim+1"])
def test_wrong_dtype_or_shape(cl, protos, stages, good_ids, case):
    model_id, st = stages
    pb = protos.stage
    index = 0 if case == "f32-to-first" else 1
    hs = HopStream(protos, st[index]["address"])
    hs.handshake(model_id, st[index]["first_layer"])
    seq = 555000 + index
    if case == "ids-to-middle":
        hs.microbatch(MB + 2, [part(pb, seq, 0, [1, 2, 3])], pb.DTYPE_TOKEN_IDS, [3],
                      np.array([1, 2, 3], dtype="<i4").tobytes())
    elif case == "f32-to-first":
        hs.microbatch(MB + 3, [part(pb, seq, 0, [1, 2, 3])], pb.DTYPE_F32, [3, MODEL_DIM],
                      activations(3))
    else:
        hs.microbatch(MB + 4, [part(pb, seq, 0, [1, 2, 3])], pb.DTYPE_F32, [3, MODEL_DIM + 1],
                      activations(3, MODEL_DIM + 1))
    refused(hs, C.INVALID_ARGUMENT)
    hs.cancel()
    still_serves(cl, good_ids)
    # nothing of the refused microbatch stayed behind (heartbeats bring kv_blocks_used, 200 ms)
    wait_until(lambda: all(x["kv_blocks_used"] == 0 for x in cl.status()["stages"]), scaled(5),
               "kv_blocks_used == 0 on every stage")


@pytest.mark.parametrize("index", [0, 1, 2])
def test_unknown_sequence(cl, protos, stages, good_ids, index):
    """A continuation (pos > 0) of a sequence the stage never saw is refused in an ack that names
    it; the stream and the stage go on (a second one gets its own ack, then a clean close)."""
    model_id, st = stages
    pb = protos.stage
    hs = HopStream(protos, st[index]["address"])
    hs.handshake(model_id, st[index]["first_layer"])
    last = index == len(st) - 1
    for k, seq in enumerate((987654321, 987654322)):
        mb = MB + 100 + 10 * index + k
        p = part(pb, seq, 5, [4, 9], last)
        if index == 0:
            hs.microbatch(mb, [p], pb.DTYPE_TOKEN_IDS, [2], np.array([4, 9], dtype="<i4").tobytes())
        else:
            hs.microbatch(mb, [p], pb.DTYPE_F32, [2, MODEL_DIM], activations(2, seed=k))
        ack = hs.recv(10)
        assert not isinstance(ack, tuple), f"the stream ended instead of acking: {ack}"
        assert ack.microbatch_id == mb
        assert ack.code in (C.NOT_FOUND.value[0], C.INVALID_ARGUMENT.value[0]), ack
        assert str(seq) in ack.message, ack
    hs.close()
    end = hs.recv(10)
    assert isinstance(end, tuple) and end[1] == C.OK, f"after the half-close: {end}"
    still_serves(cl, good_ids)
    s = cl.status()
    assert s["state"] == "serving" and all(x["healthy"] for x in s["stages"]), s


# ---- the coordinator's control plane (what stages call) ---------------------------------------

def unary(cl, method, resp_cls):
    """A Coordinator method that takes a message or raw bytes; returns (channel, callable)."""
    ch = grpc.insecure_channel(cl.addr, options=[("grpc.enable_http_proxy", 0)])
    return ch, ch.unary_unary(f"/ppserve.v1.Coordinator/{method}",
                              request_serializer=lambda m: m if isinstance(m, bytes)
                              else m.SerializeToString(),
                              response_deserializer=resp_cls.FromString)


def test_register_refusals(cl, protos, good_ids):
    pb = protos.stage
    ch, register = unary(cl, "RegisterStage", pb.RegisterResponse)
    cases = [(pb.RegisterRequest(protocol_version=99, advertised_address="127.0.0.1:1"),
              C.FAILED_PRECONDITION, "99"),
             (pb.RegisterRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                 advertised_address=""), C.INVALID_ARGUMENT,
              "advertised_address"),
             # the pipeline has its stages: a fourth one is not taken in
             (pb.RegisterRequest(protocol_version=pb.PROTOCOL_VERSION_CURRENT,
                                 advertised_address="127.0.0.1:9"),
              C.RESOURCE_EXHAUSTED, "stages"),
             (b"\x0a\xff\xff", C.INVALID_ARGUMENT, "")]
    try:
        for req, code, word in cases:
            with pytest.raises(grpc.RpcError) as e:
                register(req, timeout=10)
            assert e.value.code() == code, (req, e.value.details())
            assert word in e.value.details(), e.value.details()
    finally:
        ch.close()
    still_serves(cl, good_ids)
    assert cl.status()["state"] == "serving"


def test_heartbeat_from_an_unknown_stage(cl, protos, good_ids):
    pb = protos.stage
    ch, heartbeat = unary(cl, "Heartbeat", pb.HeartbeatResponse)
    try:
        r = heartbeat(pb.HeartbeatRequest(stage_id=424242, hop_error="made up"), timeout=10)
        assert r.unknown, "an unknown stage id must be told to register again"
    finally:
        ch.close()
    still_serves(cl, good_ids)
    assert cl.status()["state"] == "serving"
