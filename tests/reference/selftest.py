#!/usr/bin/env python3
"""Self-check of the numpy reference (run with /usr/bin/python3, takes a few seconds).

The reference is only useful if its readers and its handling of the GGUF q/k permutation are
right, so this builds tiny random models, writes the *same* stored values as HF safetensors and
as GGUF (llama: permuted, qwen2: not) in several dtypes, and requires every format to give the
same logits (1e-9 relative). It also compares against a deliberately naive loop-per-token
forward written here from the math, so the vectorized model itself is checked, not just the
readers. The file writers live here because they are test helpers: ppserve must never share them.
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402
import gguf_reader  # noqa: E402
from gguf_reader import GGUFFile  # noqa: E402

TOL = 1e-9
FAILS = []
N_CHECKS = [0]


def check(ok, name, detail=""):
    N_CHECKS[0] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'  ' + detail if detail else ''}")
    if not ok:
        FAILS.append(name)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ----------------------------------------------------------------------------------------------
# Value encodings (test-side, written independently of the readers)

GGML_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 8, "F64": 28, "BF16": 30}


def round_bf16(a):
    """Round to the nearest bf16 (ties to even), returned as float64."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def round_to(a, kind):
    if kind == "F16":
        return np.asarray(a).astype(np.float16).astype(np.float64)
    if kind == "BF16":
        return round_bf16(a)
    return np.asarray(a).astype(np.float32).astype(np.float64)


def encode_plain(a, kind):
    """Bytes of `a` stored as F64/F32/F16/BF16; the values must already be exact in `kind`."""
    a = np.asarray(a, np.float64)
    if kind == "F64":
        return a.astype("<f8").tobytes()
    if kind == "F32":
        s = a.astype("<f4")
    elif kind == "F16":
        s = a.astype("<f2")
    elif kind == "BF16":
        bits = a.astype(np.float32).view(np.uint32)
        assert not np.any(bits & 0xFFFF), "value not exact in bf16"
        return (bits >> 16).astype("<u2").tobytes()
    else:
        raise ValueError(kind)
    assert np.array_equal(s.astype(np.float64), a), f"value not exact in {kind}"
    return s.tobytes()


def q8_0_quantize(a):
    """Q8_0 along the last axis: returns (raw bytes, dequantized float64 values)."""
    flat = np.asarray(a, np.float64).reshape(-1, 32)
    d16 = (np.abs(flat).max(axis=1) / 127.0).astype(np.float16)
    d = d16.astype(np.float64)
    q = np.clip(np.rint(flat / np.where(d == 0, 1.0, d)[:, None]), -127, 127).astype(np.int8)
    raw = np.concatenate([d16.astype("<f2").view(np.uint8).reshape(-1, 2), q.view(np.uint8)],
                         axis=1)
    assert raw.shape[1] == 34
    return raw.tobytes(), (d[:, None] * q).reshape(np.shape(a))


# ----------------------------------------------------------------------------------------------
# File writers


def write_safetensors(path, entries):
    """entries: list of (name, dtype string, shape, raw bytes)."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dtype, shape, raw in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, _, _, raw in entries:
            f.write(raw)


_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
                10: "<Q", 11: "<q", 12: "<d"}


def _gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _gguf_value(vtype, v):
    if vtype in _GGUF_SCALAR:
        return struct.pack(_GGUF_SCALAR[vtype], v)
    if vtype == 8:
        return _gguf_str(v)
    if vtype == 9:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_gguf_value(etype, x)
                                                                for x in items)
    raise ValueError(vtype)


def write_gguf(path, kvs, tensors, alignment=32):
    """kvs: list of (key, value type id, value); tensors: list of (name, numpy shape,
    ggml type id, raw bytes). Adds general.alignment when it is not the default."""
    kvs = list(kvs)
    if alignment != 32:
        kvs.append(("general.alignment", 4, alignment))
    out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)))
    for key, vtype, v in kvs:
        out += _gguf_str(key) + struct.pack("<I", vtype) + _gguf_value(vtype, v)
    off = 0
    offsets = []
    for _, _, _, raw in tensors:
        offsets.append(off)
        off += len(raw)
        off += -off % alignment
    for (name, shape, gtype, _), o in zip(tensors, offsets):
        dims = list(reversed(shape))
        out += _gguf_str(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, o)
    out += b"\0" * (-len(out) % alignment)
    for _, _, _, raw in tensors:
        out += raw
        out += b"\0" * (-len(out) % alignment)
    with open(path, "wb") as f:
        f.write(out)


# ----------------------------------------------------------------------------------------------
# Tiny random models


def make_spec(**kw):
    spec = dict(arch="llama", V=96, D=64, L=2, H=4, KV=2, hd=None, F=96, eps=1e-5,
                theta=10000.0, tied=False, rope_scaling=None, window=None, qkv_bias=False)
    spec.update(kw)
    spec["head_dim"] = spec["hd"] or spec["D"] // spec["H"]
    return spec


def make_weights(rng, spec, kind="F32"):
    """HF-named master weights, rounded to be exact in `kind` (F32/F16/BF16)."""
    V, D, F, H, KV, hd = (spec[k] for k in ("V", "D", "F", "H", "KV", "head_dim"))

    def mat(rows, cols):
        return round_to(rng.standard_normal((rows, cols)) / math.sqrt(cols), kind)

    def norm(n):
        return round_to(1.0 + 0.2 * rng.standard_normal(n), kind)

    W = {"model.embed_tokens.weight": round_to(rng.standard_normal((V, D)), kind),
         "model.norm.weight": norm(D)}
    if not spec["tied"]:
        W["lm_head.weight"] = mat(V, D)
    for i in range(spec["L"]):
        p = f"model.layers.{i}."
        W[p + "input_layernorm.weight"] = norm(D)
        W[p + "post_attention_layernorm.weight"] = norm(D)
        W[p + "self_attn.q_proj.weight"] = mat(H * hd, D)
        W[p + "self_attn.k_proj.weight"] = mat(KV * hd, D)
        W[p + "self_attn.v_proj.weight"] = mat(KV * hd, D)
        W[p + "self_attn.o_proj.weight"] = mat(D, H * hd)
        if spec["qkv_bias"]:
            for n, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                W[f"{p}self_attn.{n}_proj.bias"] = round_to(
                    0.5 * rng.standard_normal(rows), kind)
        W[p + "mlp.gate_proj.weight"] = mat(F, D)
        W[p + "mlp.up_proj.weight"] = mat(F, D)
        W[p + "mlp.down_proj.weight"] = mat(D, F)
    return W


def q8_values(W):
    """What a Q8_0 file stores for each 2-D weight, as plain values (1-D tensors unchanged)."""
    return {n: (q8_0_quantize(a)[1] if a.ndim == 2 else a) for n, a in W.items()}


def write_hf(dirname, spec, W, dtype, shards=1, tie_key=True):
    os.makedirs(dirname, exist_ok=True)
    cfg = {"model_type": spec["arch"], "hidden_size": spec["D"],
           "intermediate_size": spec["F"], "num_hidden_layers": spec["L"],
           "num_attention_heads": spec["H"], "num_key_value_heads": spec["KV"],
           "vocab_size": spec["V"], "rms_norm_eps": spec["eps"], "rope_theta": spec["theta"],
           "max_position_embeddings": 4096, "hidden_act": "silu", "torch_dtype": "float32"}
    if tie_key:
        cfg["tie_word_embeddings"] = spec["tied"]
    if spec["hd"]:
        cfg["head_dim"] = spec["hd"]
    if spec["rope_scaling"]:
        cfg["rope_scaling"] = spec["rope_scaling"]
    if spec["arch"] == "mistral":
        cfg["sliding_window"] = spec["window"]
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    entries = [(n, dtype, a.shape, encode_plain(a, dtype)) for n, a in W.items()]
    if shards == 1:
        write_safetensors(os.path.join(dirname, "model.safetensors"), entries)
        return dirname
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = entries[s::shards]
        write_safetensors(os.path.join(dirname, fname), part)
        weight_map.update({e[0]: fname for e in part})
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return dirname


_HF_TO_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    stem, suffix = rest.rsplit(".", 1)
    return f"blk.{i}.{_HF_TO_GGUF[stem]}.{suffix}"


def permute_rows(w, n):
    """The GGUF-llama converter's q/k permutation, as given in the format notes."""
    m = w.reshape(-1, 1) if w.ndim == 1 else w
    d = m.shape[0] // n
    out = m.reshape(n, 2, d // 2, m.shape[1]).swapaxes(1, 2).reshape(n * d, m.shape[1])
    return out.reshape(w.shape)


def write_gguf_model(path, spec, W, arch, kind, alignment=32, rope_freqs=None,
                     rope_freqs_kind="F32", extra_kvs=(), shuffle_rng=None):
    """Same weights as GGUF `arch`: 2-D tensors in `kind`, 1-D tensors F32 (as llama.cpp does).
    W holds the unquantized masters; Q8_0 is applied here after the q/k permutation, which is
    row-wise so it lands on the same blocks as quantizing before it."""
    H, KV, hd = spec["H"], spec["KV"], spec["head_dim"]
    W = dict(W)
    if arch == "qwen2":  # qwen2 always carries q/k/v biases; zero ones leave the maths unchanged
        for i in range(spec["L"]):
            for n, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                W.setdefault(f"model.layers.{i}.self_attn.{n}_proj.bias", np.zeros(rows))
    tensors = []
    for hf, a in W.items():
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            a = permute_rows(a, H if ".q_proj." in hf else KV)
        if a.ndim == 2 and kind == "Q8_0":
            raw = q8_0_quantize(a)[0]
            gtype = GGML_TYPE["Q8_0"]
        else:
            k = kind if a.ndim == 2 else "F32"
            raw, gtype = encode_plain(a, k), GGML_TYPE[k]
        tensors.append((gguf_name(hf), a.shape, gtype, raw))
    if rope_freqs is not None:
        tensors.append(("rope_freqs.weight", rope_freqs.shape, GGML_TYPE[rope_freqs_kind],
                        encode_plain(rope_freqs, rope_freqs_kind)))
    if shuffle_rng is not None:
        tensors = [tensors[i] for i in shuffle_rng.permutation(len(tensors))]
    a = arch
    V = spec["V"]
    kvs = [("general.architecture", 8, arch), ("general.name", 8, "selftest"),
           (f"{a}.context_length", 4, 4096), (f"{a}.embedding_length", 4, spec["D"]),
           (f"{a}.block_count", 4, spec["L"]), (f"{a}.feed_forward_length", 4, spec["F"]),
           (f"{a}.attention.head_count", 4, H), (f"{a}.attention.head_count_kv", 4, KV),
           (f"{a}.rope.freq_base", 6, spec["theta"]), (f"{a}.rope.dimension_count", 4, hd),
           (f"{a}.attention.layer_norm_rms_epsilon", 6, spec["eps"]),
           ("tokenizer.ggml.model", 8, "llama"),
           ("tokenizer.ggml.tokens", 9, (8, [f"tok{i}\u2581" for i in range(V)])),
           ("tokenizer.ggml.scores", 9, (6, [-float(i) for i in range(V)])),
           ("tokenizer.ggml.token_type", 9, (5, [1] * V))]
    if spec["hd"]:
        kvs += [(f"{a}.attention.key_length", 4, hd), (f"{a}.attention.value_length", 4, hd)]
    write_gguf(path, kvs + list(extra_kvs), tensors, alignment)
    return path


# ----------------------------------------------------------------------------------------------
# Naive loop-per-token forward (ground truth for the vectorized model)


def selftest_llama3_divisors(spec):
    """Per-frequency divisors of HF llama3 scaling, computed one frequency at a time."""
    rs, hd = spec["rope_scaling"], spec["head_dim"]
    L = rs["original_max_position_embeddings"]
    out = []
    for i in range(hd // 2):
        f = spec["theta"] ** (-2.0 * i / hd)
        w = 2 * math.pi / f
        if w < L / rs["high_freq_factor"]:
            f2 = f
        elif w > L / rs["low_freq_factor"]:
            f2 = f / rs["factor"]
        else:
            s = (L / w - rs["low_freq_factor"]) / (rs["high_freq_factor"] - rs["low_freq_factor"])
            f2 = (1 - s) * f / rs["factor"] + s * f
        out.append(f / f2)
    return np.array(out)


def naive_logits(spec, W, ids, window="spec"):
    D, H, KV, hd, eps = spec["D"], spec["H"], spec["KV"], spec["head_dim"], spec["eps"]
    if window == "spec":
        window = spec["window"]
    inv = [spec["theta"] ** (-2.0 * i / hd) for i in range(hd // 2)]
    if spec["rope_scaling"]:
        inv = [f / dv for f, dv in zip(inv, selftest_llama3_divisors(spec))]

    def norm(v, w):
        return v / math.sqrt(float(np.dot(v, v)) / len(v) + eps) * w

    def rope(vec, pos):
        out = vec.copy()
        half = hd // 2
        for i in range(half):
            c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    def get(name, n):
        return W[name] if name in W else np.zeros(n)

    T = len(ids)
    x = [W["model.embed_tokens.weight"][t].copy() for t in ids]
    for layer in range(spec["L"]):
        p = f"model.layers.{layer}."
        wq, wk, wv, wo = (W[f"{p}self_attn.{n}_proj.weight"] for n in "qkvo")
        bq, bk, bv = (get(f"{p}self_attn.{n}_proj.bias", r)
                      for n, r in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)))
        qs, ks, vs = [], [], []
        for t in range(T):
            h = norm(x[t], W[p + "input_layernorm.weight"])
            q, k, v = wq @ h + bq, wk @ h + bk, wv @ h + bv
            qs.append([rope(q[j * hd:(j + 1) * hd], t) for j in range(H)])
            ks.append([rope(k[j * hd:(j + 1) * hd], t) for j in range(KV)])
            vs.append([v[j * hd:(j + 1) * hd] for j in range(KV)])
        new_x = []
        for t in range(T):
            heads = []
            for j in range(H):
                g = j // (H // KV)
                keys = [s for s in range(t + 1) if window is None or s > t - window]
                sc = [float(np.dot(qs[t][j], ks[s][g])) / math.sqrt(hd) for s in keys]
                m = max(sc)
                e = [math.exp(z - m) for z in sc]
                tot = sum(e)
                heads.append(sum((ei / tot) * vs[s][g] for ei, s in zip(e, keys)))
            new_x.append(x[t] + wo @ np.concatenate(heads))
        x = new_x
        for t in range(T):
            h = norm(x[t], W[p + "post_attention_layernorm.weight"])
            gt = W[p + "mlp.gate_proj.weight"] @ h
            up = W[p + "mlp.up_proj.weight"] @ h
            x[t] = x[t] + W[p + "mlp.down_proj.weight"] @ (gt / (1 + np.exp(-gt)) * up)
    lm = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return np.array([lm @ norm(x[t], W["model.norm.weight"]) for t in range(T)])


# ----------------------------------------------------------------------------------------------
# Checks


PROMPT = [3, 17, 42, 5, 60]
SEQ = PROMPT + [11, 0, 95, 23, 7, 64]   # fixed continuation for all-position comparisons
N_GEN = 6


def compare_formats(title, spec, truth_W, paths, tol=TOL):
    """Every path must reproduce the naive forward on truth_W, and greedy decoding must agree."""
    truth = naive_logits(spec, truth_W, SEQ)
    gen0 = None
    for label, path, *opt in paths:
        t = opt[0] if opt else tol
        m = llama_ref.load_model(path)
        err = rel_err(m.logits(SEQ), truth)
        check(err <= t, f"{title}: {label} logits vs naive", f"rel={err:.2e} (tol {t:g})")
        ids, rows = m.generate(PROMPT, N_GEN)
        if gen0 is None:
            gen0 = (label, ids, rows)
            continue
        same = ids == gen0[1]
        err = rel_err(rows, gen0[2])
        check(same and err <= t, f"{title}: {label} greedy == {gen0[0]}",
              f"ids={ids} rel={err:.2e}")


def run_cli(*args):
    p = subprocess.run([sys.executable, os.path.join(HERE, "llama_ref.py"), *args],
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def selftest_moe_routing():
    """moe_ref's routing against hand-computed cases and the Mixtral definition."""
    import moe_ref
    e, w = moe_ref.route(np.array([[1.0, 3.0, 2.0, 3.0]]), 2, True)
    check(e.tolist() == [[1, 3]] and np.allclose(w, 0.5), "moe top-k ties go to the lower id",
          f"experts={e.tolist()} weights={w.tolist()}")
    rng = np.random.default_rng(3)
    z = rng.normal(size=(5, 8))
    e, w = moe_ref.route(z, 3, True)
    top = np.sort(z, axis=-1)[:, ::-1][:, :3]
    want = np.exp(top - top.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    check(np.allclose(w, want, rtol=1e-12), "moe mixtral weights = softmax over the top-k logits")
    e, w = moe_ref.route(z, 3, False)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    check(np.allclose(w, np.take_along_axis(p, e, -1)) and w.sum(-1).max() < 1,
          "moe qwen2moe weights without norm_topk_prob are the softmax probabilities")
    D, F = 4, 6
    wg, wu, wd = rng.normal(size=(F, D)), rng.normal(size=(F, D)), rng.normal(size=(D, F))
    h = rng.normal(size=(3, D))
    moe = {"kind": "mixtral", "k": 1, "norm_topk_prob": True, "router": np.zeros((1, D)),
           "experts": [(wg, wu, wd)], "shared": None}
    dense = (h @ wg.T / (1 + np.exp(-(h @ wg.T))) * (h @ wu.T)) @ wd.T
    check(np.allclose(moe_ref.moe_ffn(h, moe), dense, rtol=1e-12),
          "moe with one expert and k = 1 is the dense MLP")


def main():
    t0 = time.time()
    rng = np.random.default_rng(1234)
    tmp = tempfile.mkdtemp(prefix="llama_ref_selftest_")
    P = lambda *a: os.path.join(tmp, *a)  # noqa: E731

    # A. llama, GQA 4/2, F32; HF sharded; GGUF llama (permuted) and qwen2 (plain, zero biases).
    sA = make_spec()
    WA = make_weights(rng, sA, "F32")
    hfA = write_hf(P("A_hf"), sA, WA, "F32", shards=2)
    meta_kvs = [("test.u8", 0, 250), ("test.i8", 1, -5), ("test.u16", 2, 65000),
                ("test.i16", 3, -300), ("test.u32", 4, 4000000000), ("test.i32", 5, -7),
                ("test.f32", 6, 0.5), ("test.bool", 7, 1), ("test.str", 8, "h\u00e9llo"),
                ("test.u64", 10, 2**63 + 5), ("test.i64", 11, -2**40), ("test.f64", 12, 0.1),
                ("test.nested", 9, (9, [(4, [1, 2]), (8, ["a", "bc"])])),
                ("test.bools", 9, (7, [1, 0, 1])), ("test.empty", 9, (12, []))]
    ggA = write_gguf_model(P("A_llama_f32.gguf"), sA, WA, "llama", "F32", extra_kvs=meta_kvs,
                           shuffle_rng=rng)
    gqA = write_gguf_model(P("A_qwen2_f32.gguf"), sA, WA, "qwen2", "F32")
    compare_formats("A llama F32 GQA", sA, WA,
                    [("hf sharded", hfA), ("gguf llama", ggA), ("gguf qwen2", gqA)])

    md = GGUFFile(ggA).metadata
    want = {"test.u8": 250, "test.i8": -5, "test.u16": 65000, "test.i16": -300,
            "test.u32": 4000000000, "test.i32": -7, "test.f32": 0.5, "test.bool": True,
            "test.str": "h\u00e9llo", "test.u64": 2**63 + 5, "test.i64": -2**40,
            "test.f64": 0.1, "test.nested": [[1, 2], ["a", "bc"]],
            "test.bools": [True, False, True],
            "test.empty": [], "llama.rope.freq_base": 10000.0,
            "tokenizer.ggml.tokens": [f"tok{i}\u2581" for i in range(sA["V"])]}
    bad = [k for k, v in want.items() if md.get(k) != v]
    check(not bad, "gguf metadata: every value type round-trips", f"mismatched={bad}")

    # B. F16 everywhere (GGUF norms as F32 of the same values), GGUF alignment 64.
    WB = make_weights(rng, sA, "F16")
    ggB = write_gguf_model(P("B_llama_f16.gguf"), sA, WB, "llama", "F16", alignment=64)
    check(GGUFFile(ggB).alignment == 64, "gguf general.alignment=64 honoured")
    compare_formats("B F16", sA, WB,
                    [("hf F16", write_hf(P("B_hf"), sA, WB, "F16")), ("gguf llama F16", ggB),
                     ("gguf qwen2 F16", write_gguf_model(P("B_qwen2.gguf"), sA, WB, "qwen2",
                                                         "F16"))])

    # C. BF16.
    WC = make_weights(rng, sA, "BF16")
    compare_formats("C BF16", sA, WC,
                    [("hf BF16", write_hf(P("C_hf"), sA, WC, "BF16")),
                     ("gguf llama BF16", write_gguf_model(P("C_llama.gguf"), sA, WC, "llama",
                                                          "BF16"))])

    # D. Q8_0: the HF side holds the dequantized values as F32 (d*q is exact in float32).
    WD = make_weights(rng, sA, "F32")
    WDq = q8_values(WD)
    compare_formats("D Q8_0", sA, WDq,
                    [("hf F32 of dequantized", write_hf(P("D_hf"), sA, WDq, "F32")),
                     ("gguf llama Q8_0", write_gguf_model(P("D_llama.gguf"), sA, WD, "llama",
                                                          "Q8_0")),
                     ("gguf qwen2 Q8_0", write_gguf_model(P("D_qwen2.gguf"), sA, WD, "qwen2",
                                                          "Q8_0"))])

    # E. qwen2 with q/k/v biases, MQA (1 kv head), head_dim 32 != hidden/heads; the GGUF
    #    llama-arch copy permutes the biases too.
    sE = make_spec(arch="qwen2", KV=1, hd=32, qkv_bias=True, theta=1000000.0, eps=1e-6)
    WE = make_weights(rng, sE, "F32")
    compare_formats("E qwen2 bias hd32 MQA", sE, WE,
                    [("hf qwen2", write_hf(P("E_hf"), sE, WE, "F32")),
                     ("gguf qwen2", write_gguf_model(P("E_qwen2.gguf"), sE, WE, "qwen2", "F32")),
                     ("gguf llama (permuted bias)",
                      write_gguf_model(P("E_llama.gguf"), sE, WE, "llama", "F32"))])

    # F. Tied embeddings: flag set / flag absent but no lm_head / GGUF without output.weight.
    sF = make_spec(tied=True, KV=4)
    WF = make_weights(rng, sF, "F32")
    compare_formats("F tied", sF, WF,
                    [("hf tie_word_embeddings", write_hf(P("F_hf"), sF, WF, "F32")),
                     ("hf no lm_head, no flag", write_hf(P("F_hf2"), sF, WF, "F32",
                                                         tie_key=False)),
                     ("gguf llama no output", write_gguf_model(P("F.gguf"), sF, WF, "llama",
                                                               "F32"))])

    # G. llama3 rope scaling: frequencies fall in all three bands (kept, blended, divided).
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    sG = make_spec(theta=500000.0, rope_scaling=rs)
    WG = make_weights(rng, sG, "F32")
    div = selftest_llama3_divisors(sG)
    bands = (int(np.sum(div == 1.0)), int(np.sum((div > 1) & (div < 8))), int(np.sum(div == 8.0)))
    check(all(bands), "G llama3 divisors hit all bands", f"kept/blended/divided={bands}")
    ref_inv = llama_ref.llama3_scale_inv_freq(llama_ref.base_inv_freq(500000.0, 16), 8.0, 1.0,
                                              4.0, 8192)
    base = np.array([500000.0 ** (-2.0 * i / 16) for i in range(8)])
    err = rel_err(ref_inv, base / div)
    check(err < 1e-14, "G llama_ref llama3 inv_freq == selftest's", f"rel={err:.1e}")
    # rope_freqs stored as F64 is exact; F32 (what real files use) rounds the divisors, so that
    # case gets a tolerance sized for float32 rounding of the angles.
    compare_formats("G llama3 rope", sG, WG,
                    [("hf rope_scaling", write_hf(P("G_hf"), sG, WG, "F32")),
                     ("gguf rope_freqs F64",
                      write_gguf_model(P("G64.gguf"), sG, WG, "llama", "F32", rope_freqs=div,
                                       rope_freqs_kind="F64")),
                     ("gguf rope_freqs F32",
                      write_gguf_model(P("G32.gguf"), sG, WG, "llama", "F32",
                                       rope_freqs=round_to(div, "F32")), 1e-6)])

    # H. mistral sliding window 3 (prompt and sequence are longer than the window).
    sH = make_spec(arch="mistral", window=3)
    WH = make_weights(rng, sH, "F32")
    compare_formats("H mistral window=3", sH, WH, [("hf mistral", write_hf(P("H_hf"), sH, WH,
                                                                          "F32"))])
    diff = rel_err(naive_logits(sH, WH, SEQ), naive_logits(sH, WH, SEQ, window=None))
    check(diff > 1e-3, "H window actually changes logits", f"rel={diff:.2e}")

    # I. Q8_0 activations in int8 (--q8-activations, ppserve's CPU engine): the rule at its
    #    edges, matmul() applies it to Q8_0 weights only, and a model's logits move a little.
    blk = np.array([-127.0] + [i - 16 + 0.5 for i in range(1, 32)])
    qv = gguf_reader.q8_act(np.stack([blk, np.zeros(32), np.full(32, 1e-40),
                                      np.where(np.arange(32) == 5, np.inf, 1.0)]))
    ok = (qv[0, 0] == -127 and list(qv[0, 13:19]) == [-2, -2, 0, 0, 2, 2] and qv[0, 31] == 16
          and not qv[1].any() and not qv[2].any() and np.isnan(qv[3]).all())
    check(ok, "I q8_act: ties to even, zero and denormal blocks, inf gives NaN", f"{qv[0, 13:19]}")
    wq8 = (rng.standard_normal((5, 64)) * 0.1).view(gguf_reader.Q8Values)
    xa = rng.standard_normal((3, 64))
    ok = (np.array_equal(gguf_reader.matmul(xa, wq8), gguf_reader.q8_act(xa) @ np.asarray(wq8).T)
          and not np.array_equal(gguf_reader.q8_act(xa), xa)
          and np.array_equal(gguf_reader.matmul(xa, np.asarray(wq8)), xa @ np.asarray(wq8).T))
    check(ok, "I matmul quantizes activations for Q8_0 weights only")
    plain = llama_ref.load_model(P("D_llama.gguf")).logits(SEQ)
    q8 = llama_ref.load_model(P("D_llama.gguf"), q8_activations=True).logits(SEQ)
    diff = rel_err(q8, plain)
    check(1e-6 < diff < 5e-2, "I Q8_0 model with int8 activations: close, not identical",
          f"rel={diff:.2e}")

    # CLI contract.
    m = llama_ref.load_model(ggA)
    ids, rows = m.generate(PROMPT, N_GEN)
    pid = ",".join(map(str, PROMPT))
    dump = P("logits.bin")
    rc, out, err_ = run_cli("--model", ggA, "--prompt-ids", pid, "--max-tokens", str(N_GEN),
                            "--json", "--dump-logits", dump)
    ok = rc == 0 and out == json.dumps({"ids": ids}, separators=(",", ":")) + "\n"
    check(ok, "cli --json prints one {\"ids\":[...]} line", f"rc={rc} out={out.strip()}")
    got = np.fromfile(dump, dtype="<f4")
    ok = got.size == N_GEN * m.vocab_size and np.array_equal(
        got, np.asarray(rows, "<f4").reshape(-1))
    check(ok, "cli --dump-logits = N rows of float32 vocab logits",
          f"{os.path.getsize(dump)} bytes")

    force = [(t + 1) % sA["V"] for t in ids]   # never the argmax
    fids, frows = m.generate(PROMPT, N_GEN, force)
    rc, out, _ = run_cli("--model", hfA, "--prompt-ids", pid, "--max-tokens", str(N_GEN),
                         "--force-ids", ",".join(map(str, force)), "--dump-logits", dump)
    got = np.fromfile(dump, dtype="<f4").reshape(N_GEN, -1)
    ok = (rc == 0 and out.strip() == ",".join(map(str, fids))
          and rel_err(got, np.asarray(frows, np.float32)) < 1e-6 and fids != ids)
    check(ok, "cli --force-ids: rows follow forced ids, printed ids are argmaxes",
          f"rc={rc} out={out.strip()}")

    selftest_moe_routing()

    # Error exits (status 2, clear message).
    os.makedirs(P("bad_arch"))
    with open(P("bad_arch", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2"}, f)
    WM = {k: v for k, v in WA.items() if k != "model.norm.weight"}
    bad_dtype_entries = [(n, "F32", a.shape, encode_plain(a, "F32")) for n, a in WA.items()
                         if n != "model.norm.weight"]
    bad_dtype_entries.append(("model.norm.weight", "I8", (sA["D"],), bytes(sA["D"])))
    os.makedirs(P("bad_dtype_hf"))
    shutil.copy(os.path.join(hfA, "config.json"), P("bad_dtype_hf", "config.json"))
    write_safetensors(P("bad_dtype_hf", "model.safetensors"), bad_dtype_entries)
    write_gguf(P("bad_arch.gguf"), [("general.architecture", 8, "gpt2")], [])
    good = GGUFFile(ggA)
    q4_tensors = []
    for name, info in good.tensors.items():
        if name == "output_norm.weight":
            q4_tensors.append((name, info.shape, GGML_TYPE["Q4_0"], bytes(18 * sA["D"] // 32)))
        else:
            q4_tensors.append((name, info.shape, GGML_TYPE["F32"],
                               encode_plain(good.get(name), "F32")))
    write_gguf(P("bad_dtype.gguf"), [(k, good.metadata_types[k], v) for k, v in
                                     good.metadata.items()
                                     if k.startswith(("general.", "llama."))], q4_tensors)
    cases = [("hf unsupported arch", P("bad_arch"), "unsupported architecture"),
             ("hf missing tensor", write_hf(P("bad_missing"), sA, WM, "F32"), "missing tensor"),
             ("hf unknown dtype", P("bad_dtype_hf"), "unsupported dtype"),
             ("gguf unsupported arch", P("bad_arch.gguf"), "unsupported architecture"),
             ("gguf unknown dtype", P("bad_dtype.gguf"), "unsupported dtype")]
    for label, path, needle in cases:
        rc, out, err_ = run_cli("--model", path, "--prompt-ids", "1,2", "--max-tokens", "2")
        check(rc == 2 and needle in err_, f"cli error exit 2: {label}", err_.strip())

    print(f"selftest: {N_CHECKS[0] - len(FAILS)}/{N_CHECKS[0]} checks passed "
          f"in {time.time() - t0:.1f}s")
    if FAILS:
        print(f"selftest: FAILED; test files kept in {tmp}")
        return 1
    shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
