"""The compute threads follow the CPUs the process may use, as an operator sets them: an affinity
mask (taskset, a cpuset) or a cgroup CPU quota (a Kubernetes CPU limit, docker --cpus). Without
--threads, `ppserve run` starts one thread per usable CPU and says how it counted them; with more
threads than that it warns, and the tokens stay the same. `ppserve devices` shows the usable CPUs
and the usable memory (a cgroup memory limit below the host's RAM). Where copying the weights
would not fit that memory, `ppserve run` computes from the mapped file instead of being killed."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import PPSERVE, v1_cgroup

BIG = ("--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ffn", "2048",
       "--vocab", "8000", "--ctx", "256", "--dtype", "f32")  # 151 MiB of weights

SMALL = ("--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "96",
         "--vocab", "300", "--ctx", "128", "--dtype", "f16")
ARGS = ("--prompt-ids", "1,17,200,45", "--max-tokens", "4", "--json", "--log-level", "info")


@pytest.fixture(scope="module")
def model(models):
    return models.get("cpus_small", *SMALL, "--seed", "3") / "model.gguf"


def run_limited(args, cpus=None, cgroup=None):
    """Runs args with the affinity mask cpus and/or inside the cgroup folder, set in the child
    before it execs."""
    def limit():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300,
                          preexec_fn=limit)


def threads_logged(stderr):
    m = re.search(r"device=cpu threads=(\d+) ", stderr)
    assert m, stderr
    return int(m.group(1))


def test_default_is_the_affinity_mask(model):
    one = {min(os.sched_getaffinity(0))}
    p = run_limited([PPSERVE, "run", "--model", model, "--device", "cpu", *ARGS], cpus=one)
    assert p.returncode == 0, p.stderr
    assert threads_logged(p.stderr) == 1
    assert "cpus: 1 usable CPU (" in p.stderr and "affinity 1" in p.stderr, p.stderr
    assert "compute threads on" not in p.stderr, p.stderr

    every = os.sched_getaffinity(0)
    p = run_limited([PPSERVE, "run", "--model", model, "--device", "cpu", *ARGS], cpus=every)
    assert p.returncode == 0, p.stderr
    m = re.search(r"cpus: (\d+) usable CPU", p.stderr)
    assert m, p.stderr
    assert threads_logged(p.stderr) == int(m.group(1)) <= len(every)


def test_more_threads_than_cpus_warn_and_keep_the_tokens(model):
    one = {min(os.sched_getaffinity(0))}
    base = run_limited([PPSERVE, "run", "--model", model, "--device", "cpu", *ARGS,
                        "--threads", "1"], cpus=one)
    over = run_limited([PPSERVE, "run", "--model", model, "--device", "cpu", *ARGS,
                        "--threads", "3"], cpus=one)
    assert base.returncode == 0 and over.returncode == 0, base.stderr + over.stderr
    assert threads_logged(over.stderr) == 3
    warn = [line for line in over.stderr.splitlines() if " warn " in line]
    assert any("3 compute threads on 1 usable CPU (" in line for line in warn), over.stderr
    assert "compute threads on" not in base.stderr, base.stderr
    assert over.stdout.split('"prefill_tokens_per_s"')[0] == \
        base.stdout.split('"prefill_tokens_per_s"')[0]


def test_devices_counts_the_usable_cpus():
    one = {min(os.sched_getaffinity(0))}
    p = run_limited([PPSERVE, "devices"], cpus=one)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("cpu: 1 usable CPU ("), p.stdout


@pytest.fixture
def quota_cgroup():
    """A cgroup v1 cpu folder with a quota of one CPU (100 ms per 100 ms)."""
    yield from v1_cgroup("cpu", [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "100000")])


@pytest.fixture
def memory_cgroup():
    """A cgroup v1 memory folder limited to 768 MiB."""
    yield from v1_cgroup("memory", [("memory.limit_in_bytes", str(768 << 20))])


@pytest.fixture
def small_memory_cgroup():
    """A cgroup v1 memory folder limited to 128 MiB (a sanitizer's own memory would not fit)."""
    if b"__asan_init" in Path(PPSERVE).read_bytes():  # clang links its runtime in
        pytest.skip("an ASan build needs more than 128 MiB of its own")
    yield from v1_cgroup("memory", [("memory.limit_in_bytes", str(128 << 20))])


def test_default_follows_a_cgroup_quota(model, quota_cgroup):
    every = os.sched_getaffinity(0)
    p = run_limited([PPSERVE, "run", "--model", model, "--device", "cpu", *ARGS], cpus=every,
                    cgroup=quota_cgroup)
    assert p.returncode == 0, p.stderr
    assert threads_logged(p.stderr) == 1
    want = f"cgroup quota 1.00 in {quota_cgroup}/cpu.cfs_quota_us"
    assert "cpus: 1 usable CPU (" in p.stderr and want in p.stderr, p.stderr
    assert f"affinity {len(every)}" in p.stderr, p.stderr


def test_devices_shows_a_cgroup_memory_limit(memory_cgroup):
    plain = run_limited([PPSERVE, "devices"])
    assert plain.returncode == 0, plain.stderr
    m = re.search(r"^memory: ([0-9.]+) GiB usable \(host ([0-9.]+) GiB, ", plain.stdout, re.M)
    assert m and float(m.group(1)) <= float(m.group(2)), plain.stdout
    p = run_limited([PPSERVE, "devices"], cgroup=memory_cgroup)
    assert p.returncode == 0, p.stderr
    want = (f"memory: 0.75 GiB usable (host {m.group(2)} GiB, cgroup limit 0.75 GiB in "
            f"{memory_cgroup}/memory.limit_in_bytes)")
    assert want in p.stdout, p.stdout


def test_weights_that_would_not_fit_are_mapped(models, small_memory_cgroup):
    big = models.get("limits_151mib", *BIG, "--seed", "5") / "model.gguf"
    args = [PPSERVE, "run", "--model", big, "--device", "cpu", "--prompt-ids", "1,2,3",
            "--max-tokens", "4", "--json"]
    free = run_limited(args)
    assert free.returncode == 0, free.stderr
    assert "cpu_weights=copy" not in free.stderr, free.stderr
    held = run_limited(args, cgroup=small_memory_cgroup)
    assert held.returncode == 0, held.stderr  # copying 151 MiB there: killed, exit 137
    want = ("cpu_weights=copy: the weights (151.2 MiB) beside the KV cache (4.0 MiB) and 64 MiB "
            "for the rest need more than the 128.0 MiB this process may use (the cgroup limit in "
            f"{small_memory_cgroup}/memory.limit_in_bytes); computing from the mapped model file "
            "instead (--cpu-weights map)")
    assert want in held.stderr, held.stderr
    assert held.stdout.split('"prefill_tokens_per_s"')[0] == \
        free.stdout.split('"prefill_tokens_per_s"')[0]
