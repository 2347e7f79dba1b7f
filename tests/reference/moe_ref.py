"""Mixture-of-Experts FFN for the float64 numpy reference (llama_ref.py), from the Hugging Face
definitions of MixtralSparseMoeBlock and Qwen2MoeSparseMoeBlock, and the readers of MoE tensors
from both file formats. Independent of the C engine: only the files and the HF math.

Routing, as HF computes it:
  Mixtral:   p = softmax(router logits over all experts); top-k of p; divide the k by their sum.
  Qwen2-MoE: p = softmax(router logits over all experts); top-k of p; divide by their sum only if
             norm_topk_prob; plus the shared expert times sigmoid(x . shared_expert_gate).
Top-k ties go to the lower expert index (a stable sort).
"""

import numpy as np

from gguf_reader import matmul


class MoEError(Exception):
    """An MoE checkpoint this reference does not support, or an inconsistent one."""


def _silu(x):
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _mlp(h, wg, wu, wd):
    return matmul(_silu(matmul(h, wg)) * matmul(h, wu), wd)


def _softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def route(logits, k, renormalise):
    """(experts (T, k), weights (T, k)) from router logits (T, n)."""
    p = _softmax(logits)
    experts = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    weights = np.take_along_axis(p, experts, axis=-1)
    if renormalise:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return experts, weights


def moe_ffn(h, moe):
    """The MoE FFN of normalised hidden states h (T, dim)."""
    renorm = moe["kind"] == "mixtral" or moe["norm_topk_prob"]
    experts, weights = route(matmul(h, moe["router"]), moe["k"], renorm)
    out = np.zeros_like(h)
    for e, (wg, wu, wd) in enumerate(moe["experts"]):
        rows, slot = np.nonzero(experts == e)
        if len(rows):
            out[rows] += weights[rows, slot][:, None] * _mlp(h[rows], wg, wu, wd)
    if moe.get("shared") is not None:
        wg, wu, wd, gate = moe["shared"]
        out += _sigmoid(h @ gate)[:, None] * _mlp(h, wg, wu, wd)
    return out


def routed_counts(h, moe):
    """Tokens routed to each expert, for h (T, dim)."""
    renorm = moe["kind"] == "mixtral" or moe["norm_topk_prob"]
    experts, _ = route(matmul(h, moe["router"]), moe["k"], renorm)
    return np.bincount(experts.reshape(-1), minlength=len(moe["experts"]))


def check_shapes(i, moe, dim):
    n = moe["router"].shape[0]
    if moe["router"].shape != (n, dim):
        raise MoEError(f"layer {i} router has shape {moe['router'].shape}, expected ({n}, {dim})")
    if len(moe["experts"]) != n:
        raise MoEError(f"layer {i}: {len(moe['experts'])} experts, router has {n} rows")
    if not 1 <= moe["k"] <= n:
        raise MoEError(f"layer {i}: experts per token {moe['k']} outside [1, {n}]")
    for e, (wg, wu, wd) in enumerate(moe["experts"]):
        F = wg.shape[0]
        if wg.shape != (F, dim) or wu.shape != (F, dim) or wd.shape != (dim, F):
            raise MoEError(f"layer {i} expert {e}: shapes {wg.shape}, {wu.shape}, {wd.shape} "
                           f"are not ({F}, {dim}), ({F}, {dim}), ({dim}, {F})")


# ------------------------------------------------------------------------------------------------
# Loading


def hf_moe_config(hc, model_type, cfg_path, key):
    """The MoE settings of an HF config.json (key(name) reads a required key), or None for a dense
    model_type."""
    if model_type == "mixtral":
        return {"kind": "mixtral", "n": int(key("num_local_experts")),
                "k": int(key("num_experts_per_tok")), "norm_topk_prob": True}
    if model_type != "qwen2_moe":
        return None
    if int(hc.get("decoder_sparse_step", 1)) != 1 or hc.get("mlp_only_layers"):
        raise MoEError(f"{cfg_path}: qwen2_moe with dense layers (decoder_sparse_step / "
                       f"mlp_only_layers) is not supported")
    return {"kind": "qwen2moe", "n": int(key("num_experts")), "k": int(key("num_experts_per_tok")),
            "norm_topk_prob": bool(hc.get("norm_topk_prob", False))}


def hf_moe_layer(src, i, mc):
    p = f"model.layers.{i}."
    if mc["kind"] == "mixtral":
        b = p + "block_sparse_moe."
        router = src.req(b + "gate.weight")
        experts = [(src.req(f"{b}experts.{e}.w1.weight"), src.req(f"{b}experts.{e}.w3.weight"),
                    src.req(f"{b}experts.{e}.w2.weight")) for e in range(mc["n"])]
        shared = None
    else:
        b = p + "mlp."
        router = src.req(b + "gate.weight")
        experts = [tuple(src.req(f"{b}experts.{e}.{r}_proj.weight") for r in ("gate", "up", "down"))
                   for e in range(mc["n"])]
        shared = tuple(src.req(f"{b}shared_expert.{r}_proj.weight") for r in ("gate", "up", "down"))
        shared += (src.req(b + "shared_expert_gate.weight").reshape(-1),)
    return dict(mc, router=router, experts=experts, shared=shared)


def gguf_moe_config(key, arch):
    """The MoE settings of GGUF metadata (key(suffix, default) reads arch.suffix), or None."""
    if arch not in ("llama", "qwen2moe"):
        return None
    n = int(key("expert_count", 0) if arch == "llama" else key("expert_count"))
    if n == 0 and arch == "qwen2moe":
        raise MoEError("qwen2moe.expert_count is 0: a qwen2moe model needs experts")
    if n == 0:
        return None
    if arch == "llama":
        return {"kind": "mixtral", "n": n, "k": int(key("expert_used_count")),
                "norm_topk_prob": True}
    # qwen2moe: llama.cpp's converter writes no renormalisation key; HF's default is false
    return {"kind": "qwen2moe", "n": n, "k": int(key("expert_used_count")),
            "norm_topk_prob": bool(key("expert_weights_norm", False)),
            "shared_ffn": int(key("expert_shared_feed_forward_length", 0))}


def gguf_moe_layer(src, i, mc):
    p = f"blk.{i}."
    router = src.req(p + "ffn_gate_inp.weight")
    stacks = [src.req(f"{p}ffn_{r}_exps.weight") for r in ("gate", "up", "down")]
    for s in stacks:
        if s.ndim != 3 or s.shape[0] != mc["n"]:
            raise MoEError(f"layer {i}: expert tensor of shape {s.shape}, expected "
                           f"({mc['n']}, rows, cols)")
    experts = [tuple(s[e] for s in stacks) for e in range(mc["n"])]
    shared = None
    if mc["kind"] == "qwen2moe" and mc.get("shared_ffn", 0) > 0:
        shared = tuple(src.req(f"{p}ffn_{r}_shexp.weight") for r in ("gate", "up", "down"))
        shared += (src.req(p + "ffn_gate_inp_shexp.weight").reshape(-1),)
    return dict(mc, router=router, experts=experts, shared=shared)
