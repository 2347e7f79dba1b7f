"""A pipeline computes exactly what one process computes: `ppserve generate --dump-logits` through
1..4 stages, planned and uneven partitions, greedy and seeded sampling, alone and next to other
requests, gives the bits of `ppserve run --dump-logits`."""
import json
import subprocess

import numpy as np
import pytest

from cluster import (CLEAN_ENV, MODEL_FLAGS, PPSERVE, json_line, sampling_flags, scaled,
                     single_process, wait_until)
from conftest import run

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure

PROMPT = [1, 17, 200, 45, 99, 3, 150, 77, 310, 5]
GREEDY = {}
SAMPLED = {"temperature": 0.8, "top_k": 40, "seed": 7}
# other traffic while the checked requests run, long enough to outlast them: (prompt, max tokens,
# sampling)
BACKGROUND = [([1, 2, 3], 200, {}),
              (list(range(20, 80)), 150, {"temperature": 1.1, "top_p": 0.9, "seed": 3}),
              ([9] * 17, 180, {"temperature": 0.7, "min_p": 0.05, "repeat_penalty": 1.3,
                               "seed": 11}),
              ([400, 401], 120, {"top_k": 5, "temperature": 2.0, "seed": 99})]


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


def generate_cmd(addr, prompt_ids, max_tokens, sampling, dump=None):
    args = [PPSERVE, "generate", "--addr", addr, "--prompt-ids", ",".join(map(str, prompt_ids)),
            "--max-tokens", str(max_tokens), "--ignore-eos", "--json", *sampling_flags(sampling),
            "--timeout-ms", str(int(scaled(120) * 1000))]
    if dump:
        args += ["--dump-logits", str(dump)]
    return args


def parse_json(p, args):
    assert p.returncode == 0, f"{' '.join(args)} exited {p.returncode}:\n{p.stderr}"
    return json.loads(json_line(p.stdout))


def check_same(cl, tmp_path, prompt, max_tokens, sampling, tag, vocab=512):
    ref, ref_logits = single_process(cl.model, prompt, max_tokens, sampling, tmp_path=tmp_path,
                                     tag=f"{tag}-run")
    dump = tmp_path / f"{tag}-gen.logits"
    args = generate_cmd(cl.addr, prompt, max_tokens, sampling, dump)
    got = parse_json(run(args, check=False, timeout=scaled(180)), args)
    assert got["prompt_ids"] == ref["prompt_ids"] == prompt
    assert got["ids"] == ref["ids"], f"{tag}: pipeline ids differ from ppserve run"
    assert got["finish_reason"] == ref["finish_reason"]
    assert got["text"] == ref["text"]
    logits = np.fromfile(dump, dtype="<f4")
    assert logits.size == ref_logits.size == max_tokens * vocab, (logits.size, ref_logits.size)
    if logits.tobytes() != ref_logits.tobytes():
        rows = np.nonzero(np.any(logits.reshape(max_tokens, -1) !=
                                 ref_logits.reshape(max_tokens, -1), axis=1))[0]
        raise AssertionError(f"{tag}: logits rows {rows.tolist()} are not bit-identical "
                             f"(max |diff| {np.max(np.abs(logits - ref_logits))})")


@pytest.mark.parametrize("stages,layers", [(1, None), (2, None), (3, None), (4, None),
                                           (2, [1, 5]), (3, [3, 1, 2]), (4, [2, 2, 1, 1])],
                         ids=["p1", "p2", "p3", "p4", "1+5", "3+1+2", "2+2+1+1"])
def test_bit_identical_to_single_process(model, cluster_factory, tmp_path, stages, layers):
    cl = cluster_factory(model, stages=stages, layers=layers)
    st = cl.stage_status()
    assert len(st) == stages
    ranges = [(s["first_layer"], s["last_layer"]) for s in st]
    assert ranges[0][0] == 0 and ranges[-1][1] == 6
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), f"not contiguous: {ranges}"
    if layers:
        assert [b - a for a, b in ranges] == layers

    check_same(cl, tmp_path, PROMPT, 24, GREEDY, "greedy")
    check_same(cl, tmp_path, PROMPT, 24, SAMPLED, "sampled")

    # the same two while four other requests share the pipeline's microbatches
    bg = []
    for p, n, s in BACKGROUND:
        args = generate_cmd(cl.addr, p, n, s)
        bg.append((args, p, n, s, subprocess.Popen(args, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True,
                                                   env=CLEAN_ENV)))
    try:
        check_same(cl, tmp_path, PROMPT, 24, GREEDY, "greedy-busy")
        check_same(cl, tmp_path, PROMPT, 24, SAMPLED, "sampled-busy")
        for args, p, n, s, proc in bg:
            out, err = proc.communicate(timeout=scaled(180))
            got = parse_json(subprocess.CompletedProcess(args, proc.returncode, out, err), args)
            ref, _ = single_process(cl.model, p, n, s)
            assert got["ids"] == ref["ids"], f"background request {p[:5]}... {s} differs"
    finally:
        for *_, proc in bg:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


WIDE_FLAGS = ("--dim", "1024", "--layers", "2", "--heads", "8", "--kv-heads", "4", "--ffn", "256",
              "--vocab", "512", "--ctx", "1024", "--dtype", "f32", "--seed", "5")


def test_activations_above_the_chunk_size(models, cluster_factory, tmp_path):
    """A 600-token prompt of a 1024-wide model: its first microbatch carries 512 x 1024 x 4 bytes
    = 2 MiB of activations, so the hop splits it into 1 MiB chunks and reassembles it."""
    model = models.get("pipe-wide", *WIDE_FLAGS)
    cl = cluster_factory(model, stages=2, layers=[1, 1], coord_flags=("--max_batch_tokens", "512"))
    prompt = [3 + (i * 7) % 500 for i in range(600)]
    check_same(cl, tmp_path, prompt, 4, GREEDY, "wide", vocab=512)
    # stage 1 received the activations of every prompt token (heartbeats bring the counter)
    wait_until(lambda: int(cl.stage_status()[1]["bytes_in"]) >= 600 * 1024 * 4, scaled(5),
               "stage 1's bytes_in to count 600 rows of 1024 floats")


MOE_FLAGS = {
    "mixtral": ("--dim", "64", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--ffn", "64",
                "--vocab", "512", "--ctx", "256", "--arch", "mixtral", "--experts", "4",
                "--experts-used", "2", "--seed", "29"),
    "qwen2moe": ("--dim", "64", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--ffn", "64",
                 "--vocab", "512", "--ctx", "256", "--arch", "qwen2moe", "--experts", "6",
                 "--experts-used", "2", "--expert-ffn", "32", "--norm-topk", "1", "--seed", "31"),
}


@pytest.mark.parametrize("arch", sorted(MOE_FLAGS))
def test_moe_bit_identical_to_single_process(models, cluster_factory, tmp_path, arch):
    """MoE layers split over stages, next to other requests, give the bits of one process."""
    model = models.get(f"pipe-{arch}", *MOE_FLAGS[arch])
    cl = cluster_factory(model, stages=3, layers=[1, 2, 1])
    check_same(cl, tmp_path, PROMPT, 16, GREEDY, f"{arch}-greedy")
    check_same(cl, tmp_path, PROMPT, 16, SAMPLED, f"{arch}-sampled")
