"""A client that goes away frees its sequence everywhere: after a long generation is cancelled
after its first tokens (or requests are cancelled during their prefill), every stage reports
kv_blocks_used == 0 (heartbeats every 200 ms), nothing runs, and the cluster still serves. Also: a
SIGTERM drains the coordinator, and a stray Deliver stream must not take the pipeline's results."""
import time

import pytest

# grpc comes through cluster, which skips the module when grpcio is missing
from cluster import LONG_FLAGS, Client, collect, grpc, scaled, single_process, wait_until

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6long", *LONG_FLAGS)


def kv_idle(cl):
    s = cl.status()
    st = s["stages"]
    if s["requests_running"] == 0 and s["requests_queued"] == 0 and st and \
            all(x["kv_blocks_used"] == 0 for x in st):
        return s
    return False


@pytest.mark.parametrize("stages", [2, 3])
def test_cancel_frees_kv_on_every_stage(model, cluster_factory, stages):
    cl = cluster_factory(model, stages=stages)
    c = cl.client()
    wait_until(lambda: kv_idle(cl), scaled(5), "an idle cluster before the test")

    prompt = list(range(3, 3 + 40))  # a few KV blocks on every stage
    # long enough (up to the context end) to still run while Status is polled
    call = c.stream(c.request(prompt_ids=prompt, max_tokens=4000, ignore_eos=True), timeout=120)
    got = []
    seen_busy = None
    for r in call:
        got.extend(r.ids)
        if len(got) >= 3 and seen_busy is None:
            # the sequence holds KV blocks while it runs (a heartbeat may lag by 200 ms)
            seen_busy = wait_until(
                lambda: (lambda s: s if all(x["kv_blocks_used"] > 0 for x in s["stages"])
                         and s["requests_running"] == 1 else False)(cl.status()),
                scaled(3), "the running request's KV blocks in Status")
            break
    assert len(got) >= 3, f"the stream ended after {len(got)} tokens"
    call.cancel()
    t0 = time.monotonic()
    try:
        rest = sum(len(r.ids) for r in call)
        pytest.fail(f"the stream ended OK after cancel ({len(got) + rest} tokens): too short?")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.CANCELLED

    idle = wait_until(lambda: kv_idle(cl), scaled(5),
                      "kv_blocks_used == 0 on every stage and no request running after cancel",
                      interval=0.1)
    elapsed = time.monotonic() - t0
    assert all(x["healthy"] for x in idle["stages"]), idle
    assert all(x["kv_blocks_total"] > 0 for x in idle["stages"]), idle
    assert elapsed < scaled(5)

    # the freed slots serve a new request exactly
    ref, _ = single_process(cl.model, prompt, 20)
    r = c.generate(c.request(prompt_ids=prompt, max_tokens=20), timeout=60)
    assert r.code == grpc.StatusCode.OK, r
    assert r.ids == ref["ids"]
    wait_until(lambda: kv_idle(cl), scaled(5), "KV freed after a finished request")


def test_stray_deliver_stream_does_not_take_the_results(model, cluster_factory, protos):
    """Something other than the last stage opens Coordinator/Deliver (and sends nothing): the
    pipeline's results must still reach their requests."""
    import queue
    cl = cluster_factory(model, stages=2)
    c = cl.client()
    prompt = [1, 2, 3]
    ref, _ = single_process(cl.model, prompt, 5)
    ch = grpc.insecure_channel(cl.addr, options=[("grpc.enable_http_proxy", 0)])
    q = queue.Queue()
    fut = ch.stream_unary("/ppserve.v1.Coordinator/Deliver", request_serializer=lambda b: b,
                          response_deserializer=lambda b: b).future(iter(q.get, None),
                                                                     timeout=scaled(60))
    try:
        time.sleep(0.3)
        r = c.generate(c.request(prompt_ids=prompt, max_tokens=5), timeout=2)
        assert r.code == grpc.StatusCode.OK and r.ids == ref["ids"], r
    finally:
        q.put(None)
        fut.cancel()
        ch.close()


def test_cancel_during_prefill(model, cluster_factory):
    """Twenty requests cancelled within milliseconds, most of them still in their (chunked)
    prefill: nothing stays behind on any stage."""
    cl = cluster_factory(model, stages=3, coord_flags=("--max_batch_tokens", "16"))
    c = cl.client()
    prompt = list(range(3, 103))
    calls = []
    for i in range(20):
        calls.append(c.stream(c.request(prompt_ids=prompt, max_tokens=100), timeout=60))
        time.sleep(0.002 * i)
        calls[-1].cancel()
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            for _ in call:
                pass
        assert e.value.code() == grpc.StatusCode.CANCELLED
    wait_until(lambda: kv_idle(cl), scaled(5), "every stage's KV freed after the cancels",
               interval=0.1)
    ref, _ = single_process(cl.model, prompt, 10)
    r = c.generate(c.request(prompt_ids=prompt, max_tokens=10))
    assert r.code == grpc.StatusCode.OK and r.ids == ref["ids"], r


def test_sigterm_drains_the_coordinator(model, cluster_factory, protos):
    """SIGTERM: requests in flight finish, new ones get UNAVAILABLE, health says so, exit 0."""
    import signal
    import threading
    cl = cluster_factory(model, stages=2, coord_flags=("--grace_ms", str(int(scaled(8000)))))
    c = cl.client()
    prompt = [1, 2, 3]
    ref, _ = single_process(cl.model, prompt, 200)
    got = {}
    call = c.stream(c.request(prompt_ids=prompt, max_tokens=200), timeout=60)
    first = next(call)  # it runs
    th = threading.Thread(target=lambda: got.update(r=collect(call, protos.client)))
    th.start()
    cl.coordinator.expect_death = True
    cl.coordinator.signal(signal.SIGTERM)
    t0 = time.monotonic()
    time.sleep(0.05)
    fresh = Client(protos, cl.addr)
    try:
        r = fresh.generate(fresh.request(prompt_ids=prompt, max_tokens=5), timeout=10)
    finally:
        fresh.close()
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.ids == [], r
    th.join(scaled(30))
    done = got["r"]
    assert done.code == grpc.StatusCode.OK, done
    assert list(first.ids) + done.ids == ref["ids"], "the request in flight was cut or changed"
    assert cl.coordinator.proc.wait(scaled(20)) == 0
    assert time.monotonic() - t0 < scaled(10)
