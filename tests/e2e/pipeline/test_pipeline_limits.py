"""The pipeline's compute threads: the stage daemon's `threads = 0` (the default) starts one per CPU
the daemon may use (its affinity mask and cgroup quota), and a configured count above that is kept
with a warning; `ppserve cluster` warns when its stages' threads together exceed those CPUs. A
stage in a cgroup with a memory limit logs that limit as the memory it offers the coordinator. The
stage is started alone (its coordinator not up yet) and read from its log."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from cluster import (CLEAN_ENV, MODEL_FLAGS, PPSERVE, SANITIZER_MARKS, STAGE, free_port,
                     need_daemons, scaled, terminate, wait_until)

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


def start_stage(tmp_path, cpus, *flags, cgroup=None):
    """ppserve-stage on cpus (and in the cgroup folder), logging to a file; returns (process, log
    path)."""
    need_daemons()
    log = tmp_path / "stage.log"

    def limit():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.sched_setaffinity(0, cpus)
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(STAGE), "--coordinator", f"127.0.0.1:{free_port()}",
                                 "--listen", "127.0.0.1:0", "--model_root", str(tmp_path),
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
def memory_cgroup():
    """A cgroup v1 memory folder limited to 768 MiB; removed at the end."""
    top = Path("/sys/fs/cgroup/memory")
    if os.geteuid() != 0 or not top.is_dir() or not os.access(top, os.W_OK):
        pytest.skip(f"no writable cgroup v1 memory hierarchy at {top}")
    d = top / f"ppserve-stage-test-{os.getpid()}"
    d.mkdir()
    try:
        (d / "memory.limit_in_bytes").write_text(str(768 << 20))
        yield d
    finally:
        d.rmdir()


def test_stage_offers_its_cgroup_memory_limit(tmp_path, memory_cgroup):
    every = os.sched_getaffinity(0)
    _, text = workers_line(*start_stage(tmp_path, every, cgroup=memory_cgroup))
    assert re.search(r"memory: 0\.75 GiB usable \(host [0-9.]+ GiB, cgroup limit 0\.75 GiB in "
                     + re.escape(str(memory_cgroup)) + r"/memory\.limit_in_bytes\)", text), text
