"""`ppserve run --ep E [--tp W]` on MoE models, in both formats, as a user runs it: the same greedy
tokens as one worker, logits within 1e-5 of it (f32) and 1e-4 of the numpy reference; `--ep E` alone
means E workers of pure expert parallelism; degrees the model cannot split are refused."""
import pytest

from conftest import PPSERVE, ppserve_run, reference, rel_err, run

PROMPT = [1, 17, 200, 45, 99, 3, 150]
STEPS = 6
BASE = ("--dim", "64", "--layers", "2", "--heads", "8", "--kv-heads", "2", "--ffn", "64",
        "--vocab", "300", "--ctx", "128", "--experts", "8", "--experts-used", "2")
MODELS = {
    "mixtral": ("--arch", "mixtral", "--seed", "41"),
    "qwen2moe": ("--arch", "qwen2moe", "--shared-ffn", "96", "--norm-topk", "1", "--seed", "43"),
}


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("layout", [("--ep", "2"), ("--ep", "4"), ("--tp", "4", "--ep", "2"),
                                    ("--tp", "2")])
def test_ep_matches_one_worker_and_reference(models, tmp_path, fmt, arch, layout):
    root = models.get(f"ep_{arch}", *BASE, *MODELS[arch])
    model = root / "model.gguf" if fmt == "gguf" else root / "hf"
    one, one_logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--ignore-eos",), tag="one")
    out, logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--ignore-eos", *layout),
                              tag="ep")
    assert out["ids"] == one["ids"]
    assert rel_err(logits, one_logits).max() <= 1e-5
    ref_ids, ref_logits = reference(model, PROMPT, out["ids"], tmp_path)
    assert rel_err(logits, ref_logits).max() <= 1e-4
    assert out["ids"] == ref_ids


def test_bad_ep(models, tmp_path):
    model = models.get("ep_mixtral", *BASE, *MODELS["mixtral"]) / "model.gguf"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--tp", "4", "--ep",
             "3"], check=False)
    assert p.returncode != 0 and "ep: expected a divisor of tp (4), got 3" in p.stderr
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--ep", "16"],
            check=False)
    assert p.returncode != 0 and "tp 16 does not divide the 8 attention heads" in p.stderr
