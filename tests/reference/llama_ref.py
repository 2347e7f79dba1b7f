#!/usr/bin/env python3
"""Float64 numpy reference for the Hugging Face forward pass of Llama-family decoders, dense and
Mixture-of-Experts (Mixtral, Qwen2-MoE; the MoE FFN lives in moe_ref.py).

ppserve's outputs are checked against this. It is deliberately independent of the C engine
(own file readers, written from the specs and the HF math) and deliberately simple: the whole
sequence is recomputed every step with no KV cache, and everything is float64, so that when the
two disagree the suspect is the engine, not the reference.

Supported: HF model_type llama / mistral / qwen2 / mixtral / qwen2_moe (config.json +
safetensors), GGUF general.architecture llama (with expert_count: Mixtral) / qwen2 / qwen2moe.
GGUF `llama` stores q/k rows permuted for the adjacent-pair RoPE layout; we undo that and always
apply HF's rotate-half RoPE, which checks the engine's handling of both layouts against one ground
truth.

CLI:
  llama_ref.py --model PATH --prompt-ids 1,2,3 --max-tokens N
               [--force-ids 7,8,9] [--dump-logits FILE] [--json]
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_reader import GGUFError, GGUFFile, matmul  # noqa: E402
from safetensors_reader import SafetensorsError, SafetensorsModel  # noqa: E402
import moe_ref  # noqa: E402


class ModelError(Exception):
    """Unsupported architecture/feature or an inconsistent checkpoint."""


# ----------------------------------------------------------------------------------------------
# RoPE frequencies


def base_inv_freq(theta, head_dim):
    """inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2 (HF default RoPE)."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    return theta ** (-2.0 * i / head_dim)


def llama3_scale_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_max_pos):
    """HF `rope_type: llama3`: keep high frequencies, divide low ones by `factor`, and blend
    linearly in wavelength-space between the two cut-offs."""
    L = float(original_max_pos)
    wavelen = 2.0 * math.pi / inv_freq
    low_freq_wavelen = L / low_freq_factor     # longer than this: fully scaled
    high_freq_wavelen = L / high_freq_factor   # shorter than this: untouched
    out = inv_freq.copy()
    long_ = wavelen > low_freq_wavelen
    out[long_] = inv_freq[long_] / factor
    mid = ~(wavelen < high_freq_wavelen) & ~long_
    s = (L / wavelen[mid] - low_freq_factor) / (high_freq_factor - low_freq_factor)
    out[mid] = (1.0 - s) * inv_freq[mid] / factor + s * inv_freq[mid]
    return out


def unpermute_rows(w, n_heads):
    """Invert the GGUF-llama converter's q/k row permutation
    w_gguf = w_hf.reshape(n, 2, d/2, cols).swapaxes(1, 2).reshape(n*d, cols).
    A 1-D bias is treated as a one-column matrix."""
    vec = w.ndim == 1
    m = w.reshape(-1, 1) if vec else w
    rows, cols = m.shape
    if rows % n_heads or (rows // n_heads) % 2:
        raise ModelError(f"cannot un-permute {rows} rows into {n_heads} heads of even size")
    d = rows // n_heads
    out = m.reshape(n_heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
    return out.reshape(-1) if vec else out


# ----------------------------------------------------------------------------------------------
# Model


class Config:
    def __init__(self, *, arch, dim, n_layers, n_heads, n_kv_heads, head_dim, eps, inv_freq,
                 sliding_window=None):
        self.arch = arch
        self.dim = dim
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.eps = eps
        self.inv_freq = inv_freq
        self.sliding_window = sliding_window
        if n_heads <= 0 or n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise ModelError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
        if head_dim <= 0 or head_dim % 2:
            raise ModelError(f"head_dim={head_dim} must be positive and even")
        if len(inv_freq) != head_dim // 2:
            raise ModelError(f"{len(inv_freq)} RoPE frequencies for head_dim={head_dim}")


# Per-layer tensor roles; a `None` bias means the checkpoint has none.
LAYER_ROLES = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "wg", "wu", "wd",
               "bq", "bk", "bv", "bo", "bg", "bu", "bd")


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    # sigmoid via tanh: no overflow warnings for large |x|.
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def linear(x, w, b=None):
    y = matmul(x, w)
    return y if b is None else y + b


def apply_rope(x, cos, sin):
    """HF rotate-half: element i pairs with i + d/2. x: (T, heads, d); cos/sin: (T, d/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


class LlamaRef:
    def __init__(self, cfg, embed, final_norm, lm_head, layers):
        self.cfg = cfg
        self.embed = embed
        self.final_norm = final_norm
        self.lm_head = lm_head
        self.layers = layers
        self.vocab_size = lm_head.shape[0]
        self._check_shapes()

    def _check_shapes(self):
        c = self.cfg
        D, H, KV, hd = c.dim, c.n_heads, c.n_kv_heads, c.head_dim

        def expect(what, arr, shape):
            if arr is not None and tuple(arr.shape) != tuple(shape):
                raise ModelError(f"{what} has shape {tuple(arr.shape)}, expected {tuple(shape)}")

        expect("embedding", self.embed, (self.embed.shape[0], D))
        expect("lm head", self.lm_head, (self.vocab_size, D))
        expect("final norm", self.final_norm, (D,))
        for i, L in enumerate(self.layers):
            if L.get("moe") is not None:
                moe_ref.check_shapes(i, L["moe"], D)
            F = L["wg"].shape[0] if L.get("wg") is not None else 0
            for role, shape in (("attn_norm", (D,)), ("ffn_norm", (D,)),
                                ("wq", (H * hd, D)), ("wk", (KV * hd, D)), ("wv", (KV * hd, D)),
                                ("wo", (D, H * hd)), ("wg", (F, D)), ("wu", (F, D)),
                                ("wd", (D, F)), ("bq", (H * hd,)), ("bk", (KV * hd,)),
                                ("bv", (KV * hd,)), ("bo", (D,)), ("bg", (F,)), ("bu", (F,)),
                                ("bd", (D,))):
                expect(f"layer {i} {role}", L[role], shape)

    def hidden_states(self, ids, routing=None):
        """Final-normed hidden states (T, dim) for the token ids at positions 0..T-1. With a list
        as routing, appends (layer, tokens routed to each expert) for every MoE layer."""
        c = self.cfg
        T = len(ids)
        H, KV, hd = c.n_heads, c.n_kv_heads, c.head_dim
        x = self.embed[np.asarray(ids, dtype=np.int64)]

        ang = np.arange(T, dtype=np.float64)[:, None] * c.inv_freq[None, :]
        cos, sin = np.cos(ang), np.sin(ang)

        qpos = np.arange(T)[:, None]
        kpos = np.arange(T)[None, :]
        allowed = kpos <= qpos
        if c.sliding_window is not None:
            allowed &= kpos > qpos - c.sliding_window
        bias = np.where(allowed, 0.0, -np.inf)  # (T, T), broadcast over heads
        scale = 1.0 / math.sqrt(hd)
        group = H // KV

        for li, L in enumerate(self.layers):
            h = rmsnorm(x, L["attn_norm"], c.eps)
            q = linear(h, L["wq"], L["bq"]).reshape(T, H, hd)
            k = linear(h, L["wk"], L["bk"]).reshape(T, KV, hd)
            v = linear(h, L["wv"], L["bv"]).reshape(T, KV, hd)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            # GQA: query head j reads kv head j // group; repeat puts kv head g at j = g*group..
            k = np.repeat(k, group, axis=1)
            v = np.repeat(v, group, axis=1)
            qh, kh, vh = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)
            scores = (qh @ kh.transpose(0, 2, 1)) * scale + bias      # (H, T, T)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            attn = (p @ vh).transpose(1, 0, 2).reshape(T, H * hd)
            x = x + linear(attn, L["wo"], L["bo"])

            h = rmsnorm(x, L["ffn_norm"], c.eps)
            if L.get("moe") is not None:
                if routing is not None:
                    routing.append((li, moe_ref.routed_counts(h, L["moe"])))
                x = x + moe_ref.moe_ffn(h, L["moe"])
                continue
            gate = linear(h, L["wg"], L["bg"])
            up = linear(h, L["wu"], L["bu"])
            x = x + linear(silu(gate) * up, L["wd"], L["bd"])

        return rmsnorm(x, self.final_norm, c.eps)

    def logits(self, ids):
        """Logits (T, vocab) at every position."""
        return matmul(self.hidden_states(ids), self.lm_head)

    def last_logits(self, ids):
        return matmul(self.hidden_states(ids)[-1], self.lm_head)

    def generate(self, prompt_ids, max_tokens, force_ids=None):
        """Greedy decode. Returns (argmax ids, logits rows). With force_ids, step i appends
        force_ids[i] instead of its argmax so the rows line up with another engine's tokens."""
        seq = list(prompt_ids)
        picked, rows = [], []
        for i in range(max_tokens):
            row = self.last_logits(seq)
            best = int(np.argmax(row))  # first maximum = lowest id on ties
            picked.append(best)
            rows.append(row)
            seq.append(force_ids[i] if force_ids is not None else best)
        return picked, rows


# ----------------------------------------------------------------------------------------------
# Loading


class _Source:
    """Uniform 'get tensor or complain' over a reader; None for absent optional tensors."""

    def __init__(self, reader):
        self.reader = reader

    def req(self, name):
        if not self.reader.has(name):
            raise ModelError(f"missing tensor {name!r} in {self.reader.path}")
        return self.reader.get(name)

    def opt(self, name):
        return self.reader.get(name) if self.reader.has(name) else None


def load_hf(path):
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelError(f"{path}: no config.json")
    with open(cfg_path) as f:
        hc = json.load(f)

    model_type = hc.get("model_type")
    if model_type not in ("llama", "mistral", "qwen2", "mixtral", "qwen2_moe"):
        raise ModelError(f"unsupported architecture: HF model_type {model_type!r} "
                         f"(supported: llama, mistral, qwen2, mixtral, qwen2_moe)")
    act = hc.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"unsupported hidden_act {act!r} (only silu)")

    def key(k):
        if hc.get(k) is None:
            raise ModelError(f"{cfg_path}: missing key {k!r}")
        return hc[k]

    dim = int(key("hidden_size"))
    n_heads = int(key("num_attention_heads"))
    n_kv = int(hc.get("num_key_value_heads") or n_heads)
    head_dim = int(hc.get("head_dim") or dim // n_heads)
    n_layers = int(key("num_hidden_layers"))
    eps = float(hc.get("rms_norm_eps", 1e-6))
    theta = float(hc.get("rope_theta", 10000.0))

    inv_freq = base_inv_freq(theta, head_dim)
    rs = hc.get("rope_scaling")
    if rs:
        rtype = rs.get("rope_type", rs.get("type"))
        if rtype == "llama3":
            need = ("factor", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
            absent = [k for k in need if rs.get(k) is None]
            if absent:
                raise ModelError(f"{cfg_path}: llama3 rope_scaling lacks {', '.join(absent)}")
            inv_freq = llama3_scale_inv_freq(inv_freq, *(float(rs[k]) for k in need))
        elif rtype != "default":
            raise ModelError(f"unsupported rope_scaling type {rtype!r} (only llama3)")

    window = None
    if model_type in ("mistral", "mixtral") and hc.get("sliding_window") is not None:
        window = int(hc["sliding_window"])
    if model_type in ("qwen2", "qwen2_moe") and hc.get("use_sliding_window"):
        raise ModelError(f"{model_type} use_sliding_window=true is not supported")
    moe = moe_ref.hf_moe_config(hc, model_type, cfg_path, key)

    cfg = Config(arch=model_type, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                 head_dim=head_dim, eps=eps, inv_freq=inv_freq, sliding_window=window)

    src = _Source(SafetensorsModel(path))
    embed = src.req("model.embed_tokens.weight")
    final_norm = src.req("model.norm.weight")
    if hc.get("tie_word_embeddings", False) or not src.reader.has("lm_head.weight"):
        lm_head = embed
    else:
        lm_head = src.req("lm_head.weight")

    layers = []
    for i in range(n_layers):
        p = f"model.layers.{i}."
        L = {
            "attn_norm": src.req(p + "input_layernorm.weight"),
            "ffn_norm": src.req(p + "post_attention_layernorm.weight"),
        }
        for role, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
            L["w" + role] = src.req(f"{p}self_attn.{name}.weight")
            if model_type in ("qwen2", "qwen2_moe") and role != "o":
                L["b" + role] = src.req(f"{p}self_attn.{name}.bias")
            else:
                L["b" + role] = src.opt(f"{p}self_attn.{name}.bias")
        for role, name in (("g", "gate_proj"), ("u", "up_proj"), ("d", "down_proj")):
            if moe is not None:
                L["w" + role] = L["b" + role] = None
                continue
            L["w" + role] = src.req(f"{p}mlp.{name}.weight")
            L["b" + role] = src.opt(f"{p}mlp.{name}.bias")
        L["moe"] = moe_ref.hf_moe_layer(src, i, moe) if moe is not None else None
        layers.append(L)
    return LlamaRef(cfg, embed, final_norm, lm_head, layers)


def load_gguf(path, q8_activations=False):
    g = GGUFFile(path, q8_activations)
    md = g.metadata
    arch = md.get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen2moe"):
        raise ModelError(f"unsupported architecture: GGUF general.architecture {arch!r} "
                         f"(supported: llama, qwen2, qwen2moe)")

    missing = object()

    def key(k, default=missing):
        v = md.get(f"{arch}.{k}", default)
        if v is missing:
            raise ModelError(f"{path}: missing metadata key {arch}.{k!s}")
        return v

    def uniform(k, v):
        # Some converters store per-layer arrays; a dense uniform model has one value.
        if isinstance(v, list):
            if not v or any(x != v[0] for x in v):
                raise ModelError(f"{path}: per-layer {arch}.{k} {v} is not supported")
            return v[0]
        return v

    dim = int(key("embedding_length"))
    n_layers = int(key("block_count"))
    n_heads = int(uniform("attention.head_count", key("attention.head_count")))
    n_kv = int(uniform("attention.head_count_kv", key("attention.head_count_kv", n_heads)))
    head_dim = int(key("attention.key_length", dim // n_heads))
    vlen = key("attention.value_length", head_dim)
    if int(vlen) != head_dim:
        raise ModelError(f"{path}: value_length {vlen} != key_length {head_dim} not supported")
    eps = float(key("attention.layer_norm_rms_epsilon"))
    theta = float(key("rope.freq_base", 10000.0))
    rope_dims = key("rope.dimension_count", head_dim)
    if int(rope_dims) != head_dim:
        raise ModelError(f"{path}: partial RoPE (dimension_count {rope_dims} != head_dim "
                         f"{head_dim}) is not supported")
    scaling = key("rope.scaling.type", "none")
    if scaling != "none":
        raise ModelError(f"{path}: unsupported {arch}.rope.scaling.type {scaling!r}")

    inv_freq = base_inv_freq(theta, head_dim)
    if g.has("rope_freqs.weight"):
        divisors = g.get("rope_freqs.weight").reshape(-1)
        if divisors.shape[0] != head_dim // 2:
            raise ModelError(f"{path}: rope_freqs.weight has {divisors.shape[0]} entries, "
                             f"expected {head_dim // 2}")
        inv_freq = inv_freq / divisors

    cfg = Config(arch=arch, dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
                 head_dim=head_dim, eps=eps, inv_freq=inv_freq)

    src = _Source(g)
    embed = src.req("token_embd.weight")
    final_norm = src.req("output_norm.weight")
    lm_head = src.opt("output.weight")
    if lm_head is None:
        lm_head = embed

    permuted = arch == "llama"
    moe = moe_ref.gguf_moe_config(key, arch)
    layers = []
    for i in range(n_layers):
        p = f"blk.{i}."
        L = {"attn_norm": src.req(p + "attn_norm.weight"),
             "ffn_norm": src.req(p + "ffn_norm.weight")}
        for role, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"),
                           ("o", "attn_output"), ("g", "ffn_gate"), ("u", "ffn_up"),
                           ("d", "ffn_down")):
            if moe is not None and role in "gud":
                L["w" + role] = L["b" + role] = None
                continue
            L["w" + role] = src.req(f"{p}{name}.weight")
            if arch in ("qwen2", "qwen2moe") and role in "qkv":
                L["b" + role] = src.req(f"{p}{name}.bias")
            else:
                L["b" + role] = src.opt(f"{p}{name}.bias")
        if permuted:
            for role, n in (("q", n_heads), ("k", n_kv)):
                L["w" + role] = unpermute_rows(L["w" + role], n)
                if L["b" + role] is not None:
                    L["b" + role] = unpermute_rows(L["b" + role], n)
        L["moe"] = moe_ref.gguf_moe_layer(src, i, moe) if moe is not None else None
        layers.append(L)
    return LlamaRef(cfg, embed, final_norm, lm_head, layers)


def load_model(path, q8_activations=False):
    """The model at path; q8_activations: matmuls by Q8_0 weights take their activations in int8,
    as ppserve's CPU engine does (gguf_reader.q8_act)."""
    if os.path.isdir(path):
        return load_hf(path)
    if not os.path.isfile(path):
        raise ModelError(f"{path}: no such file or directory")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return load_gguf(path, q8_activations)
    raise ModelError(f"{path}: neither an HF directory nor a GGUF file")


# ----------------------------------------------------------------------------------------------
# CLI


def parse_ids(text, what):
    text = text.strip()
    if not text:
        return []
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise ModelError(f"{what}: expected comma-separated integers, got {text!r}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 numpy reference for Llama-family models")
    ap.add_argument("--model", required=True, help=".gguf file or HF directory")
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, required=True, help="tokens to generate")
    ap.add_argument("--force-ids", help="teacher-forced ids, one per generated step")
    ap.add_argument("--dump-logits", metavar="FILE",
                    help="write one row of little-endian float32 logits per step")
    ap.add_argument("--json", action="store_true", help='print {"ids":[...]} on one line')
    ap.add_argument("--q8-activations", action="store_true",
                    help="matmuls by Q8_0 weights quantize their activations to int8 in 32-value "
                         "blocks first, as ppserve's CPU engine does")
    ap.add_argument("--dump-routing", metavar="FILE",
                    help="MoE: write the tokens routed to each expert of every layer, over the "
                         "tokens an engine feeds (the prompt and every generated id but the last) "
                         "as JSON")
    args = ap.parse_args(argv)

    try:
        prompt = parse_ids(args.prompt_ids, "--prompt-ids")
        force = parse_ids(args.force_ids, "--force-ids") if args.force_ids is not None else None
        if not prompt:
            raise ModelError("--prompt-ids must hold at least one id")
        if args.max_tokens < 0:
            raise ModelError("--max-tokens must be >= 0")
        if force is not None and len(force) != args.max_tokens:
            raise ModelError(f"--force-ids has {len(force)} ids, --max-tokens is "
                             f"{args.max_tokens}")
        model = load_model(args.model, args.q8_activations)
        n_embed = model.embed.shape[0]
        for t in prompt + (force or []):
            if not 0 <= t < n_embed:
                raise ModelError(f"token id {t} out of range [0, {n_embed})")
        ids, rows = model.generate(prompt, args.max_tokens, force)
        if args.dump_logits:
            with open(args.dump_logits, "wb") as f:
                for row in rows:
                    f.write(np.asarray(row, dtype="<f4").tobytes())
        if args.dump_routing:
            fed = prompt + list(force if force is not None else ids)[:max(args.max_tokens - 1, 0)]
            routing = []
            model.hidden_states(fed, routing)
            with open(args.dump_routing, "w") as f:
                json.dump({"tokens": len(fed), "layers": [
                    {"layer": li, "tokens_per_expert": [int(n) for n in counts]}
                    for li, counts in routing]}, f)
    except (ModelError, moe_ref.MoEError, GGUFError, SafetensorsError, OSError,
            json.JSONDecodeError) as e:
        print(f"llama_ref: error: {e}", file=sys.stderr)
        return 2

    if args.json:
        print(json.dumps({"ids": ids}, separators=(",", ":")))
    else:
        print(",".join(str(t) for t in ids))
    return 0


if __name__ == "__main__":
    sys.exit(main())
