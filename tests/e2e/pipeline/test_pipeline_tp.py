"""Tensor parallelism inside the stages of a pipeline: P stages x W workers computes what one
process computes. A 2-stage pipeline whose stages each run 2 workers (`--tp 2`) gives the greedy
tokens of `ppserve run` (1 worker) with logits within 1e-5 (max|d|/max|ref| per row) on an f32
model, and the bits of `ppserve run --tp 2`: a stage's workers split every layer exactly as the
single process's workers do, each all-reduce adds the same two partial sums in rank order, and
the residual stream a stage hands on is the one every worker holds, so a stage boundary changes
no arithmetic. Status reports each stage's degrees and the bytes it all-reduced. Degrees the
model cannot split are refused by the stage on Assign, and the coordinator (Status, `blocked`)
and `ppserve cluster` (exit 1 at once) say why, naming tp and the heads."""
import json
import subprocess

import numpy as np
import pytest

from cluster import (CLEAN_ENV, MODEL_DIM, MODEL_FLAGS, MODEL_VOCAB, PPSERVE, SANITIZER_MARKS,
                     free_port, grpc, json_line, need_daemons, scaled, terminate, wait_until)
from conftest import rel_err, run

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure

PROMPT = [1, 17, 200, 45, 99, 3, 150, 77, 310, 5]
MAX_TOKENS = 16
HEADS = 4  # MODEL_FLAGS: 4 attention heads, 2 KV heads, 6 layers


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


def single_process(model, tmp_path, tp, tag):
    """`ppserve run --tp TP --json --dump-logits` (one thread per worker); (json,
    logits[n, vocab])."""
    dump = tmp_path / f"{tag}.logits"
    args = [PPSERVE, "run", "--model", str(model / "model.gguf"),
            "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(MAX_TOKENS),
            "--ignore-eos", "--json", "--threads", str(tp), "--tp", str(tp),
            "--dump-logits", str(dump)]
    out = json.loads(json_line(run(args, timeout=scaled(120)).stdout))
    return out, np.fromfile(dump, dtype="<f4").reshape(MAX_TOKENS, MODEL_VOCAB)


def generate(addr, tmp_path, tag):
    """`ppserve generate --json --dump-logits` against a cluster; (json, logits[n, vocab])."""
    dump = tmp_path / f"{tag}.logits"
    args = [PPSERVE, "generate", "--addr", addr, "--prompt-ids", ",".join(map(str, PROMPT)),
            "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", "--dump-logits", str(dump),
            "--timeout-ms", str(int(scaled(120) * 1000))]
    p = run(args, check=False, timeout=scaled(180))
    assert p.returncode == 0, f"{' '.join(args)} exited {p.returncode}:\n{p.stderr}"
    out = json.loads(json_line(p.stdout))
    return out, np.fromfile(dump, dtype="<f4").reshape(MAX_TOKENS, MODEL_VOCAB)


def check_against_single_process(addr, model, tmp_path):
    got, logits = generate(addr, tmp_path, "pipeline-tp2")
    ref1, ref1_logits = single_process(model, tmp_path, 1, "run-tp1")
    ref2, ref2_logits = single_process(model, tmp_path, 2, "run-tp2")
    assert got["prompt_ids"] == PROMPT
    assert got["ids"] == ref1["ids"], "greedy tokens of the tp-2 pipeline differ from tp 1"
    err = rel_err(logits, ref1_logits)
    assert err.max() <= 1e-5, f"logits vs tp 1: max|d|/max|ref| per row up to {err.max():.3g}"
    assert got["ids"] == ref2["ids"]
    if logits.tobytes() != ref2_logits.tobytes():
        rows = np.nonzero(np.any(logits != ref2_logits, axis=1))[0]
        raise AssertionError(f"logits rows {rows.tolist()} differ from `ppserve run --tp 2` "
                             f"(max |d| {np.max(np.abs(logits - ref2_logits))})")
    return got


def test_two_stages_of_two_workers_match_the_single_process(model, cluster_factory, tmp_path):
    cl = cluster_factory(model, stages=2, stage_flags=("--threads", "2", "--tp", "2"))
    st = cl.stage_status()
    assert [(s["tp"], s["ep"]) for s in st] == [(2, 1), (2, 1)], st
    check_against_single_process(cl.addr, model, tmp_path)

    # every token a stage computes all-reduces twice per layer (attention out, FFN down): dim
    # floats each time from each worker; heartbeats bring the counters
    def reduced():
        s = cl.stage_status()
        return s if all(int(x["bytes_reduced"]) > 0 and x["bytes_reduced_per_token"] > 0
                        for x in s) else None
    st = wait_until(reduced, scaled(5), "the stages' all-reduce counters")
    for s in st:
        layers = s["last_layer"] - s["first_layer"]
        assert s["bytes_reduced_per_token"] == 2 * layers * MODEL_DIM * 4, s
        assert int(s["bytes_reduced"]) % (2 * layers * MODEL_DIM * 4) == 0, s


def test_one_worker_stages_reduce_nothing(model, cluster_factory):
    cl = cluster_factory(model, stages=2)
    st = cl.stage_status()
    assert [(s["tp"], s["ep"]) for s in st] == [(1, 1), (1, 1)], st
    assert all(int(s["bytes_reduced"]) == 0 and s["bytes_reduced_per_token"] == 0 for s in st)


@pytest.mark.parametrize("flags,words", [
    (("--tp", "3"), ["tp 3 does not divide the 4 attention heads", "valid tp: 1, 2, 4"]),
    (("--ep", "2"), ["ep 2 needs a mixture-of-experts model", "dense"]),
], ids=["tp3", "ep2-dense"])
def test_degrees_the_model_cannot_split_are_refused(model, cluster_factory, flags, words):
    """The stages register; each refuses its assignment with INVALID_ARGUMENT; the coordinator
    does not retry in a loop but reports the pipeline blocked, the stage's reason in its state,
    and refuses requests with that reason."""
    cl = cluster_factory(model, stages=2, stage_flags=flags, wait=False)

    def blocked():
        cl.check_alive()
        try:
            s = cl.status(timeout=2.0)
        except grpc.RpcError:  # not listening yet
            return None
        return s if s["blocked"] else None
    s = wait_until(blocked, scaled(30), "the coordinator to report the pipeline blocked")
    assert s["state"] != "serving"
    assert "refused layers" in s["state"] and "INVALID_ARGUMENT" in s["state"], s["state"]
    for w in words:
        assert w in s["state"], s["state"]
    res = cl.client().generate(cl.client().request(prompt_ids=PROMPT, max_tokens=2))
    assert res.code.name == "UNAVAILABLE" and words[0] in res.details, res
    # one attempt, then a wait for the stages to change: not an assignment per second
    refusals = sum(d.text().count("assign refused") for d in cl.stages)
    assert 1 <= refusals <= 2, f"{refusals} refused assignments (retrying in a loop?)"
    assert all(d.alive() for d in cl.daemons)


def run_cluster(model, tmp_path, *flags):
    """`ppserve cluster` with 2 stages on a free port (stdout+stderr to a log); the process."""
    need_daemons()
    port = free_port()
    log = tmp_path / f"cluster-{port}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([PPSERVE, "cluster", "--model", str(model / "model.gguf"),
                                 "--stages", "2", "--port", str(port), *flags],
                                stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV)
    proc.addr, proc.log = f"127.0.0.1:{port}", log
    return proc


def stop(proc):
    """SIGTERM (SIGKILL after 30 s) unless it ended; its log must hold no sanitizer report."""
    terminate(proc)
    text = proc.log.read_text(errors="replace")
    assert not any(m in text for m in SANITIZER_MARKS), text[-5000:]


def test_cluster_runs_p_stages_of_w_workers(model, tmp_path):
    """2 stages of 2 workers on the CPU, computing from the mapped model file (--cpu-weights map;
    the other cluster tests run the default, copied weights): the single process's logits."""
    proc = run_cluster(model, tmp_path, "--tp", "2", "--threads", "2", "--devices", "cpu",
                       "--cpu-weights", "map", "--log-level", "info")
    try:
        p = run([PPSERVE, "status", "--addr", proc.addr, "--wait", str(int(scaled(60))),
                 "--json"], check=False, timeout=scaled(90))
        assert p.returncode == 0, p.stderr + proc.log.read_text(errors="replace")
        s = json.loads(p.stdout)
        assert [(x["tp"], x["ep"]) for x in s["stages"]] == [(2, 1), (2, 1)], s
        table = run([PPSERVE, "status", "--addr", proc.addr]).stdout
        assert "tp/ep" in table and "allreduce/tok" in table and " 2/1 " in table, table
        check_against_single_process(proc.addr, model, tmp_path)
        stop(proc)
        assert proc.returncode == 0, proc.log.read_text(errors="replace")
        # each stage was handed the CPU and the weights placement, and says so when it starts
        text = proc.log.read_text(errors="replace")
        assert text.count("devices=cpu cpu_weights=map") == 2, text[-3000:]
    finally:
        stop(proc)


def test_cluster_reports_a_tp_the_heads_refuse(model, tmp_path):
    proc = run_cluster(model, tmp_path, "--tp", "3", "--threads", "1")
    try:
        rc = proc.wait(scaled(60))  # at once, not after the 120 s start-up timeout
    except subprocess.TimeoutExpired:
        stop(proc)
        raise AssertionError("ppserve cluster --tp 3 hung:\n"
                             + proc.log.read_text(errors="replace"))
    stop(proc)
    text = proc.log.read_text(errors="replace")
    assert rc == 1, text
    line = next((x for x in text.split("\n")
                 if x.startswith("ppserve cluster: error: the pipeline cannot form")), None)
    assert line, text
    assert f"tp 3 does not divide the {HEADS} attention heads" in line, line


@pytest.mark.parametrize("devices, rc, words", [
    ("gpu", 2, ['expected "auto", "cpu" or "cuda:N', "got 'gpu'"]),
    ("cuda:0", 2, ["expected 4 GPU ids (2 stages x 2 workers", "got 1"]),
    ("cuda:0,1,1,2", 2, ["cuda:"]),
])
def test_cluster_refuses_bad_device_lists(model, tmp_path, devices, rc, words):
    """A malformed list, or one that does not give every stage's workers a GPU, is a usage error
    before any daemon starts."""
    p = run([PPSERVE, "cluster", "--model", str(model / "model.gguf"), "--stages", "2", "--tp",
             "2", "--port", str(free_port()), "--devices", devices], check=False, timeout=30)
    assert p.returncode == rc, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr


def test_cluster_refuses_a_bad_cpu_weights(model):
    p = run([PPSERVE, "cluster", "--model", str(model / "model.gguf"), "--stages", "2",
             "--port", str(free_port()), "--cpu-weights", "huge"], check=False, timeout=30)
    assert p.returncode == 2, p.stderr
    assert "--cpu-weights: expected copy" in p.stderr and "got 'huge'" in p.stderr, p.stderr


def test_cluster_on_gpus_this_host_lacks_stops_at_once(model, tmp_path):
    """cuda ids on a host (or build) without usable GPUs: exit 1 at once, naming the problem; no
    daemon is left behind. (On a GPU host with 2 usable GPUs this would serve instead.)"""
    devices = run([PPSERVE, "devices"], check=False, timeout=30).stdout
    if "cuda:0:" in devices and "cuda:1:" in devices:
        pytest.skip("this host has two usable GPUs")
    p = run([PPSERVE, "cluster", "--model", str(model / "model.gguf"), "--stages", "2",
             "--port", str(free_port()), "--devices", "cuda:0,1"], check=False, timeout=30)
    assert p.returncode == 1, p.stderr
    assert "ppserve cluster: error: cuda:0,1:" in p.stderr, p.stderr
    assert "CUDA" in p.stderr, p.stderr
