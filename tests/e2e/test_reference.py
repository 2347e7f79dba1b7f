"""ppserve run against the independent numpy reference, on several shapes in both formats:
logits within 1e-4 (max|Δ| / max|ref| per row) and identical greedy tokens."""
import pytest

from conftest import ppserve_run, reference, rel_err

PROMPT = [1, 17, 200, 45, 99, 3, 150]
STEPS = 8
TOL = 1e-4

SMALL = ("--dim", "64", "--layers", "3", "--heads", "4", "--ffn", "96", "--vocab", "300",
         "--ctx", "128")

CASES = {
    "llama_gqa_f32": SMALL + ("--kv-heads", "2"),
    "llama_mha_f16": SMALL + ("--kv-heads", "4", "--dtype", "f16", "--seed", "7"),
    "llama_tied_bf16": SMALL + ("--kv-heads", "2", "--dtype", "bf16", "--tied", "--seed", "3"),
    "llama_q8_0": SMALL + ("--kv-heads", "1", "--dtype", "q8_0", "--seed", "5"),
    "llama3_rope_scaling": SMALL + ("--kv-heads", "2", "--rope-llama3", "--seed", "11"),
    "qwen2_bias": SMALL + ("--kv-heads", "2", "--arch", "qwen2", "--seed", "13"),
    "qwen2_tied_f16": SMALL + ("--kv-heads", "1", "--arch", "qwen2", "--tied", "--dtype", "f16"),
    "head_dim_not_dim_over_heads": ("--dim", "64", "--layers", "2", "--heads", "4",
                                    "--kv-heads", "2", "--head-dim", "32", "--ffn", "96",
                                    "--vocab", "300", "--ctx", "128"),
    "sharded_hf": SMALL + ("--kv-heads", "2", "--shards", "3", "--seed", "17"),
    "demo_shape_bf16_llama3": ("--shape", "demo", "--dtype", "bf16", "--rope-llama3", "--tied",
                               "--ctx", "256", "--seed", "23"),
}


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_reference(models, tmp_path, case, fmt):
    root = models.get(case, *CASES[case])
    model = root / "model.gguf" if fmt == "gguf" else root / "hf"
    out, logits = ppserve_run(model, PROMPT, STEPS, tmp_path)
    assert out["prompt_ids"] == PROMPT
    assert len(out["ids"]) == STEPS and out["finish_reason"] == "length"
    ref_ids, ref_logits = reference(model, PROMPT, out["ids"], tmp_path)
    err = rel_err(logits, ref_logits)
    assert err.max() <= TOL, f"{case}/{fmt}: rel err per step {err}"
    assert out["ids"] == ref_ids, f"{case}/{fmt}: greedy tokens differ"


def test_mistral_sliding_window(models, tmp_path):
    """HF Mistral with a window shorter than the sequence: the window must be applied."""
    root = models.get("mistral_window", *SMALL, "--kv-heads", "2", "--arch", "mistral",
                      "--sliding-window", "4")
    model = root / "hf"
    prompt = PROMPT + [7, 8, 9]
    out, logits = ppserve_run(model, prompt, STEPS, tmp_path)
    ref_ids, ref_logits = reference(model, prompt, out["ids"], tmp_path)
    assert rel_err(logits, ref_logits).max() <= TOL
    assert out["ids"] == ref_ids


def test_rope_layouts_agree(models, tmp_path):
    """The same weights as HF (rotate-half), GGUF llama (permuted rows, interleaved pairs) and GGUF
    qwen2 (unpermuted, rotate-half) give the same logits and tokens."""
    llama = models.get("layout_llama", *SMALL, "--kv-heads", "2", "--qkv-bias", "1",
                       "--seed", "21", "--norm-eps", "1e-5")
    qwen = models.get("layout_qwen2", *SMALL, "--kv-heads", "2", "--qkv-bias", "1",
                      "--arch", "qwen2", "--seed", "21", "--norm-eps", "1e-5")
    runs = {
        "hf": ppserve_run(llama / "hf", PROMPT, STEPS, tmp_path, tag="hf"),
        "gguf-llama": ppserve_run(llama / "model.gguf", PROMPT, STEPS, tmp_path, tag="gl"),
        "gguf-qwen2": ppserve_run(qwen / "model.gguf", PROMPT, STEPS, tmp_path, tag="gq"),
    }
    base_out, base_logits = runs["hf"]
    for name, (out, logits) in runs.items():
        assert out["ids"] == base_out["ids"], name
        assert rel_err(logits, base_logits).max() <= 1e-5, name
