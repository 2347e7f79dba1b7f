"""`ppserve run --cpu-weights copy|map`: the CPU backend computes from weights copied into huge-page
memory (the default) or from the mapped model file in place. Where the bytes live changes nothing
in the arithmetic: the same tokens and bit-identical logits either way, alone and split over
tensor-parallel workers (whose repacked column slices are never copied twice); a value that is
neither is refused before anything loads."""
import pytest

from conftest import PPSERVE, ppserve_run, run

SMALL = ("--dim", "64", "--layers", "3", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
         "--vocab", "300", "--ctx", "128")
PROMPT = [1, 17, 200, 45, 99, 3, 150]
# past PP_Q8_SPLIT_MIN_TOKENS_* and Q8Z_SPACED_MAX_TOKENS (kernels/cpu/matmul_q8*.h): the mapped
# Q8_0 rows rewritten per tile, spaced and adjacent
LONG_PROMPT = [(i * 37 + 5) % 300 for i in range(50)]


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
@pytest.mark.parametrize("tp", ["1", "2"])
@pytest.mark.parametrize("prompt", [PROMPT, LONG_PROMPT], ids=["7", "50"])
def test_copy_and_map_give_the_same_bits(models, tmp_path, dtype, tp, prompt):
    model = models.get(f"cpu_weights_{dtype}", *SMALL, "--dtype", dtype,
                       "--seed", "11") / "model.gguf"
    common = ("--device", "cpu", "--threads", "2", "--tp", tp)
    default_out, default = ppserve_run(model, prompt, 6, tmp_path, common, tag=f"d{tp}")
    copy_out, copy = ppserve_run(model, prompt, 6, tmp_path, (*common, "--cpu-weights", "copy"),
                                 tag=f"c{tp}")
    map_out, mapped = ppserve_run(model, prompt, 6, tmp_path, (*common, "--cpu-weights", "map"),
                                  tag=f"m{tp}")
    assert len(copy_out["ids"]) == 6
    assert copy_out["ids"] == map_out["ids"] == default_out["ids"]
    assert copy.tobytes() == mapped.tobytes() == default.tobytes()


def test_bad_value_is_refused(models):
    model = models.get("cpu_weights_f16", *SMALL, "--dtype", "f16", "--seed", "11") / "model.gguf"
    p = run([PPSERVE, "run", "--model", str(model), "--prompt-ids", "1,2", "--max-tokens", "2",
             "--cpu-weights", "mmap"], check=False)
    assert p.returncode == 2, p
    assert "--cpu-weights: expected copy" in p.stderr, p.stderr
    assert "got 'mmap'" in p.stderr, p.stderr
