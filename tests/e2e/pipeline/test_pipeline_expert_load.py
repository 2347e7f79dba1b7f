"""Expert parallelism inside the stages of a pipeline, and the expert load Status reports. A
Mixtral-shaped model on 2 stages of 4 workers in 2 expert groups gives the greedy tokens of one
process (logits within 1e-5) and the bits of `ppserve run --tp 4 --ep 2`; each stage reports, for
every MoE layer of its range, the tokens routed to each expert — exactly the routing the numpy
reference computes for the same tokens — each worker's share (the sum over its group's experts),
and the max/mean ratios; the text table summarises them."""
import json

import numpy as np
import pytest

from cluster import PPSERVE, json_line, scaled, wait_until
from conftest import PYTHON, REFERENCE, rel_err, run

pytest_plugins = ["pipeline_fixtures"]

PROMPT = [1, 17, 200, 45, 99, 3, 150, 77, 310, 5]
MAX_TOKENS = 8
EXPERTS, K, TP, EP = 8, 2, 4, 2
FLAGS = ("--arch", "mixtral", "--dim", "64", "--layers", "4", "--heads", "4", "--kv-heads", "2",
         "--ffn", "64", "--vocab", "512", "--ctx", "256", "--experts", str(EXPERTS),
         "--experts-used", str(K), "--seed", "29")


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe_moe", *FLAGS) / "model.gguf"


def generate(addr, tmp_path):
    dump = tmp_path / "pipeline.logits"
    p = run([PPSERVE, "generate", "--addr", addr, "--prompt-ids", ",".join(map(str, PROMPT)),
             "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", "--dump-logits",
             str(dump), "--timeout-ms", str(int(scaled(120) * 1000))], timeout=scaled(180))
    return json.loads(json_line(p.stdout)), np.fromfile(dump, dtype="<f4").reshape(MAX_TOKENS, -1)


def single_process(model, tmp_path, *flags):
    dump = tmp_path / f"run{'-'.join(flags)}.logits"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", ",".join(map(str, PROMPT)),
             "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json", "--dump-logits", str(dump),
             *flags], timeout=scaled(120))
    return json.loads(json_line(p.stdout)), np.fromfile(dump, dtype="<f4").reshape(MAX_TOKENS, -1)


def reference_routing(model, ids, tmp_path):
    """{layer: tokens per expert} the numpy reference routes for the tokens the engine feeds."""
    out = tmp_path / "routing.json"
    run([PYTHON, str(REFERENCE), "--model", str(model), "--prompt-ids",
         ",".join(map(str, PROMPT)), "--max-tokens", str(len(ids)), "--force-ids",
         ",".join(map(str, ids)), "--dump-routing", str(out)], timeout=scaled(120))
    r = json.loads(out.read_text())
    assert r["tokens"] == len(PROMPT) + len(ids) - 1
    return {x["layer"]: x["tokens_per_expert"] for x in r["layers"]}


def test_expert_parallel_stages_and_their_load(model, cluster_factory, tmp_path):
    cl = cluster_factory(model.parent, stages=2,
                         stage_flags=("--threads", "2", "--tp", str(TP), "--ep", str(EP)))
    assert [(s["tp"], s["ep"]) for s in cl.stage_status()] == [(TP, EP), (TP, EP)]
    got, logits = generate(cl.addr, tmp_path)
    one, one_logits = single_process(model, tmp_path)
    same, same_logits = single_process(model, tmp_path, "--tp", str(TP), "--ep", str(EP))
    assert got["ids"] == one["ids"]
    assert rel_err(logits, one_logits).max() <= 1e-5
    assert logits.tobytes() == same_logits.tobytes(), "not the bits of ppserve run --tp 4 --ep 2"

    want = reference_routing(model, got["ids"], tmp_path)
    assert sorted(want) == [0, 1, 2, 3]
    fed = len(PROMPT) + MAX_TOKENS - 1

    def loads():
        st = cl.stage_status()
        layers = {x["layer"]: x for s in st for x in s["expert_load"]}
        done = len(layers) == 4 and all(
            sum(int(n) for n in x["tokens_per_expert"]) == fed * K for x in layers.values())
        return (st, layers) if done else None
    st, layers = wait_until(loads, scaled(10), "the stages' expert load in Status")
    for s in st:  # each stage reports exactly its own layers
        assert [x["layer"] for x in s["expert_load"]] == \
            list(range(s["first_layer"], s["last_layer"]))
    per_group = EXPERTS // EP
    for layer, x in layers.items():
        experts = [int(n) for n in x["tokens_per_expert"]]
        assert experts == want[layer], f"layer {layer}: {experts} routed, reference {want[layer]}"
        # worker w holds its group's experts: group w // (TP / EP)
        workers = [int(n) for n in x["tokens_per_worker"]]
        groups = [sum(experts[g * per_group:(g + 1) * per_group]) for g in range(EP)]
        assert workers == [groups[w // (TP // EP)] for w in range(TP)]
        mean = sum(experts) / EXPERTS
        assert x["max_over_mean_expert"] == pytest.approx(max(experts) / mean)
        assert x["max_over_mean_worker"] == pytest.approx(max(workers) / (sum(workers) / TP))

    table = run([PPSERVE, "status", "--addr", cl.addr]).stdout
    assert "moe layers" in table and "max/mean expert" in table, table
    worst = max(layers.values(), key=lambda x: x["max_over_mean_expert"])
    assert f"{worst['max_over_mean_expert']:.2f}" in table, table


def test_dense_stages_report_no_expert_load(models, cluster_factory):
    from cluster import MODEL_FLAGS
    cl = cluster_factory(models.get("pipe6", *MODEL_FLAGS), stages=2)
    assert all(s["expert_load"] == [] for s in cl.stage_status())
    assert "moe layers" not in run([PPSERVE, "status", "--addr", cl.addr]).stdout
