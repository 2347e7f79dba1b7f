"""`ppserve run` as a user drives it: determinism across threads, sampling reproducibility, stop
strings, streaming text, and clear errors with a non-zero exit for bad files, flags and prompts."""
import json
import shutil
import struct

import numpy as np
import pytest

from conftest import PPSERVE, ppserve_run, run

SMALL = ("--dim", "64", "--layers", "3", "--heads", "4", "--kv-heads", "2", "--ffn", "96",
         "--vocab", "300", "--ctx", "128")
PROMPT = [1, 17, 200, 45, 99, 3, 150]


@pytest.fixture(scope="module")
def model(models):
    return models.get("cli_small", *SMALL, "--seed", "31")


def run_fail(args):
    p = run([PPSERVE, *args], check=False)
    assert p.returncode != 0, f"expected failure: {args}\nstdout: {p.stdout}"
    assert "Segmentation" not in p.stderr and "Aborted" not in p.stderr
    assert p.stdout.strip() == "" or not p.stdout.startswith("{"), "no JSON result on failure"
    return p


def test_threads_give_identical_logits(model, tmp_path):
    gguf = model / "model.gguf"
    base_out, base = ppserve_run(gguf, PROMPT, 6, tmp_path, ("--threads", "1"), tag="t1")
    for t in ("2", "3", "4"):
        out, logits = ppserve_run(gguf, PROMPT, 6, tmp_path, ("--threads", t), tag="t" + t)
        assert out["ids"] == base_out["ids"]
        assert logits.tobytes() == base.tobytes(), f"--threads {t} changed the logits' bits"


def test_dump_logits_rows_and_json_contract(model, tmp_path):
    out, logits = ppserve_run(model / "hf", PROMPT, 5, tmp_path)
    assert set(out) == {"prompt_ids", "ids", "text", "finish_reason", "prefill_tokens_per_s",
                        "decode_tokens_per_s"}
    assert logits.shape == (5, 300)
    assert out["prompt_ids"] == PROMPT  # used exactly as given: no BOS added
    assert isinstance(out["text"], str)
    assert int(np.argmax(logits[0])) == out["ids"][0]  # greedy by default
    zero, _ = ppserve_run(model / "hf", PROMPT, 0, tmp_path, tag="zero")
    assert zero["ids"] == []


def test_seeded_sampling_is_reproducible(model, tmp_path):
    flags = ("--temperature", "1.2", "--top-k", "50", "--top-p", "0.95", "--min-p", "0.01",
             "--repeat-penalty", "1.1", "--ignore-eos")
    a, _ = ppserve_run(model / "model.gguf", PROMPT, 24, tmp_path, flags + ("--seed", "5"), tag="a")
    b, _ = ppserve_run(model / "model.gguf", PROMPT, 24, tmp_path, flags + ("--seed", "5"), tag="b")
    c, _ = ppserve_run(model / "model.gguf", PROMPT, 24, tmp_path, flags + ("--seed", "6"), tag="c")
    assert a["ids"] == b["ids"]
    assert a["ids"] != c["ids"]
    g, _ = ppserve_run(model / "model.gguf", PROMPT, 24, tmp_path,
                       ("--temperature", "0", "--seed", "9", "--ignore-eos"), tag="g")
    d, _ = ppserve_run(model / "model.gguf", PROMPT, 24, tmp_path, ("--ignore-eos",), tag="d")
    assert g["ids"] == d["ids"], "temperature 0 must be greedy whatever the seed"


def test_text_prompt_stream_and_stop(model, tmp_path):
    gguf = str(model / "model.gguf")
    base = ["run", "--model", gguf, "--prompt", "the cat", "--max-tokens", "30", "--ignore-eos"]
    j = json.loads(run([PPSERVE, *base, "--json"]).stdout)
    assert j["prompt_ids"][0] == 1  # the tokenizer adds BOS for text prompts
    streamed = run([PPSERVE, *base]).stdout
    assert streamed == j["text"] + "\n"
    text = j["text"]
    # a stop string from the middle of the greedy text ends generation just before it (taken from
    # repaired-free text: U+FFFD stands for raw bytes the stop string cannot match)
    candidates = [text[i:i + 3] for i in range(len(text) // 3, len(text) - 3)
                  if "\ufffd" not in text[i:i + 3] and text.index(text[i:i + 3]) > 0]
    assert candidates, f"no usable stop string in {text!r}"
    stop = candidates[0]
    s = json.loads(run([PPSERVE, *base, "--json", "--stop", stop]).stdout)
    assert s["finish_reason"] == "stop"
    assert s["text"] == text[:text.index(stop)]
    assert stop not in s["text"]


def corrupt(src, dst, fn):
    data = bytearray(src.read_bytes())
    fn(data)
    dst.write_bytes(bytes(data))
    return dst


def replace_once(data, old, new):
    i = data.find(old)
    assert i >= 0
    data[i:i + len(old)] = new


@pytest.mark.parametrize("what,edit,message", [
    ("truncated", lambda d: d.__delitem__(slice(len(d) // 2, None)), "truncated"),
    ("header_only", lambda d: d.__delitem__(slice(12, None)), "truncated"),
    ("bad_magic", lambda d: d.__setitem__(slice(0, 4), b"GGUX"), "not a GGUF file"),
    ("bad_version", lambda d: d.__setitem__(slice(4, 8), struct.pack("<I", 99)), "version"),
    ("unknown_arch", lambda d: replace_once(d, b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                            b"\x05\x00\x00\x00\x00\x00\x00\x00gptxx"),
     "unknown architecture"),
    ("missing_tensor", lambda d: replace_once(d, b"blk.1.ffn_up.weight", b"blk.1.ffn_UP.weight"),
     "missing tensor blk.1.ffn_up.weight"),
    ("empty", lambda d: d.__delitem__(slice(0, None)), "too short"),
])
def test_bad_gguf_files(model, tmp_path, what, edit, message):
    bad = corrupt(model / "model.gguf", tmp_path / f"{what}.gguf", edit)
    p = run_fail(["run", "--model", str(bad), "--prompt-ids", "1,2,3"])
    assert message in p.stderr, p.stderr


def test_bad_hf_checkpoints(model, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(model / "hf", hf)
    cfg = json.loads((hf / "config.json").read_text())

    (hf / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt_neox",
                                                "architectures": ["GPTNeoXForCausalLM"]}))
    assert "unknown architecture" in run_fail(["run", "--model", str(hf),
                                               "--prompt-ids", "1"]).stderr

    (hf / "config.json").write_text("{not json")
    assert "invalid JSON" in run_fail(["run", "--model", str(hf), "--prompt-ids", "1"]).stderr

    (hf / "config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                if k != "hidden_size"}))
    assert "hidden_size" in run_fail(["run", "--model", str(hf), "--prompt-ids", "1"]).stderr

    (hf / "config.json").write_text(json.dumps(cfg))
    st = hf / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) - 1000])
    assert "truncated" in run_fail(["run", "--model", str(hf), "--prompt-ids", "1"]).stderr
    st.write_bytes(b"\xff" * 8 + data[8:])
    assert "header length" in run_fail(["run", "--model", str(hf), "--prompt-ids", "1"]).stderr
    st.unlink()
    assert "model.safetensors" in run_fail(["run", "--model", str(hf), "--prompt-ids", "1"]).stderr


def test_missing_model():
    p = run_fail(["run", "--model", "/nonexistent/model.gguf", "--prompt-ids", "1"])
    assert "no such file" in p.stderr


def test_prompt_longer_than_context(model):
    ids = ",".join(["5"] * 200)
    p = run_fail(["run", "--model", str(model / "model.gguf"), "--prompt-ids", ids])
    assert "does not fit the context of 128" in p.stderr


@pytest.mark.parametrize("flags,message", [
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--min-p", "1"], "--min-p"),
    (["--max-tokens", "abc"], "--max-tokens"),
    (["--threads", "0"], "--threads"),
    (["--repeat-penalty", "0"], "--repeat-penalty"),
    (["--bogus"], "unknown flag"),
    (["--prompt", "hi"], "exactly one of --prompt and --prompt-ids"),
    (["--prompt-ids", "1,,2"], "--prompt-ids"),
])
def test_invalid_flags(model, flags, message):
    args = ["run", "--model", str(model / "model.gguf")]
    if "--prompt" not in flags and "--prompt-ids" not in flags:
        args += ["--prompt-ids", "1,2"]
    elif "--prompt" in flags:
        args += ["--prompt-ids", "1,2"]
    p = run_fail(args + flags)
    assert p.returncode == 2
    assert message in p.stderr, p.stderr


def test_token_outside_vocabulary(model):
    p = run_fail(["run", "--model", str(model / "model.gguf"), "--prompt-ids", "1,300"])
    assert "outside the vocabulary" in p.stderr


def test_synth_rejects_bad_shapes(tmp_path):
    p = run_fail(["synth", "--out", str(tmp_path / "x"), "--dim", "64", "--layers", "2",
                  "--heads", "5", "--ffn", "96", "--vocab", "300"])
    assert "heads" in p.stderr
    p = run_fail(["synth", "--out", str(tmp_path / "x"), "--shape", "nope"])
    assert "tinyllama" in p.stderr


def test_formats_tokenize_and_decode_alike(model):
    """The GGUF tokenizer metadata and tokenizer.json of one synthetic model give the same
    prompt ids and the same text."""
    outs = []
    for path in (model / "model.gguf", model / "hf"):
        p = run([PPSERVE, "run", "--model", str(path), "--prompt", "Once upon a time, the cat",
                 "--max-tokens", "12", "--json", "--ignore-eos"])
        outs.append(json.loads(p.stdout))
    assert outs[0]["prompt_ids"] == outs[1]["prompt_ids"]
    assert outs[0]["ids"] == outs[1]["ids"]
    assert outs[0]["text"] == outs[1]["text"]


@pytest.mark.parametrize("dtype", ["f16", "bf16", "q8_0"])
def test_portable_and_vector_paths_agree(models, tmp_path, monkeypatch, dtype):
    """The run-time-selected AVX2 loops and the portable C loops give the same bits."""
    root = models.get(f"simd_{dtype}", *SMALL, "--dtype", dtype, "--seed", "41")
    fast, fast_logits = ppserve_run(root / "model.gguf", PROMPT, 5, tmp_path, tag="fast")
    monkeypatch.setenv("PP_SIMD", "portable")
    port, port_logits = ppserve_run(root / "model.gguf", PROMPT, 5, tmp_path, tag="port")
    assert fast["ids"] == port["ids"]
    assert fast_logits.tobytes() == port_logits.tobytes()


def test_eos_list_and_generation_config(model, tmp_path):
    """eos_token_id may be a list (Llama 3.1), and generation_config.json may add end tokens: any of
    them ends generation with finish_reason "stop", the end token included in ids."""
    hf = tmp_path / "hf"
    shutil.copytree(model / "hf", hf)
    free, _ = ppserve_run(hf, PROMPT, 8, tmp_path, ("--ignore-eos",), tag="free")
    third = free["ids"][2]
    assert third not in free["ids"][:2]
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [2, third]}))
    out, _ = ppserve_run(hf, PROMPT, 8, tmp_path, tag="list")
    assert out["ids"] == free["ids"][:3] and out["finish_reason"] == "stop"
    (hf / "config.json").write_text(json.dumps({**cfg, "eos_token_id": 2}))
    (hf / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, third]}))
    out, _ = ppserve_run(hf, PROMPT, 8, tmp_path, tag="gen")
    assert out["ids"] == free["ids"][:3] and out["finish_reason"] == "stop"
    out, _ = ppserve_run(hf, PROMPT, 8, tmp_path, ("--ignore-eos",), tag="ign")
    assert out["ids"] == free["ids"]


def test_checkpoint_without_tokenizer_runs_from_ids(model, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(model / "hf", hf)
    (hf / "tokenizer.json").unlink()
    (hf / "tokenizer_config.json").unlink()
    out, logits = ppserve_run(hf, PROMPT, 4, tmp_path)
    assert out["text"] is None and len(out["ids"]) == 4
    streamed = run([PPSERVE, "run", "--model", str(hf), "--prompt-ids", "1,2,3",
                    "--max-tokens", "3"]).stdout.split()
    assert len(streamed) == 3 and all(s.isdigit() for s in streamed)
    p = run_fail(["run", "--model", str(hf), "--prompt", "hello"])
    assert "tokenizer" in p.stderr


def test_inspect(model, tmp_path):
    out = json.loads(run([PPSERVE, "inspect", "--model", str(model / "model.gguf"),
                          "--json"]).stdout)
    assert out["format"] == "gguf" and out["arch"] == "llama"
    assert (out["dim"], out["layers"], out["heads"], out["kv_heads"],
            out["vocab"]) == (64, 3, 4, 2, 300)
    assert out["rope_layout"] == "interleaved" and out["identity"].startswith("ppid1-")
    hf = json.loads(run([PPSERVE, "inspect", "--model", str(model / "hf"), "--json"]).stdout)
    assert hf["rope_layout"] == "rotate-half"
    assert hf["identity"] != out["identity"]
    again = json.loads(run([PPSERVE, "inspect", "--model", str(model / "hf"), "--json"]).stdout)
    assert again["identity"] == hf["identity"]
    assert "no such file" in run_fail(["inspect", "--model", str(tmp_path / "nope")]).stderr
