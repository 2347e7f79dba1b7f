"""The CLI side of a pipeline: `ppserve cluster` starts and supervises the daemons, `ppserve status
--wait` sees it serve, `ppserve generate` prints what `ppserve run` prints, `ppserve trace` writes a
Chrome trace; SIGTERM stops everything (exit 0), a daemon that dies stops the rest (exit 1)."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster import (CLEAN_ENV, MODEL_FLAGS, PPSERVE, free_port, need_daemons, scaled,
                     single_process, terminate, wait_until)
from conftest import run

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


def children(pid):
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def gone(pids):
    def dead(p):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"
    return all(dead(p) for p in pids)


@pytest.fixture
def ppcluster(model, tmp_path):
    """`ppserve cluster` with 3 stages (2+3+1 layers) on a free port; stopped at the end."""
    need_daemons()
    port = free_port()
    log = tmp_path / "cluster.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([PPSERVE, "cluster", "--model", str(model / "model.gguf"),
                                 "--stages", "3", "--layers", "2,3,1", "--port", str(port),
                                 "--threads", "1", "--log-level", "info"],
                                stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV)
    proc.addr, proc.log = f"127.0.0.1:{port}", log
    try:
        yield proc
    finally:
        kids = children(proc.pid)
        terminate(proc)
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except ProcessLookupError:
                pass
        text = log.read_text(errors="replace")
        assert "ERROR: AddressSanitizer" not in text and "runtime error:" not in text, text[-5000:]


def status_json(addr, wait):
    p = run([PPSERVE, "status", "--addr", addr, "--wait", str(int(wait)), "--json"], check=False,
            timeout=wait + 30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_cluster_status_generate_trace_stop(ppcluster, model, tmp_path):
    s = status_json(ppcluster.addr, scaled(60))
    assert s["state"] == "serving"
    assert [(x["first_layer"], x["last_layer"]) for x in s["stages"]] == [(0, 2), (2, 5), (5, 6)]
    table = run([PPSERVE, "status", "--addr", ppcluster.addr]).stdout
    assert "serving" in table
    # nothing computed yet: an idle pipeline, not a 100% bubble
    assert s["idle"] is True and s["bubble_fraction"] == 0, s
    assert "bubble       - (idle: no stage computed in the last window)" in table, table

    gguf = model / "model.gguf"
    flags = ["--temperature", "0.9", "--top-p", "0.9", "--seed", "42", "--ignore-eos"]
    prompt = "1,5,9,200,311"
    gen = run([PPSERVE, "generate", "--addr", ppcluster.addr, "--prompt-ids", prompt,
               "--max-tokens", "30", "--json", *flags])
    ref = run([PPSERVE, "run", "--model", str(gguf), "--prompt-ids", prompt, "--max-tokens", "30",
               "--json", *flags])
    g, r = json.loads(gen.stdout), json.loads(ref.stdout)
    assert set(g) == set(r)
    assert (g["prompt_ids"], g["ids"], g["text"], g["finish_reason"]) == \
        (r["prompt_ids"], r["ids"], r["text"], r["finish_reason"])

    # streamed text, as `ppserve run` streams it
    text_args = ["--prompt", "the cat sat", "--max-tokens", "25", "--ignore-eos"]
    streamed = run([PPSERVE, "generate", "--addr", ppcluster.addr, *text_args]).stdout
    assert streamed == run([PPSERVE, "run", "--model", str(gguf), *text_args]).stdout

    out = tmp_path / "trace.json"
    run([PPSERVE, "trace", "--addr", ppcluster.addr, "--out", str(out)])
    trace = json.loads(out.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert events, "an empty trace after requests ran"

    kids = children(ppcluster.pid)
    assert len(kids) == 4, f"expected a coordinator and 3 stages, found {kids}"
    before_stop = ppcluster.log.stat().st_size
    t0 = time.monotonic()
    ppcluster.send_signal(signal.SIGTERM)
    assert ppcluster.wait(scaled(30)) == 0
    assert time.monotonic() - t0 < scaled(15)
    wait_until(lambda: gone(kids), scaled(5), "the daemons to exit with the cluster")
    # an orderly stop reads as one: the coordinator ends the last stage's result stream in order,
    # so no stage reports a broken hop
    with open(ppcluster.log, "rb") as f:
        f.seek(before_stop)
        stop_log = f.read().decode(errors="replace")
    assert "hop broken" not in stop_log, stop_log
    assert "hop ended: next=" in stop_log, stop_log


def test_cluster_stops_when_a_stage_dies(ppcluster):
    status_json(ppcluster.addr, scaled(60))
    kids = children(ppcluster.pid)
    stage = next(k for k in kids
                 if b"ppserve-stage" in Path(f"/proc/{k}/cmdline").read_bytes())
    os.kill(stage, signal.SIGKILL)
    assert ppcluster.wait(scaled(30)) == 1
    wait_until(lambda: gone(kids), scaled(5), "the other daemons to be stopped")


def test_generate_without_a_server_fails_fast():
    port = free_port()
    t0 = time.monotonic()
    p = run([PPSERVE, "generate", "--addr", f"127.0.0.1:{port}", "--prompt-ids", "1,2",
             "--max-tokens", "3", "--json", "--timeout-ms", "5000"], check=False, timeout=60)
    assert p.returncode != 0 and p.stdout.strip() == ""
    assert "UNAVAILABLE" in p.stderr or "DEADLINE" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 30
    p = run([PPSERVE, "status", "--addr", f"127.0.0.1:{port}", "--wait", "1"], check=False,
            timeout=60)
    assert p.returncode != 0 and p.stderr.strip()


def test_single_process_reference_is_stable(model):
    """The references the pipeline tests compare against do not depend on the thread count."""
    a = single_process(model / "model.gguf", [1, 2, 3], 10, {"temperature": 0.8, "seed": 1})[0]
    b = run([PPSERVE, "run", "--model", str(model / "model.gguf"), "--prompt-ids", "1,2,3",
             "--max-tokens", "10", "--json", "--threads", "2", "--temperature", "0.8", "--seed",
             "1", "--ignore-eos"])
    assert a["ids"] == json.loads(b.stdout)["ids"]
