"""`ppserve run --tp W` against the numpy reference and against --tp 1, as a user runs it: the same
greedy tokens, logits within 1e-5 of --tp 1 (f32 weights) and 1e-4 of the reference, in both
formats; a run repeated gives the same bits; degrees the model cannot split are refused with a
message naming the degree and what it must divide."""
import numpy as np
import pytest

from conftest import PPSERVE, ppserve_run, reference, rel_err, run

PROMPT = [1, 17, 200, 45, 99, 3, 150]
STEPS = 6
SHAPE = ("--dim", "64", "--layers", "3", "--heads", "8", "--kv-heads", "2", "--ffn", "160",
         "--vocab", "300", "--ctx", "128")


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_matches_tp1_and_reference(models, tmp_path, fmt, tp):
    root = models.get("tp_gqa", *SHAPE, "--seed", "31")
    model = root / "model.gguf" if fmt == "gguf" else root / "hf"
    one, one_logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--tp", "1"), tag="tp1")
    out, logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--tp", str(tp), "--threads", "2"),
                              tag=f"tp{tp}")
    assert out["ids"] == one["ids"]
    assert rel_err(logits, one_logits).max() <= 1e-5
    ref_ids, ref_logits = reference(model, PROMPT, out["ids"], tmp_path)
    assert rel_err(logits, ref_logits).max() <= 1e-4
    assert out["ids"] == ref_ids
    again, again_logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--tp", str(tp)),
                                      tag=f"tp{tp}b")
    assert np.array_equal(again_logits.view(np.uint32), logits.view(np.uint32))


def test_tp_qwen2_bias_bf16(models, tmp_path):
    root = models.get("tp_qwen2", *SHAPE, "--arch", "qwen2", "--dtype", "bf16", "--seed", "5")
    model = root / "model.gguf"
    one, _ = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--tp", "1"), tag="tp1")
    out, logits = ppserve_run(model, PROMPT, STEPS, tmp_path, ("--tp", "2"), tag="tp2")
    assert out["ids"] == one["ids"]
    ref_ids, ref_logits = reference(model, PROMPT, out["ids"], tmp_path)
    assert rel_err(logits, ref_logits).max() <= 1e-4


def test_bad_degrees(models, tmp_path):
    model = models.get("tp_gqa", *SHAPE, "--seed", "31") / "model.gguf"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--tp", "3"],
            check=False)
    assert p.returncode != 0
    assert "tp 3 does not divide the 8 attention heads" in p.stderr
    assert "valid tp: 1, 2, 4, 8" in p.stderr
    assert str(model) in p.stderr
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--tp", "2",
             "--ep", "2"],
            check=False)
    assert p.returncode != 0 and "mixture-of-experts" in p.stderr
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--tp", "0"],
            check=False)
    assert p.returncode != 0 and "--tp" in p.stderr
