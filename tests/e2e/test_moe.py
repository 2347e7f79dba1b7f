"""Mixture-of-Experts models (Mixtral, Qwen2-MoE) through `ppserve run` against the independent
numpy reference, in both formats and several dtypes: logits within 1e-4 (max|Δ| / max|ref| per
row) and identical greedy tokens. Also: both formats of one MoE model agree, and bad MoE files are
refused with messages that name the file and the key or tensor."""
import json

import pytest

from conftest import PPSERVE, ppserve_run, reference, rel_err, run

PROMPT = [1, 17, 200, 45, 99, 3, 150]
STEPS = 6
TOL = 1e-4

SMALL = ("--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "64",
         "--vocab", "300", "--ctx", "128")
MIXTRAL = SMALL + ("--arch", "mixtral")
QWEN = SMALL + ("--arch", "qwen2moe", "--tokenizer", "bpe")

CASES = {
    "mixtral_f32": MIXTRAL + ("--experts", "4", "--experts-used", "2"),
    "mixtral_f16": MIXTRAL + ("--experts", "8", "--experts-used", "2", "--dtype", "f16",
                              "--seed", "3"),
    "mixtral_q8_0": MIXTRAL + ("--experts", "6", "--experts-used", "3", "--dtype", "q8_0",
                               "--seed", "5"),
    "mixtral_top1_bf16": MIXTRAL + ("--experts", "4", "--experts-used", "1", "--dtype", "bf16",
                                    "--tied", "--seed", "7"),
    "qwen2moe_f32": QWEN + ("--experts", "8", "--experts-used", "3", "--expert-ffn", "32",
                            "--shared-ffn", "96"),
    "qwen2moe_norm_topk_f32": QWEN + ("--experts", "8", "--experts-used", "3", "--expert-ffn",
                                      "32", "--shared-ffn", "96", "--norm-topk", "1",
                                      "--seed", "11"),
    "qwen2moe_bf16": QWEN + ("--experts", "6", "--experts-used", "2", "--expert-ffn", "32",
                             "--dtype", "bf16", "--seed", "13"),
    "qwen2moe_norm_topk_q8_0": QWEN + ("--experts", "4", "--experts-used", "2", "--expert-ffn",
                                       "32", "--shared-ffn", "64", "--norm-topk", "1",
                                       "--dtype", "q8_0", "--seed", "17"),
    "qwen2moe_f16_sharded": QWEN + ("--experts", "4", "--experts-used", "4", "--expert-ffn",
                                    "32", "--dtype", "f16", "--shards", "3", "--seed", "19"),
}


@pytest.mark.parametrize("fmt", ["gguf", "hf"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_moe_matches_reference(models, tmp_path, case, fmt):
    root = models.get(case, *CASES[case])
    model = root / "model.gguf" if fmt == "gguf" else root / "hf"
    out, logits = ppserve_run(model, PROMPT, STEPS, tmp_path)
    assert len(out["ids"]) == STEPS and out["finish_reason"] == "length"
    ref_ids, ref_logits = reference(model, PROMPT, out["ids"], tmp_path)
    err = rel_err(logits, ref_logits)
    assert err.max() <= TOL, f"{case}/{fmt}: rel err per step {err}"
    assert out["ids"] == ref_ids, f"{case}/{fmt}: greedy tokens differ"


@pytest.mark.parametrize("case", ["mixtral_f32", "qwen2moe_norm_topk_f32"])
def test_moe_formats_agree(models, tmp_path, case):
    """GGUF (3-D expert tensors; mixtral also with permuted q/k) and HF (per-expert tensors)."""
    root = models.get(case, *CASES[case])
    g_out, g_logits = ppserve_run(root / "model.gguf", PROMPT, STEPS, tmp_path, tag="g")
    h_out, h_logits = ppserve_run(root / "hf", PROMPT, STEPS, tmp_path, tag="h")
    assert g_out["ids"] == h_out["ids"]
    assert rel_err(g_logits, h_logits).max() <= 1e-5


def test_moe_inspect(models):
    root = models.get("qwen2moe_norm_topk_f32", *CASES["qwen2moe_norm_topk_f32"])
    for path in (root / "model.gguf", root / "hf"):
        out = json.loads(run([PPSERVE, "inspect", "--model", str(path), "--json"]).stdout)
        assert out["arch"] == "qwen2moe"
        assert (out["experts"], out["experts_used"], out["expert_ffn"], out["shared_ffn"],
                out["norm_topk_prob"]) == (8, 3, 32, 96, True)


def _run_fails(model):
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--max-tokens", "1"],
            check=False)
    assert p.returncode != 0
    return p.stderr


def _edit_config(src, dst, edit):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).symlink_to(f)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").unlink()
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_bad_moe_configs_refused(models, tmp_path):
    hf = models.get("qwen2moe_f32", *CASES["qwen2moe_f32"]) / "hf"
    mix = models.get("mixtral_f32", *CASES["mixtral_f32"]) / "hf"
    err = _run_fails(_edit_config(hf, tmp_path / "k", lambda c: c.update(num_experts_per_tok=0)))
    assert "config.json" in err and "experts used per token is 0" in err and "1..8" in err
    err = _run_fails(_edit_config(hf, tmp_path / "n", lambda c: c.update(num_experts=9)))
    assert "blk.0.ffn_gate_inp.weight" in err and "expected shape [9, 64], got [8, 64]" in err
    err = _run_fails(_edit_config(hf, tmp_path / "d", lambda c: c.update(mlp_only_layers=[0])))
    assert "mlp_only_layers" in err
    err = _run_fails(_edit_config(mix, tmp_path / "m", lambda c: c.pop("num_local_experts")))
    assert "config.json" in err and "num_local_experts" in err
    err = _run_fails(_edit_config(mix, tmp_path / "x", lambda c: c.update(num_local_experts=5)))
    assert "expected shape [5, 64], got [4, 64]" in err


def test_synth_rejects_bad_moe_flags(tmp_path):
    base = [PPSERVE, "synth", "--out", str(tmp_path / "m"), *SMALL]
    p = run(base + ["--arch", "mixtral", "--experts", "4", "--experts-used", "5"], check=False)
    assert p.returncode != 0 and "n_experts_used" in p.stderr and "got 5" in p.stderr
    p = run(base + ["--arch", "llama", "--experts", "4"], check=False)
    assert p.returncode != 0 and "n_experts" in p.stderr and "mixtral and qwen2moe" in p.stderr
    p = run(base + ["--arch", "mixtral", "--experts", "4", "--experts-used", "2",
                    "--shared-ffn", "32"], check=False)
    assert p.returncode != 0 and "shared_ffn_dim" in p.stderr
