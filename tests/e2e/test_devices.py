"""Device selection as a user meets it: `ppserve run --device auto|cpu|cuda:N`. On a host without a
usable GPU (or a build without CUDA), auto runs on the CPU and says why in the log, and an explicit
cuda:N fails with a message naming the problem; on a host with a GPU, cuda:0 runs there and agrees
with the CPU within the tolerance of 16-bit matmul inputs. Malformed values are refused either
way."""
import re

import numpy as np
import pytest

from conftest import PPSERVE, ppserve_run, rel_err, run

SMALL = ("--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "96",
         "--vocab", "300", "--ctx", "128", "--dtype", "bf16")
PROMPT = [1, 17, 200, 45, 99, 3, 150]


@pytest.fixture(scope="module")
def model(models):
    return models.get("devices_small", *SMALL, "--seed", "7") / "model.gguf"


@pytest.fixture(scope="module")
def gpus():
    """The CUDA devices `ppserve devices` lists (none on a GPU-less host or a build without
    CUDA)."""
    out = run([PPSERVE, "devices"]).stdout
    assert out.startswith("cpu: "), out
    assert re.search(r"^cuda: ", out, re.M) or re.search(r"^cuda:0: ", out, re.M), out
    return re.findall(r"^(cuda:\d+): ", out, re.M)


def test_cpu_is_the_cpu_backend_bit_for_bit(model, tmp_path):
    base_out, base = ppserve_run(model, PROMPT, 5, tmp_path, ("--device", "cpu"), tag="base")
    again_out, again = ppserve_run(model, PROMPT, 5, tmp_path,
                                   ("--device", "cpu", "--threads", "1"),
                                   tag="t1")
    assert again_out["ids"] == base_out["ids"]
    assert again.tobytes() == base.tobytes()


def test_auto_says_what_it_uses(model, tmp_path, gpus):
    dump = tmp_path / "auto.logits"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", ",".join(map(str, PROMPT)),
             "--max-tokens", "5", "--json", "--device", "auto", "--log-level", "info",
             "--dump-logits", str(dump)])
    lines = [l for l in p.stderr.splitlines() if "requested=auto" in l]
    assert len(lines) == 1, p.stderr
    default_out, default = ppserve_run(model, PROMPT, 5, tmp_path, tag="default")
    if gpus:
        assert "device=cuda:0 requested=auto" in lines[0]
    else:
        assert "device=cpu requested=auto" in lines[0]
        assert re.search(r'reason="no GPU is used: (this build has no CUDA support|.*CUDA.*)"',
                         lines[0]), lines[0]
        cpu_out, cpu = ppserve_run(model, PROMPT, 5, tmp_path, ("--device", "cpu"), tag="cpu")
        assert default.tobytes() == cpu.tobytes(), "auto without a GPU must be the CPU backend"
    # the default is auto: the same device, so the same tokens and logits
    assert np.fromfile(dump, dtype="<f4").tobytes() == default.tobytes()


def test_explicit_cuda(model, tmp_path, gpus):
    if gpus:
        gpu_out, gpu = ppserve_run(model, PROMPT, 5, tmp_path, ("--device", "cuda:0"), tag="gpu")
        _, cpu = ppserve_run(model, PROMPT, 5, tmp_path, ("--device", "cpu"), tag="cpu")
        assert np.all(rel_err(gpu, cpu) < 2e-2), rel_err(gpu, cpu)
        return
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2,3", "--json",
             "--device", "cuda:0"], check=False)
    assert p.returncode != 0
    assert p.stdout == "", "no result on failure"
    assert "ppserve run: error: cuda:0: " in p.stderr, p.stderr
    assert ("this build has no CUDA support" in p.stderr or
            "no usable CUDA device" in p.stderr), p.stderr
    assert "Segmentation" not in p.stderr and "Aborted" not in p.stderr


def test_gpu_list_longer_than_the_host(model, gpus):
    ids = ",".join(str(i) for i in range(len(gpus) + 1))
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1", "--device",
             f"cuda:{ids}"], check=False)
    assert p.returncode != 0
    assert f"cuda:{len(gpus)}" in p.stderr or "no usable CUDA device" in p.stderr or \
        "no CUDA support" in p.stderr, p.stderr


def test_gpu_list_and_tp_disagree(model):
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1", "--device", "cuda:0,1",
             "--tp", "1"], check=False)
    assert p.returncode != 0
    assert "cuda:0,1 lists 2 devices for 1 worker: expected one device per worker" in p.stderr


@pytest.mark.parametrize("value, message", [
    ("cuda:", "expected device ids after \"cuda:\""),
    ("cuda:x", "expected device ids (numbers 0..1023) separated by commas after \"cuda:\", "
               "got 'cuda:x'"),
    ("gpu", "expected \"auto\", \"cpu\" or \"cuda:N[,N...]\" (N a CUDA device id), got 'gpu'"),
    ("cuda:0,0", "expected distinct device ids, got 'cuda:0,0' (cuda:0 twice)"),
    ("", "expected \"auto\", \"cpu\" or \"cuda:N[,N...]\" (N a CUDA device id), got an empty "
         "value"),
])
def test_bad_values(model, value, message):
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1", "--device", value],
            check=False)
    assert p.returncode == 2, p.stderr
    assert f"ppserve run: --device: {message}" in p.stderr, p.stderr
