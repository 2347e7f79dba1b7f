"""A stage that stops in order (SIGTERM: a rolling update, a node drained) asks the coordinator to
let it leave. The coordinator takes no new requests, lets the running ones finish within the
stage's grace_ms, then takes the pipeline down and drops the stage at once (not after
stage_timeout_ms), so a replacement can take its place. A stage outside a serving pipeline leaves
at once; a second signal, or a coordinator that does not answer, stops the stage without waiting."""
import json
import signal
import time

import grpc
import pytest

from cluster import LONG_FLAGS, BackgroundGeneration, Daemon, scaled, wait_until
from conftest import PPSERVE, run

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure

PROMPT = [1, 33, 66, 99, 132, 165, 198, 231]
TIMEOUT_MS = 1500  # the coordinator's stage_timeout_ms: leaving must not wait for it


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6long", *LONG_FLAGS)


def stops_soon(stage):
    """SIGTERM to stage, which must exit 0 without waiting out its grace period."""
    stage.expect_death = True
    stage.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert stage.proc.wait(scaled(10)) == 0
    assert time.monotonic() - t0 < scaled(3)


def sigterm_mid_generation(cl, n, index=1):
    """Starts a generation of n tokens and SIGTERMs the stage at index once it has 5; returns the
    generation, the stage and when the signal went."""
    g = BackgroundGeneration(cl.client(), n, PROMPT)
    wait_until(lambda: len(g.ids) >= 5, scaled(30), "the first tokens")
    stage = cl.stage_daemon(index)
    stage.expect_death = True
    stage.signal(signal.SIGTERM)
    return g, stage, time.monotonic()


@pytest.mark.parametrize("index", [0, 1], ids=["first", "last"])
def test_a_stopping_stage_lets_the_running_request_finish(model, cluster_factory, tmp_path, index):
    grace_s = scaled(30)
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS),
                         stage_flags=("--grace_ms", int(grace_s * 1000)))
    c = cl.client()
    n = 2500
    before = c.generate(c.request(prompt_ids=PROMPT, max_tokens=n), timeout=scaled(120))
    assert before.code.name == "OK" and len(before.ids) == n, before

    victim_addr = cl.stage_status()[index]["address"]
    g, victim, t0 = sigterm_mid_generation(cl, n, index)
    ids, end = g.ids, g.end

    # while the pipeline drains: Status says so and names the stage; new requests are refused
    st = wait_until(lambda: (lambda s: s if s["state"].startswith("draining") else None)(
        cl.status()), scaled(5), "Status to say draining")
    assert f"stage {index} ({victim_addr}) is leaving (SIGTERM)" in st["state"], st["state"]
    leaving = [s for s in st["stages"] if s["leaving"]]
    assert [s["address"] for s in leaving] == [victim_addr], st["stages"]
    assert 0 < leaving[0]["leaving_in_s"] <= grace_s, leaving
    p = run([PPSERVE, "status", "--addr", cl.addr], check=False, timeout=30)
    assert p.returncode == 1 and "not serving: draining: stage" in p.stderr, (p.returncode,
                                                                               p.stderr)
    rows = [line for line in p.stdout.splitlines() if " 127.0.0.1:" in line]
    assert [" leaving " in r for r in rows] == [i == index for i in range(2)], p.stdout
    p = run([PPSERVE, "status", "--addr", cl.addr, "--json"], check=False, timeout=30)
    js = json.loads(p.stdout)
    assert [s["leaving"] for s in sorted(js["stages"], key=lambda s: s["index"])] == \
        [i == index for i in range(2)], js
    fresh = c.generate(c.request(prompt_ids=PROMPT, max_tokens=4), timeout=10)
    assert fresh.code.name == "UNAVAILABLE" and fresh.ids == [], fresh
    assert "is leaving (SIGTERM)" in fresh.details, fresh.details
    assert not end, f"the generation ended before the drain was seen: {end}"

    g.join(120)
    assert end["code"] == "OK", (end, len(ids))
    assert ids == before.ids, "the drained request's tokens differ from an undisturbed run"
    # the stage goes once the request is done, long before its grace period is over
    assert victim.proc.wait(scaled(10)) == 0
    gone_after = time.monotonic() - end["at"]
    print(f"stage {index}: request done {end['at'] - t0:.2f} s after SIGTERM, {len(ids)} tokens;"
          f" the stage exited {gone_after:.2f} s later (grace {grace_s:.0f} s)")
    assert time.monotonic() - t0 < grace_s / 2

    # the coordinator dropped it at once, without waiting for its heartbeats to stop
    st = wait_until(lambda: (lambda s: s if len(s["stages"]) == 1 else None)(cl.status()),
                    scaled(3), "the stage to be dropped")
    assert st["stages"][0]["address"] != victim_addr, st["stages"]
    assert "left (SIGTERM)" in st["state"], st["state"]
    text = cl.coordinator.text()
    assert f"stage leaving index={index} address={victim_addr}" in text, text[-2000:]
    assert f"stage dropped address={victim_addr}" in text, text[-2000:]
    assert "stage silent" not in text and "error" not in text.split("pipeline serving")[-1], \
        text[-2000:]
    assert "left: coordinator=" in victim.text(), victim.text()[-2000:]

    # a new stage takes its place and serves the same tokens
    new = Daemon("stage-new", cl.stage_args("127.0.0.1:0"), tmp_path / f"{cl.tag}-stage-new.log")
    cl.stages.append(new)
    cl.daemons.append(new)
    cl.wait_serving(timeout=30)
    after = c.generate(c.request(prompt_ids=PROMPT, max_tokens=12), timeout=60)
    assert after.code.name == "OK" and after.ids == before.ids[:12], after


def test_a_stage_whose_grace_runs_out_fails_what_is_left(model, cluster_factory):
    """grace_ms shorter than the request, and no failover: the request fails with UNAVAILABLE
    saying why, in time for the stage to stop within its grace period (with failover it waits for
    the next pipeline instead: test_pipeline_failover.py)."""
    grace_s = 1.0
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS,
                                                       "--failover_wait_ms", 0),
                         stage_flags=("--grace_ms", int(grace_s * 1000)))
    g, victim, t0 = sigterm_mid_generation(cl, 4000)
    ids, end = g.ids, g.end
    g.join(30)
    took = end["at"] - t0
    print(f"request ended {took:.2f} s after SIGTERM with {len(ids)} tokens: {end}")
    assert end["code"] == "UNAVAILABLE", end
    assert "left (SIGTERM): its grace period ended with 1 requests unfinished" in end["details"], \
        end
    assert 0 < len(ids) < 4000
    assert took <= grace_s + scaled(1), took
    assert victim.proc.wait(scaled(10)) == 0
    assert time.monotonic() - t0 < grace_s + scaled(2)
    assert "grace_ms is over" not in victim.text(), victim.text()[-2000:]


def test_a_second_signal_stops_the_stage_at_once(model, cluster_factory):
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS,
                                                       "--failover_wait_ms", 0),
                         stage_flags=("--grace_ms", 60000))
    g, victim, _ = sigterm_mid_generation(cl, 4000)
    ids, end = g.ids, g.end
    wait_until(lambda: "leaving: the coordinator finishes" in victim.text(), scaled(5),
               "the stage to ask to leave")
    victim.signal(signal.SIGINT)
    t0 = time.monotonic()
    assert victim.proc.wait(scaled(10)) == 0
    assert time.monotonic() - t0 < scaled(3)
    assert "signal SIGINT again: stopping without waiting" in victim.text()
    g.join(30)
    assert end["code"] == "UNAVAILABLE" and len(ids) < 4000, end


def test_a_stage_outside_a_pipeline_leaves_at_once(model, cluster_factory):
    """The coordinator waits for 3 stages and has 2: a stopping one is forgotten at once."""
    cl = cluster_factory(model, stages=2, wait=False,
                         coord_flags=("--stage_timeout_ms", 60000, "--stages", 3),
                         stage_flags=("--grace_ms", 30000))

    def registered():
        try:
            return len(cl.status()["stages"]) == 2
        except grpc.RpcError:  # not listening yet
            return False

    wait_until(registered, scaled(30), "two registrations")
    victim = cl.stages[0]
    stops_soon(victim)
    st = cl.status()
    assert len(st["stages"]) == 1 and st["state"].startswith("waiting for stages: 1 of 3"), st
    assert "stage left index=" in cl.coordinator.text()
    # the other goes too: no stage at all, and nothing computed (idle), not a 0% bubble
    stops_soon(cl.stages[1])
    st = cl.status()
    assert st["stages"] == [] and st["state"].startswith("waiting for stages: 0 of 3"), st
    assert st["idle"] is True and st["bubble_fraction"] == 0, st
    p = run([PPSERVE, "status", "--addr", cl.addr], check=False, timeout=30)
    assert "bubble       - (idle" in p.stdout and "stages       none" in p.stdout, p.stdout


def test_a_stage_stops_without_an_answering_coordinator(model, cluster_factory):
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS),
                         stage_flags=("--grace_ms", 30000))
    cl.coordinator.expect_death = True
    cl.coordinator.signal(signal.SIGKILL)
    cl.coordinator.proc.wait(scaled(10))
    victim = cl.stages[0]
    stops_soon(victim)
    assert "leave: the coordinator did not answer" in victim.text(), victim.text()[-2000:]
