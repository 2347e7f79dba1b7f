"""Failover: when a stage dies in the middle of generations, the requests the pipeline had accepted
wait for it to form again (failover_wait_ms) and then go on, prefilled again with their prompt and
the tokens they had generated, so each client's stream carries exactly the tokens of an
undisturbed run, greedy and sampled alike. A pipeline that does not come back in time fails them
with UNAVAILABLE saying so; new requests are refused while it is down."""
import signal
import time

import pytest

from cluster import LONG_FLAGS, BackgroundGeneration, Daemon, scaled, wait_until

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure

TIMEOUT_MS = 1500  # the coordinator's stage_timeout_ms
N = 600
REQUESTS = [  # (prompt, sampling): greedy, and sampled with a repetition penalty (history)
    ([1, 33, 66, 99, 132, 165, 198, 231], {}),
    ([5, 6, 7], dict(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.15, seed=1234)),
]


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6long", *LONG_FLAGS)


def references(c):
    out = []
    for prompt, sampling in REQUESTS:
        r = c.generate(c.request(prompt_ids=prompt, max_tokens=N, **sampling), timeout=120)
        assert r.code.name == "OK" and len(r.ids) == N, r
        out.append(r.ids)
    assert out[0] != out[1]
    return out


def add_stage(cl, tmp_path, name="stage-new"):
    d = Daemon(name, cl.stage_args("127.0.0.1:0"), tmp_path / f"{cl.tag}-{name}.log")
    cl.stages.append(d)
    cl.daemons.append(d)
    return d


@pytest.mark.parametrize("index", [0, 1], ids=["first", "last"])
def test_requests_survive_a_killed_stage(model, cluster_factory, tmp_path, index):
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS))
    c = cl.client()
    want = references(c)
    streams = [BackgroundGeneration(c, N, p, **s) for p, s in REQUESTS]
    wait_until(lambda: all(len(s.ids) >= 5 for s in streams), scaled(30), "the first tokens")
    victim = cl.stage_daemon(index)
    victim.expect_death = True
    victim.signal(signal.SIGKILL)
    victim.proc.wait(scaled(10))
    at_kill = [len(s.ids) for s in streams]
    t0 = time.monotonic()

    # while the pipeline is down, accepted requests wait, new ones are refused at once
    wait_until(lambda: cl.status()["state"] != "serving", scaled(10), "the pipeline to go down")
    fresh = c.generate(c.request(prompt_ids=[1, 2, 3], max_tokens=4), timeout=10)
    assert fresh.code.name == "UNAVAILABLE" and fresh.ids == [], fresh
    assert all(not s.end for s in streams), [s.end for s in streams]
    st = cl.status()
    assert st["requests_queued"] == 2, st
    assert "; 2 requests wait for the next pipeline (at most " in st["state"], st["state"]

    add_stage(cl, tmp_path)
    for s, w in zip(streams, want):
        end = s.join(120)
        assert end["code"] == "OK", (end, len(s.ids))
        assert s.ids == w, "tokens lost, repeated or changed across the failover"
    took = max(s.end["at"] for s in streams) - t0
    print(f"stage {index} killed after {at_kill} tokens; both generations done {took:.2f} s later")
    text = cl.coordinator.text()
    assert "failover: 2 requests (2 of them running) wait up to 30.0 s" in text, text[-3000:]
    assert cl.status()["state"] == "serving"
    again = c.generate(c.request(prompt_ids=REQUESTS[0][0], max_tokens=12), timeout=60)
    assert again.code.name == "OK" and again.ids == want[0][:12], again


def kill_the_last_stage_mid_generation(cluster_factory, model, wait_ms):
    """A 2-stage cluster with failover_wait_ms = wait_ms, a 4000-token generation, and SIGKILL to
    its last stage once 5 tokens are out; returns the cluster and the generation."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS,
                                                       "--failover_wait_ms", wait_ms))
    s = BackgroundGeneration(cl.client(), 4000, REQUESTS[0][0])
    wait_until(lambda: len(s.ids) >= 5, scaled(30), "the first tokens")
    victim = cl.stage_daemon(1)
    victim.expect_death = True
    victim.signal(signal.SIGKILL)
    return cl, s


def test_requests_fail_when_no_pipeline_forms_in_time(model, cluster_factory):
    wait_ms = 1500
    cl, s = kill_the_last_stage_mid_generation(cluster_factory, model, wait_ms)
    t0 = time.monotonic()
    end = s.join(60)
    took = end["at"] - t0
    print(f"failed {took:.2f} s after the kill: {end}")
    assert end["code"] == "UNAVAILABLE", end
    assert f"did not form again within failover_wait_ms={wait_ms}" in end["details"], end
    assert "stage" in end["details"], end
    assert wait_ms / 1000 <= took < scaled(wait_ms / 1000 + 5), took
    assert "failover: 1 requests waited 1.5 s for a new pipeline: they fail" in \
        cl.coordinator.text()


def test_status_keeps_the_cause_and_a_cancelled_wait_ends_quietly(model, cluster_factory):
    """While the pipeline re-forms, Status names why the last one ended, not why the latest
    attempt failed; a held request whose client goes away is forgotten, and the window then ends
    with nothing to fail."""
    wait_ms = 3000
    cl, s = kill_the_last_stage_mid_generation(cluster_factory, model, wait_ms)
    # setup's retries fail on the dead address until its silence drops it
    st = wait_until(lambda: (lambda x: x if "the last attempt failed: " in x["state"] else None)(
        cl.status()), scaled(10), "a failed attempt in Status")
    cause = st["state"].split("; the last pipeline ended: ")[1].split("; the last attempt")[0]
    assert "could not take layers" not in cause and "stage" in cause, st["state"]
    assert "; 1 requests wait for the next pipeline (at most " in st["state"], st["state"]
    s.call.cancel()
    end = s.join(10)
    assert end["code"] == "CANCELLED", end
    wait_until(lambda: "request cancelled seq=" in cl.coordinator.text(), scaled(5),
               "the coordinator to see the cancel")
    time.sleep(wait_ms / 1000 + 0.5)
    st = cl.status()
    assert st["requests_queued"] == 0 and "requests wait" not in st["state"], st
    text = cl.coordinator.text()
    assert "requests waited" not in text, text[-3000:]
    assert "the client cancelled or went away" not in text, text[-3000:]


def test_a_leaving_stage_whose_grace_runs_out_hands_its_requests_over(model, cluster_factory,
                                                                      tmp_path):
    """A stage stopped with a grace period shorter than the generation: the drain ends with the
    request unfinished, which then waits for the stage that takes the leaver's place."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS),
                         stage_flags=("--grace_ms", 1000))
    c = cl.client()
    n = 4000  # longer than the 1 s grace period, however fast the host
    want = c.generate(c.request(prompt_ids=REQUESTS[0][0], max_tokens=n), timeout=120)
    assert want.code.name == "OK" and len(want.ids) == n, want
    s = BackgroundGeneration(c, n, REQUESTS[0][0])
    wait_until(lambda: len(s.ids) >= 5, scaled(30), "the first tokens")
    victim = cl.stage_daemon(1)
    victim.expect_death = True
    victim.signal(signal.SIGTERM)
    assert victim.proc.wait(scaled(10)) == 0
    assert not s.end and len(s.ids) < n, (s.end, len(s.ids))
    add_stage(cl, tmp_path)
    end = s.join(120)
    assert end["code"] == "OK" and s.ids == want.ids, (end, len(s.ids))
    text = cl.coordinator.text()
    assert "grace period ended with 1 requests unfinished" in text, text[-3000:]
    assert "failover: 1 requests (1 of them running)" in text, text[-3000:]


def test_a_request_the_new_pipeline_cannot_hold_fails_saying_so(model, cluster_factory, tmp_path):
    """The stage that takes the dead one's place offers less KV: a held request that no longer fits
    fails with RESOURCE_EXHAUSTED naming both sizes, and a smaller one goes on."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS))
    c = cl.client()
    small = REQUESTS[0][0], 300
    want = c.generate(c.request(prompt_ids=small[0], max_tokens=small[1]), timeout=120)
    assert want.code.name == "OK", want
    big = BackgroundGeneration(c, 4000, REQUESTS[1][0])
    little = BackgroundGeneration(c, small[1], small[0])
    wait_until(lambda: len(big.ids) >= 5 and len(little.ids) >= 5, scaled(30), "first tokens")
    victim = cl.stage_daemon(1)
    victim.expect_death = True
    victim.signal(signal.SIGKILL)
    wait_until(lambda: cl.status()["state"] != "serving", scaled(10), "the pipeline to go down")
    d = Daemon("stage-small", [*cl.stage_args("127.0.0.1:0"), "--kv_mb", 1],
               tmp_path / f"{cl.tag}-stage-small.log")
    cl.stages.append(d)
    cl.daemons.append(d)
    end = big.join(120)
    assert end["code"] == "RESOURCE_EXHAUSTED", end
    assert "the pipeline formed again with room for " in end["details"], end
    assert "KV blocks per sequence; this request needs 251" in end["details"], end
    end = little.join(120)
    assert end["code"] == "OK" and little.ids == want.ids, (end, len(little.ids))
