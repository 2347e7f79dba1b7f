"""The pipeline's compute threads: the stage daemon's `threads = 0` (the default) starts one per CPU
the daemon may use (its affinity mask and cgroup quota), and a configured count above that is kept
with a warning; `ppserve cluster` warns when its stages' threads together exceed those CPUs. A
stage in a cgroup with a memory limit logs that limit and registers it as its memory, so the
coordinator does not plan a model into it that the kernel would kill it for. A stage is started
alone (its coordinator not up yet) or beside a coordinator, and read from the logs."""
import json
import os
import re
import subprocess

import grpc
import pytest

from cluster import (CHANNEL_OPTIONS, CLEAN_ENV, COORDINATOR, MODEL_FLAGS, PPSERVE,
                     SANITIZER_MARKS, STAGE, _sanitized, free_port, need_daemons, scaled,
                     terminate, wait_until)
from conftest import run, v1_cgroup

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


def start_stage(tmp_path, cpus, *flags, cgroup=None, coordinator=None, model_root=None,
                listen="127.0.0.1:0"):
    """ppserve-stage on cpus (and in the cgroup folder), logging to a file, registering with
    coordinator (by default a port where none listens); returns (process, log path)."""
    need_daemons()
    log = tmp_path / "stage.log"

    def limit():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.sched_setaffinity(0, cpus)
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(STAGE), "--coordinator",
                                 coordinator or f"127.0.0.1:{free_port()}", "--listen",
                                 listen, "--model_root", str(model_root or tmp_path),
                                 "--log_level", "info", *flags],
                                stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV,
                                preexec_fn=limit)
    return proc, log


def workers_line(proc, log):
    """The daemon's "workers:" line, once it has logged it; the daemon is then stopped."""
    try:
        def seen():
            m = re.search(r"workers: tp=\d+ ep=\d+ threads=(\d+)", log.read_text(errors="replace"))
            assert proc.poll() is None, log.read_text(errors="replace")
            return m
        m = wait_until(seen, scaled(60), "the stage's workers line")
        return int(m.group(1)), log.read_text(errors="replace")
    finally:
        terminate(proc)
        text = log.read_text(errors="replace")
        assert not any(mark in text for mark in SANITIZER_MARKS), text[-5000:]


def test_stage_threads_default_to_the_usable_cpus(tmp_path):
    one = {min(os.sched_getaffinity(0))}
    threads, text = workers_line(*start_stage(tmp_path, one))
    assert threads == 1, text
    assert "cpus: 1 usable CPU (" in text, text
    assert "compute threads on" not in text, text


def test_stage_threads_above_the_cpus_warn(tmp_path):
    one = {min(os.sched_getaffinity(0))}
    threads, text = workers_line(*start_stage(tmp_path, one, "--threads", "2",
                                              "--devices", "cpu"))
    assert threads == 2, text
    assert re.search(r" warn .*2 compute threads on 1 usable CPU \(", text), text


def test_stage_memory_mb_above_what_it_may_use_warns(tmp_path):
    _, text = workers_line(*start_stage(tmp_path, os.sched_getaffinity(0), "--memory_mb",
                                        str(1 << 30)))
    assert re.search(r" warn .*memory_mb = 1073741824 is more than this process may use \(",
                     text), text
    assert "memory offered:" not in text, text


@pytest.mark.parametrize("flags", [("--threads", "1"), ()], ids=["threads", "default"])
def test_cluster_warns_when_its_stages_share_too_few_cpus(models, tmp_path, flags):
    need_daemons()
    model = models.get("pipe6", *MODEL_FLAGS) / "model.gguf"
    one = {min(os.sched_getaffinity(0))}
    log = tmp_path / "cluster.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([PPSERVE, "cluster", "--model", str(model), "--stages", "2",
                                 *flags, "--port", str(free_port())],
                                stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV,
                                preexec_fn=lambda: os.sched_setaffinity(0, one))
    try:
        text = wait_until(lambda: "serving" in log.read_text(errors="replace") and
                          log.read_text(errors="replace"), scaled(60), "the cluster serving")
    finally:
        terminate(proc, 60)
    assert "2 stages, 1 thread each: 2 compute threads on 1 usable CPU (" in text, text


@pytest.fixture
def memory_cgroup(request):
    """A cgroup v1 memory folder limited to request.param MiB (768 by default); removed at the
    end."""
    yield from v1_cgroup("memory",
                         [("memory.limit_in_bytes", str(getattr(request, "param", 768) << 20))])


def test_stage_offers_its_cgroup_memory_limit(tmp_path, memory_cgroup):
    every = os.sched_getaffinity(0)
    _, text = workers_line(*start_stage(tmp_path, every, cgroup=memory_cgroup))
    assert re.search(r"memory: 0\.75 GiB usable \(host [0-9.]+ GiB, cgroup limit 0\.75 GiB in "
                     + re.escape(str(memory_cgroup)) + r"/memory\.limit_in_bytes\)", text), text


# 605 MiB of f32 weights: more than a 512 MiB stage can hold
BIG = ("--dim", "1024", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ffn", "4096",
       "--vocab", "16000", "--ctx", "256", "--dtype", "f32", "--seed", "9")


def start_pair(tmp_path, root, cgroup, *stage_flags, kv_mb=64):
    """A coordinator for root's model.gguf on one stage, and that stage (in the cgroup folder,
    unless None, with kv_mb); returns (coordinator, stage, coordinator log, address)."""
    need_daemons()
    port = free_port()
    clog = tmp_path / "coordinator.log"
    with open(clog, "wb") as f:
        coord = subprocess.Popen([str(COORDINATOR), "--listen", f"127.0.0.1:{port}", "--model",
                                  "model.gguf", "--model_root", str(root), "--stages", "1",
                                  "--log_level", "info"],
                                 stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV)
    stage, _ = start_stage(tmp_path, os.sched_getaffinity(0), "--kv_mb", str(kv_mb), *stage_flags,
                           cgroup=cgroup, coordinator=f"127.0.0.1:{port}", model_root=root)
    return coord, stage, clog, f"127.0.0.1:{port}"


def plan_refused(tmp_path, root, cgroup, *stage_flags):
    """The coordinator's log once it has refused to plan root's model onto the one stage."""
    coord, stage, clog, _ = start_pair(tmp_path, root, cgroup, *stage_flags)
    try:
        text = wait_until(lambda: "pipeline not formed" in clog.read_text(errors="replace") and
                          clog.read_text(errors="replace"), scaled(60), "the coordinator's plan")
    finally:
        terminate(stage)
        terminate(coord)
    assert stage.returncode == 0, (tmp_path / "stage.log").read_text(errors="replace")
    return text


@pytest.mark.parametrize("memory_cgroup", [512], indirect=True)
def test_coordinator_plans_within_a_stages_cgroup_memory(models, tmp_path, memory_cgroup):
    if _sanitized(STAGE):
        pytest.skip("a sanitized stage needs more than 512 MiB of its own")
    text = plan_refused(tmp_path, models.get("limits_605mib", *BIG), memory_cgroup)
    # before, the stage offered the host's RAM (23.5 GiB here) as its memory
    assert re.search(r"stage registered id=\d+ .* worker_memory_mib=512 ", text), text
    assert "no partition of 8 layers fits the stages' memory" in text, text
    assert f"workers, which have {512 << 20} in all" in text, text


def test_stage_memory_mb_caps_what_it_offers(models, tmp_path):
    """memory_mb, as `ppserve cluster` sets it for stages that share a host: the coordinator
    plans within it, as within a cgroup's limit."""
    text = plan_refused(tmp_path, models.get("limits_605mib", *BIG), None, "--memory_mb", "512")
    assert re.search(r"stage registered id=\d+ .* worker_memory_mib=512 ", text), text
    assert f"workers, which have {512 << 20} in all" in text, text
    stage_log = (tmp_path / "stage.log").read_text(errors="replace")
    assert "memory offered: 512 MiB (memory_mb)" in stage_log, stage_log


def test_cluster_gives_each_stage_a_share_of_the_memory(models, tmp_path):
    need_daemons()
    model = models.get("pipe6", *MODEL_FLAGS) / "model.gguf"
    log = tmp_path / "cluster.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([PPSERVE, "cluster", "--model", str(model), "--stages", "2",
                                 "--port", str(free_port()), "--log-level", "info"],
                                stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV)
    try:
        text = wait_until(lambda: log.read_text(errors="replace").count("stage registered") == 2
                          and log.read_text(errors="replace"), scaled(60), "both stages")
    finally:
        terminate(proc, 60)
    usable = re.findall(r"memory: ([0-9.]+) GiB usable", text)
    offered = [int(n) for n in re.findall(r"worker_memory_mib=(\d+) ", text)]
    assert len(usable) == 2 and len(offered) == 2 and offered[0] == offered[1], text
    half = float(usable[0]) * 1024 / 2  # GiB with two decimals: within 5 MiB of the bytes
    assert abs(offered[0] - half) <= 6, text


def test_plan_leaves_room_for_the_kv_and_the_process(models, tmp_path):
    """605 MiB of weights in 640 MiB: the weights alone fit, but not beside the planner's KV floor
    (one sequence of the model's 256 positions) and the process's 64 MiB. Before, the plan
    counted the weights alone, and the stage had to map them to survive."""
    text = plan_refused(tmp_path, models.get("limits_605mib", *BIG), None, "--memory_mb", "640")
    assert "no partition of 8 layers fits the stages' memory" in text, text
    assert f"plus {64 << 20} per worker for the process: " in text, text
    assert f"on the 1 stages' workers, which have {640 << 20} in all" in text, text


# 151 MiB of f32 weights
MID = ("--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ffn", "2048",
       "--vocab", "8000", "--ctx", "256", "--dtype", "f32", "--seed", "5")


def test_kv_budget_is_what_memory_leaves_beside_the_weights(models, tmp_path):
    """A stage asking for 1024 MiB of KV (kv_mb) in 400 MiB: the coordinator gives it what the
    weights and the process's reserve leave, says so, and the pipeline serves the run's tokens.
    Before, the stage took its whole kv_mb beside the weights, more than it offered."""
    root = models.get("limits_151mib", *MID)
    want = run([PPSERVE, "run", "--model", str(root / "model.gguf"), "--prompt-ids", "1,2,3",
                "--max-tokens", "3", "--json"])
    coord, stage, clog, addr = start_pair(tmp_path, root, None, "--memory_mb", "400",
                                          kv_mb=1024)
    try:
        run([PPSERVE, "status", "--addr", addr, "--wait", str(int(scaled(60)))])
        got = run([PPSERVE, "generate", "--addr", addr, "--prompt-ids", "1,2,3", "--max-tokens",
                   "3", "--json"])
    finally:
        terminate(stage)
        terminate(coord)
    text = clog.read_text(errors="replace")
    m = re.search(r"KV budget ([0-9.]+) MiB of the 1024\.0 MiB it asked for \(kv_mb\): each of "
                  r"its 1 workers has 400\.0 MiB, of which 8 layers' weights and the process's "
                  r"reserve take ([0-9.]+) MiB", text)
    assert m, text
    budget, used = float(m.group(1)), float(m.group(2))
    assert abs(budget + used - 400.0) < 0.2 and 151.0 + 64.0 < used < 152.0 + 64.0, text
    assert re.search(r"stage registered id=\d+ .* worker_memory_mib=400 kv_mib=1024 ", text), text
    assert f"kv_budget_mib={budget:.1f} " in text, text
    # the stage's cache holds what that budget buys: blocks of 16 positions, 8 layers, K and V
    # of 4 heads of 64 floats
    stage_log = (tmp_path / "stage.log").read_text(errors="replace")
    blocks = int(re.search(r"assigned: .* kv_blocks=(\d+) ", stage_log).group(1))
    block_bytes = 8 * 2 * 16 * 4 * 64 * 4
    assert blocks == int(budget * (1 << 20)) // block_bytes or \
        abs(blocks * block_bytes - budget * (1 << 20)) <= block_bytes + 0.1 * (1 << 20), stage_log
    assert json.loads(got.stdout)["ids"] == json.loads(want.stdout)["ids"]


@pytest.mark.parametrize("memory_cgroup", [640], indirect=True)
def test_stage_maps_weights_an_assignment_cannot_copy(models, tmp_path, memory_cgroup, protos):
    """The stage's own checks, for Assigns that do not leave room (the coordinator's plan always
    does now, so they come straight from this test): 605 MiB of weights beside a 64 MiB KV budget
    in 640 MiB. The stage maps the weights instead of being killed while copying them, and
    answers with its cache. Then a 4 GiB KV budget, which even mapped weights leave no room for:
    the stage holds the 576 MiB that 640 less 64 MiB for the rest allow, and says so. The
    Assigns name a coordinator that listens (one waiting for two stages, which ignores this one's
    results): where none listened, the refused connection could end the stage's result stream
    before its first message was queued, and the Assign failed (once under ctest -j2)."""
    if _sanitized(STAGE):
        pytest.skip("a sanitized stage needs more than 640 MiB of its own")
    root = models.get("limits_605mib", *BIG)
    identity = json.loads(run([PPSERVE, "inspect", "--model", str(root / "model.gguf"),
                               "--json"]).stdout)["identity"]
    addr, coord_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with open(tmp_path / "coordinator.log", "wb") as f:
        coord = subprocess.Popen([str(COORDINATOR), "--listen", coord_addr, "--model",
                                  "model.gguf", "--model_root", str(root), "--stages", "2",
                                  "--log_level", "info"],
                                 stdout=f, stderr=subprocess.STDOUT, env=CLEAN_ENV)
    stage = None
    pb = protos.stage
    try:
        stage, log = start_stage(tmp_path, os.sched_getaffinity(0), cgroup=memory_cgroup,
                                 model_root=root, listen=addr)
        wait_until(lambda: "probe: device=" in log.read_text(errors="replace"), scaled(60),
                   "the stage's probe")
        with grpc.insecure_channel(coord_addr, options=CHANNEL_OPTIONS) as cc:
            grpc.channel_ready_future(cc).result(timeout=scaled(60))
        with grpc.insecure_channel(addr, options=CHANNEL_OPTIONS) as ch:
            grpc.channel_ready_future(ch).result(timeout=scaled(60))
            assign = ch.unary_unary("/ppserve.v1.Stage/Assign",
                                    request_serializer=pb.Assignment.SerializeToString,
                                    response_deserializer=pb.AssignResponse.FromString)
            r, big = (assign(pb.Assignment(stage_id=1, index=0, n_stages=1, model="model.gguf",
                                           model_id=identity, first_layer=0, last_layer=8,
                                           coordinator=coord_addr,
                                           kv_budget_bytes=kv), timeout=scaled(120))
                      for kv in (64 << 20, 4 << 30))
    finally:
        if stage is not None:
            terminate(stage)
        terminate(coord)
    text = log.read_text(errors="replace")
    assert stage.returncode == 0, text  # copying there: killed by the kernel while loading
    assert "cpu_weights=copy: the weights (605.0 MiB) beside the KV cache (64.0 MiB)" in text, text
    # blocks of 16 positions, 8 layers, K and V of 4 heads of 128 floats: 0.5 MiB each
    assert r.kv_blocks == 128 and r.weight_bytes > 600 << 20, r
    assert "kv budget: 4096.0 MiB asked for, more than this process may use beside 64 MiB for " \
        "the rest (0.62 GiB usable" in text, text
    assert "): holding 576.0 MiB" in text, text
    assert big.kv_blocks == 1152, big


@pytest.mark.parametrize("memory_cgroup", [160], indirect=True)
def test_stage_probe_fits_a_small_cgroup(tmp_path, memory_cgroup):
    if _sanitized(STAGE):
        pytest.skip("a sanitized stage needs more than 160 MiB of its own")
    proc, log = start_stage(tmp_path, os.sched_getaffinity(0), cgroup=memory_cgroup)
    try:
        text = wait_until(lambda: (proc.poll() is not None or "probe: device=" in
                                   log.read_text(errors="replace")) and
                          log.read_text(errors="replace"), scaled(60), "the stage's probe")
    finally:
        terminate(proc)
    # before, the probe's 64 MiB weight and its 64 MiB copy got the stage killed here (SIGKILL)
    assert proc.returncode == 0, text
    assert "probe: 1024 of 4096 rows, for the 160.0 MiB this process may use" in text, text
