"""Recovery: after a stage is killed and another started in its place (on its address or another),
after the coordinator is killed and started again, and after the coordinator is stopped for a
while, the pipeline serves again with the same tokens; and a second daemon on a port in use fails
to start instead of sharing it."""
import re
import signal
import socket
import subprocess
import threading
import time

import pytest

from cluster import LONG_FLAGS, MODEL_FLAGS, Daemon, scaled, wait_until

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure

PROMPT = [1, 33, 66, 99, 132, 165, 198, 231]
TIMEOUT_MS = 1500  # the coordinator's stage_timeout_ms


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


def greedy(cl, n=12):
    c = cl.client()
    return c.generate(c.request(prompt_ids=PROMPT, max_tokens=n), timeout=60)


@pytest.mark.parametrize("where", ["new-address", "same-address"])
def test_a_stage_started_in_a_dead_ones_place_rejoins(model, cluster_factory, tmp_path, where):
    """The new stage comes back on the dead one's address (a restarted process) or on another (a
    rescheduled pod gets a new IP). The dead stage breaks its hops before it misses its heartbeats,
    so setup's retries must still see its silence and drop it: otherwise its place stays filled,
    and a stage on a new address is refused ("the pipeline already has its 2 stages") for good."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS))
    before = greedy(cl)
    assert before.code.name == "OK" and len(before.ids) == 12, before
    stages = cl.stage_status()
    victim_addr = stages[0]["address"]
    survivor_addr = stages[1]["address"]
    victim = cl.stage_daemon(0)
    victim.expect_death = True
    victim.signal(signal.SIGKILL)
    victim.proc.wait(scaled(10))
    t0 = time.monotonic()
    wait_until(lambda: cl.status()["state"] != "serving", scaled(5), "Status to leave serving")

    # the new process: the cluster's stage flags, on the dead stage's address or a fresh port
    addr = victim_addr if where == "same-address" else "127.0.0.1:0"
    new = Daemon("stage-new", cl.stage_args(addr), tmp_path / f"{cl.tag}-stage-new.log")
    cl.stages.append(new)
    cl.daemons.append(new)
    st = cl.wait_serving(timeout=30)
    took = time.monotonic() - t0
    addrs = sorted(s["address"] for s in st["stages"])
    print(f"{where}: serving again {took:.2f} s after the kill, stages {addrs}")
    assert len(addrs) == 2 and survivor_addr in addrs, st["stages"]
    if where == "same-address":
        assert addrs == sorted([victim_addr, survivor_addr]), addrs
    else:
        assert victim_addr not in addrs, f"the dead stage {victim_addr} is still in {addrs}"
        assert "stage silent address=" + victim_addr in cl.coordinator.text()
    assert all(s["healthy"] for s in st["stages"]), st["stages"]
    # the heartbeat timeout, then a retry (every second) and the new stage's load
    assert took < scaled(TIMEOUT_MS / 1000 + 10), f"serving again only after {took:.1f} s"

    after = greedy(cl)
    assert after.code.name == "OK", after
    assert after.ids == before.ids, (before.ids, after.ids)


def registered_ids(cl):
    """{address: stage id} from the coordinator's log, the latest registration of each address."""
    ids = {}
    for m in re.finditer(r"stage registered id=(\d+) address=(\S+)", cl.coordinator.text()):
        ids[m.group(2)] = int(m.group(1))
    return ids


def test_stages_rejoin_a_restarted_coordinator_in_any_order(model, cluster_factory, tmp_path):
    """The coordinator killed and started again on its port, while the stage it had registered
    first is stopped: the other one registers first with the new coordinator. Ids started at 1 in
    every coordinator process, so that stage got the stopped one's id, the stopped one's
    heartbeats (by id) were then taken as the other's, and it never registered again: the
    pipeline waited for its second stage for good, with both stages alive."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS))
    before = greedy(cl)
    assert before.code.name == "OK" and len(before.ids) == 12, before
    ids = registered_ids(cl)
    assert len(ids) == 2, ids
    first = min(ids, key=ids.get)
    other = max(ids, key=ids.get)
    sleeper = next(d for d in cl.stages if f"listening on {first} " in d.text())
    sleeper.signal(signal.SIGSTOP)
    try:
        old = cl.coordinator
        old.expect_death = True
        old.signal(signal.SIGKILL)
        old.proc.wait(scaled(10))
        cl.client().close()
        cl._client = None
        new = Daemon("coordinator-new", old.args, tmp_path / f"{cl.tag}-coordinator-new.log")
        cl.coordinator = new
        cl.daemons.append(new)
        wait_until(lambda: f"address={other}" in new.text(), scaled(15),
                   "the running stage to register with the new coordinator")
    finally:
        sleeper.signal(signal.SIGCONT)
    st = cl.wait_serving(timeout=30)
    addrs = sorted(s["address"] for s in st["stages"])
    assert addrs == sorted([first, other]), addrs
    again = registered_ids(cl)
    assert again[first] != again[other], again
    after = greedy(cl)
    assert after.code.name == "OK" and after.ids == before.ids, (before, after)


def test_a_second_daemon_on_a_port_in_use_fails(model, cluster_factory, tmp_path):
    """gRPC binds with SO_REUSEPORT unless told not to: a second coordinator (a restart whose old
    process still runs) or stage on a port in use started without error, and the kernel split the
    connections between the two processes. It must fail and say so, leaving the first serving."""
    cl = cluster_factory(model, stages=2)
    before = greedy(cl)
    stage_addr = cl.stage_status()[0]["address"]
    runs = {
        "coordinator": [str(a) for a in cl.coordinator.args],
        "stage": [str(a) for a in cl.stage_args(stage_addr)],
    }
    for who, args in runs.items():
        p = subprocess.run(args, capture_output=True, text=True, timeout=scaled(60))
        out = p.stdout + p.stderr
        assert p.returncode != 0, f"a second {who} on a port in use started:\n{out}"
        where = cl.addr if who == "coordinator" else stage_addr
        assert f"cannot listen on {where} (a bad address, or one in use" in out, out
    after = greedy(cl)
    assert after.code.name == "OK" and after.ids == before.ids, (before, after)


def test_a_stopped_coordinator_keeps_its_stages(models, cluster_factory):
    """The coordinator stopped (SIGSTOP: a paused VM, a debugger) for twice stage_timeout_ms in the
    middle of a generation, then resumed: the stages' heartbeats of that time wait in its sockets,
    so it must not count the pause as their silence. It dropped both stages on resuming and failed
    the request; now the generation goes on to its end with the tokens of an undisturbed run."""
    long_model = models.get("pipe6long", *LONG_FLAGS)
    cl = cluster_factory(long_model, stages=2, coord_flags=("--stage_timeout_ms", TIMEOUT_MS))
    c = cl.client()
    n = 600
    before = c.generate(c.request(prompt_ids=PROMPT, max_tokens=n), timeout=120)
    assert before.code.name == "OK" and len(before.ids) == n, before
    call = c.stream(c.request(prompt_ids=PROMPT, max_tokens=n), timeout=120)
    ids = []
    stopped = False
    try:
        for r in call:
            ids.extend(r.ids)
            if len(ids) >= 5 and not stopped:
                cl.coordinator.signal(signal.SIGSTOP)
                stopped = True
                time.sleep(2 * TIMEOUT_MS / 1000)
                cl.coordinator.signal(signal.SIGCONT)
    except Exception as e:  # grpc.RpcError: the request failed
        pytest.fail(f"the generation failed after {len(ids)} tokens: {e}")
    finally:
        cl.coordinator.signal(signal.SIGCONT)
    assert stopped and ids == before.ids, (len(ids), ids[:8], before.ids[:8])
    text = cl.coordinator.text()
    assert "stage silent" not in text and "pipeline down" not in text, text[-2000:]
    assert "stage liveness checked again after " in text, text[-2000:]
    assert cl.status()["state"] == "serving"


class HeldProxy:
    """A TCP forwarder to target on a free loopback port that holds every connection's bytes for
    hold seconds after it opens before passing them on (both ways)."""

    def __init__(self, target, hold):
        self.target = target.rsplit(":", 1)
        self.hold = hold
        self.server = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.open:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        time.sleep(self.hold)
        try:
            upstream = socket.create_connection((self.target[0], int(self.target[1])))
        except OSError:
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.open = False
        self.server.close()


def test_a_stage_assigned_before_it_registers_keeps_its_layers(model, cluster_factory, tmp_path):
    """A new process on a dead stage's address answers setup's retried Assign before its own
    registration arrives (here held back by a proxy between it and the coordinator). The
    registration then came from an address the pipeline had just been formed with, which read as a
    restart that lost its layers and took the new pipeline down. The process's instance number,
    the same in its AssignResponse and its RegisterRequest, now says it holds them."""
    cl = cluster_factory(model, stages=2, coord_flags=("--stage_timeout_ms", "8000"))
    before = greedy(cl)
    assert before.code.name == "OK", before
    victim_addr = cl.stage_status()[0]["address"]
    victim = cl.stage_daemon(0)
    victim.expect_death = True
    victim.signal(signal.SIGKILL)
    victim.proc.wait(scaled(10))
    wait_until(lambda: cl.status()["state"] != "serving", scaled(5), "Status to leave serving")
    proxy = HeldProxy(cl.addr, hold=1.5)
    try:
        new = Daemon("stage-new", cl.stage_args(victim_addr, coordinator=proxy.addr),
                     tmp_path / f"{cl.tag}-stage-new.log")
        cl.stages.append(new)
        cl.daemons.append(new)
        cl.wait_serving(timeout=20)
        assert "registered:" not in new.text(), "the registration came before the Assign"
        wait_until(lambda: "registered:" in new.text(), scaled(20), "the held registration")
        time.sleep(0.5)
        text = cl.coordinator.text()
        assert "registered again" not in text, text[-3000:]
        assert cl.status()["state"] == "serving"
        after = greedy(cl)
        assert after.code.name == "OK" and after.ids == before.ids, (before, after)
    finally:
        proxy.close()
