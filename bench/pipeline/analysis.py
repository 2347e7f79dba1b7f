"""Figures derived from a run's Trace (ppserve.v1.TraceResponse, microbatches of that run only) and
from the model's sizes: the bubble against GPipe's bound, per-hop latency, activation hop
throughput, and the decode bound predicted from memory bandwidth. Pure computation, no I/O."""
import statistics

import gguf_sizes


def _spans(mb):
    """{stage index: StageSpan} of one microbatch."""
    return {s.stage: s for s in mb.spans}


def summary(xs):
    """mean, p50, p99, min, max, n of a list (seconds or rates); empty -> None."""
    if not xs:
        return None
    s = sorted(xs)

    def pct(p):
        return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]
    return {"mean": statistics.fmean(s), "p50": pct(50), "p99": pct(99), "min": s[0], "max": s[-1],
            "n": len(s)}


def is_decode(mb):
    """A microbatch of decode steps only (every part one token)."""
    return mb.n_tokens == mb.n_seqs


def busy_and_bubble(mbs, n_stages, window=None):
    """Per stage busy seconds = Σ(compute_end − compute_start) within the window [first compute
    start, last compute end] (or the given (t0, t1), compute intervals clipped to it);
    bubble = 1 − Σ busy / (P × window)."""
    spans = [(k, s.compute_start, s.compute_end) for mb in mbs for k, s in _spans(mb).items()]
    if window is None:
        window = (min(a for _, a, _ in spans), max(b for _, _, b in spans))
    t0, t1 = window
    length = t1 - t0
    busy = [0.0] * n_stages
    first = [None] * n_stages
    last = [None] * n_stages
    for k, a, b in spans:
        a, b = max(a, t0), min(b, t1)
        if b <= a:
            continue
        busy[k] += b - a
        first[k] = a if first[k] is None else min(first[k], a)
        last[k] = b if last[k] is None else max(last[k], b)
    # each stage's idle time: before its first compute (fill), after its last (drain), between
    idle = []
    for k in range(n_stages):
        fill = (first[k] if first[k] is not None else t1) - t0
        drain = t1 - (last[k] if last[k] is not None else t1)
        idle.append({"fill_s": fill, "drain_s": drain,
                     "between_s": length - busy[k] - fill - drain})
    return {"window_s": length, "busy_s": busy,
            "busy_fraction": [b / length for b in busy], "idle": idle,
            "bubble": 1.0 - sum(busy) / (n_stages * length), "t0": t0, "t1": t1}


def gpipe_bound(p, m):
    """GPipe's bubble for P equal stages and M equal microbatches: fill + drain, (P−1)/(M+P−1)."""
    return (p - 1) / (m + p - 1)


def bubble_figures(mbs, n_stages):
    """The bubble of a run against GPipe's bound: over the whole window with M = every microbatch
    in it; and over the prefill phase alone (from the first compute start to the last stage's end
    of the last microbatch that carries prompt tokens; every stage's compute clipped to it) with
    M = the microbatches that carry prompt tokens, the part of the run GPipe's model describes."""
    whole = busy_and_bubble(mbs, n_stages)
    m = len(mbs)
    whole.update({"m": m, "gpipe": gpipe_bound(n_stages, m)})
    whole["points_over_gpipe"] = 100.0 * (whole["bubble"] - whole["gpipe"])
    out = {"whole": whole}
    pre = [mb for mb in mbs if not is_decode(mb)]
    if pre:
        t1 = max(_spans(mb)[n_stages - 1].compute_end for mb in pre)
        part = busy_and_bubble(mbs, n_stages, (whole["t0"], t1))
        part.update({"m": len(pre), "gpipe": gpipe_bound(n_stages, len(pre))})
        part["points_over_gpipe"] = 100.0 * (part["bubble"] - part["gpipe"])
        out["prefill_phase"] = part
    return out


def hop_latency(mbs, n_stages):
    """Decode microbatches: for each hop k -> k+1, recv_start(k+1) − compute_end(k); the
    coordinator's legs (sent -> stage 0's recv_start, last compute_end -> delivered); the waits in
    stage queues (compute_start − recv_end); and the round trip (delivered − sent) minus Σ
    compute."""
    dec = [mb for mb in mbs if is_decode(mb)]
    hops = {k: [] for k in range(n_stages - 1)}
    to_first, to_coord, queue, rt_minus, rt, compute = [], [], [], [], [], []
    for mb in dec:
        sp = _spans(mb)
        if len(sp) != n_stages:
            continue
        for k in range(n_stages - 1):
            hops[k].append(sp[k + 1].recv_start - sp[k].compute_end)
        to_first.append(sp[0].recv_start - mb.sent)
        to_coord.append(mb.delivered - sp[n_stages - 1].compute_end)
        queue.append(sum(sp[k].compute_start - sp[k].recv_end for k in range(n_stages)))
        c = sum(sp[k].compute_end - sp[k].compute_start for k in range(n_stages))
        compute.append(c)
        rt.append(mb.delivered - mb.sent)
        rt_minus.append(mb.delivered - mb.sent - c)
    return {"n_decode_microbatches": len(dec),
            "hops": {f"{k}->{k + 1}": summary(v) for k, v in hops.items()},
            "coordinator_to_stage0": summary(to_first),
            "last_stage_to_coordinator": summary(to_coord),
            "queue_wait_sum": summary(queue),
            "round_trip": summary(rt), "compute_sum": summary(compute),
            "round_trip_minus_compute": summary(rt_minus)}


def activation_hops(mbs, n_stages, dim, tokens):
    """Hops of microbatches of exactly `tokens` rows (f32 activations, tokens × dim × 4 bytes):
    bytes / (next stage's recv_end − this stage's compute_end), and its two parts: compute_end ->
    recv_start (encode, queue, first chunk) and recv_start -> recv_end (the chunks arriving)."""
    nbytes = tokens * dim * 4
    rate, lead, wire = [], [], []
    for mb in mbs:
        if mb.n_tokens != tokens:
            continue
        sp = _spans(mb)
        for k in range(n_stages - 1):
            if k in sp and k + 1 in sp:
                dt = sp[k + 1].recv_end - sp[k].compute_end
                if dt > 0:
                    rate.append(nbytes / dt)
                lead.append(sp[k + 1].recv_start - sp[k].compute_end)
                wire.append(sp[k + 1].recv_end - sp[k + 1].recv_start)
    return {"bytes": nbytes, "rate_bytes_per_s": summary(rate), "lead_s": summary(lead),
            "arrival_s": summary(wire)}


def stage_bytes(sizes, partition, cfg, tokens, mean_ctx):
    """Bytes stage k reads in one decode microbatch of `tokens` tokens at mean context mean_ctx:
    its layers' tensors, the final norm and LM head on the last stage, the embedding rows on the
    first, and the KV cache (f32 K and V) of each token's context in each of its layers."""
    kv_dim = cfg["kv_heads"] * cfg["head_dim"]
    out = []
    for k, (a, b) in enumerate(partition):
        w = sum(gguf_sizes.layer_bytes(sizes, layer) for layer in range(a, b))
        if k == len(partition) - 1:
            w += sizes.get("output_norm.weight", 0)
            w += sizes.get("output.weight", sizes.get("token_embd.weight", 0))
        if k == 0:
            w += tokens * sizes["token_embd.weight"] // cfg["vocab"]
        w += tokens * mean_ctx * (b - a) * 2 * kv_dim * 4
        out.append(w)
    return out


def decode_bound(w, bw1, bw2, tokens_per_mb):
    """Predicted decode rate of a pipeline whose stage k reads w[k] bytes per microbatch, each stage
    one thread: in steady state the pipeline finishes one microbatch per period T, and T is at
    least each stage's own read time w[k] / bw1 (one thread's bandwidth) and at least the time the
    shared memory bus needs for all stages' reads, Σ w / bw2 (two threads' bandwidth). tokens/s =
    tokens_per_mb / T."""
    per_stage = [x / bw1 for x in w]
    shared = sum(w) / bw2
    period = max(max(per_stage), shared)
    return {"stage_read_s": per_stage, "shared_bus_s": shared, "period_s": period,
            "limited_by": "shared bus" if shared >= max(per_stage)
            else f"stage {per_stage.index(max(per_stage))}",
            "tokens_per_s": tokens_per_mb / period}
