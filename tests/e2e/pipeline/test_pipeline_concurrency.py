"""32 requests at once, with prompts of 1..100 tokens, 1..40 new tokens and every sampling knob:
each gets exactly the tokens `ppserve run` gives it alone, whatever it shared microbatches with."""
import random
import threading

import pytest

# grpc comes through cluster, which skips the module when grpcio is missing
from cluster import MODEL_FLAGS, grpc, scaled, single_process

pytest_plugins = ["pipeline_fixtures"]  # the fixtures, and daemon logs on failure


SAMPLINGS = [{},
             {"temperature": 0.8, "seed": 1},
             {"temperature": 1.0, "top_k": 20, "seed": 2},
             {"temperature": 0.9, "top_p": 0.8, "seed": 3},
             {"temperature": 1.3, "min_p": 0.1, "seed": 4},
             {"repeat_penalty": 1.5},
             {"temperature": 0.7, "top_k": 50, "top_p": 0.95, "min_p": 0.02,
              "repeat_penalty": 1.2, "seed": 123456789}]


@pytest.fixture(scope="module")
def model(models):
    return models.get("pipe6", *MODEL_FLAGS)


def make_requests(n=32, seed=2024):
    rnd = random.Random(seed)
    reqs = []
    for i in range(n):
        length = 1 + (i * 99) // (n - 1)  # 1 .. 100, evenly spread
        prompt = [rnd.randrange(3, 512) for _ in range(length)]
        max_tokens = 1 + (i * 7) % 40
        reqs.append((prompt, max_tokens, dict(SAMPLINGS[i % len(SAMPLINGS)])))
    return reqs


CONFIGS = {
    # a small token budget: prompts are prefilled in several chunks, decodes share microbatches
    "p3-budget48": dict(stages=3, coord_flags=("--max_batch_tokens", "48")),
    # an odd budget, more microbatches in flight than stages, uneven layers
    "p4-budget7-mb6": dict(stages=4, layers=[1, 2, 2, 1],
                           coord_flags=("--max_batch_tokens", "7", "--microbatches", "6")),
    # 1 MiB of KV per stage (about 130 blocks of 16 tokens): not all 32 fit at once, so some wait
    # for admission until others finish and free their blocks
    "p2-kv1mib": dict(stages=2, stage_flags=("--kv_mb", "1")),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_32_concurrent_requests_match_single_process(model, cluster_factory, config):
    cl = cluster_factory(model, **CONFIGS[config])
    c = cl.client()
    reqs = make_requests()
    expected = [single_process(cl.model, p, n, s)[0]["ids"] for p, n, s in reqs]

    results = [None] * len(reqs)
    start = threading.Barrier(len(reqs))

    def one(i):
        p, n, s = reqs[i]
        req = c.request(prompt_ids=p, max_tokens=n, **s)
        start.wait(timeout=scaled(30))
        results[i] = c.generate(req, timeout=120)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(scaled(240))
    assert not any(t.is_alive() for t in threads), "some requests never ended"

    bad = []
    for i, ((p, n, s), want, got) in enumerate(zip(reqs, expected, results)):
        if got.code != grpc.StatusCode.OK or got.ids != want or got.prompt_ids != p \
                or got.finish != 1 or got.usage is None or got.usage.completion_tokens != n:
            bad.append(f"#{i} prompt len {len(p)} max {n} {s}: want {want}, got {got!r} "
                       f"usage {got.usage}")
    assert not bad, f"{len(bad)} of {len(reqs)} requests differ:\n" + "\n".join(bad)

    st = cl.status()
    assert st["requests_running"] == 0 and st["requests_queued"] == 0
