#!/usr/bin/python3
"""bench_pipeline: ppserve's pipeline (ppserve-coordinator + ppserve-stage over gRPC on loopback)
against the same machine's limits, measured in the same run. Not a test and not run by ctest; every
figure that matters is a ratio of two measurements taken minutes apart on the same machine.

  /usr/bin/python3 bench/pipeline/bench_pipeline.py [--build DIR] [--models DIR] [--layers N]
      [--decode-layers N] [--decode-split auto|planned|A,B] [--rounds N] [--cpus 0,1]
      [--json PATH] [--dump-trace DIR]

1. Prefill-heavy: 16 requests × 512-token prompts, 16 generated tokens each, submitted at once, on
   the tinyllama shape with --layers layers (default all 22; f16): (a) 2 stages, one core and one
   thread each, layers split evenly; (b) 1 stage with 2 threads on both cores (the same continuous
   batching in one process); (c) (a) with one microbatch in flight (layers one stage after
   another, as llama.cpp's RPC backend runs them). tokens/s = (prompt + generated tokens) / wall
   time; ratios (a)/(b) and (a)/(c).
2. Decode-heavy: 8 streams × 128 generated tokens (8-token prompts, ignore_eos) on the 2-stage
   pinned pipeline, --decode-layers layers. Measured: the tokens/s while all 8 streams run.
   Predicted: each decode microbatch makes stage k read its tensors once (plus the KV cache); the
   period per microbatch is at least max_k(W_k / BW1) and Σ W_k / BW2, with BW1 and BW2 the read
   bandwidth of 1 and 2 threads measured in this run; predicted tokens/s = tokens per microbatch /
   period.
3. Bubble of run (a) from Trace against GPipe's (P−1)/(M+P−1).
4. Per-hop latency of the decode run's microbatches from Trace.
5. Activation hops of 512-token microbatches in run (a) (and (c)) against a raw loopback TCP copy.

With --rounds N every configuration runs N times, interleaved, and the best run of each counts (a
busy neighbour only ever lowers a figure). Every run also reports the CPU time that processes other
than the bench's used meanwhile ("foreign load", in cores), so that a contended run shows as one.

Needs Debian's python3 with grpcio and protobuf, and protoc; the daemons, `ppserve` and
`pp_bench_machine` from a build (--build, default build/)."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import analysis  # noqa: E402
import daemons  # noqa: E402
import gguf_sizes  # noqa: E402
import tcp_copy  # noqa: E402

REPO = HERE.parents[1]
MAX_BATCH_TOKENS = 512  # the coordinator's and the stages' token budget per microbatch
GOALS = {"prefill_a_over_b": 0.85, "prefill_a_over_c": 1.7, "decode_measured_over_predicted": 0.9,
         "bubble_points_over_gpipe": 5.0}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_cpu():
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat: busy is user, nice,
    system, irq and softirq time of every CPU."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / daemons.CLK_TCK, (v[7] if len(v) > 7 else 0) / daemons.CLK_TCK


def own_cpu():
    """CPU seconds of this script and of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Noise:
    """How contended an interval was: the load average, the hypervisor's steal, and the CPU time
    that processes other than ours (the pipeline's and this script's) used, in cores."""

    def __init__(self, pipeline=None):
        self.pipeline = pipeline
        self.t0 = time.monotonic()
        self.load0 = os.getloadavg()[0]
        self.m0 = machine_cpu()
        self.each0 = self._each()

    def _each(self):
        """CPU seconds so far of this script (the client) and of each process started here."""
        each = {"client": own_cpu()}
        if self.pipeline:
            each.update(self.pipeline.cpu_seconds_each())
        return each

    def end(self):
        m1 = machine_cpu()
        each1 = self._each()
        dt = max(1e-9, time.monotonic() - self.t0)
        ours = sum(each1.values()) - sum(self.each0.values())
        return {"cores_by_process": {k: (v - self.each0.get(k, 0.0)) / dt
                                     for k, v in each1.items()},
                "load_start": self.load0, "load_end": os.getloadavg()[0],
                "steal_cores": (m1[1] - self.m0[1]) / dt,
                "own_cores": ours / dt,
                "foreign_cores": max(0.0, (m1[0] - self.m0[0]) - ours) / dt}


def ensure_model(bins, models, layers):
    d = models / f"tinyllama-f16-L{layers}"
    path = d / "model.gguf"
    if not path.exists():
        log(f"writing the model {path} (ppserve synth --shape tinyllama --dtype f16 --layers "
            f"{layers})")
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(bins["ppserve"]), "synth", "--out", str(d), "--shape", "tinyllama",
                        "--dtype", "f16", "--layers", str(layers)], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def inspect(bins, path):
    p = subprocess.run([str(bins["ppserve"]), "inspect", "--model", str(path), "--json"],
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def machine_figures(bins, cpus):
    """Read bandwidth (and FMA peak) of 1 thread pinned to cpus[0] and of 2 threads on cpus."""
    out = {}
    for n, cs in ((1, cpus[:1]), (2, cpus[:2])):
        noise = Noise()
        p = subprocess.run(["taskset", "-c", daemons.cpu_list(cs), str(bins["machine"]),
                            "--threads", str(n)], check=True, capture_output=True, text=True)
        out[n] = json.loads(p.stdout)
        out[n]["noise"] = noise.end()
    return out


def kv_mb_for(cfg, layers, n_seqs, tokens):
    """A KV budget (MiB) that holds every sequence of a run on a stage holding `layers` layers."""
    need = n_seqs * tokens * layers * 2 * cfg["kv_heads"] * cfg["head_dim"] * 4
    return max(64, int(need * 1.5 / 2**20) + 16)


def prompts_for(n, length, vocab, seed):
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 1) for _ in range(length)] for _ in range(n)]


def even_split(n_layers, n_stages):
    base, extra = divmod(n_layers, n_stages)
    return [base + (1 if i < extra else 0) for i in range(n_stages)]


def byte_balanced_split(sizes, n_layers):
    """Layers of stage 0 and stage 1 that minimise the larger of the two stages' decode reads
    (stage 1 also reads the final norm and the LM head)."""
    head = sizes.get("output.weight", sizes.get("token_embd.weight", 0))
    lb = [gguf_sizes.layer_bytes(sizes, i) for i in range(n_layers)]
    best = None
    for n0 in range(1, n_layers):
        worst = max(sum(lb[:n0]), sum(lb[n0:]) + head)
        if best is None or worst < best[0]:
            best = (worst, n0)
    return [best[1], n_layers - best[1]]


def trace_entry(mb, t0):
    return {"id": mb.microbatch_id, "n_seqs": mb.n_seqs, "n_tokens": mb.n_tokens,
            "sent": mb.sent - t0, "delivered": mb.delivered - t0,
            "spans": [{"stage": s.stage, "recv_start": s.recv_start - t0,
                       "recv_end": s.recv_end - t0, "compute_start": s.compute_start - t0,
                       "compute_end": s.compute_end - t0} for s in mb.spans]}


def run_config(ctx, name, model, stage_cpus, threads, prompts, max_tokens, layers=None,
               microbatches=0):
    """Starts a pipeline, warms it (one short request touches every weight), runs the prompts all
    at once and stops it. Returns the figures and the run's Trace microbatches (after warm-up)."""
    cfg = inspect(ctx.bins, model)
    # room for every sequence on the stage with the most layers (all of them when planned)
    kv_mb = kv_mb_for(cfg, max(layers) if layers else cfg["layers"], len(prompts),
                      len(prompts[0]) + max_tokens)
    p = daemons.Pipeline(ctx.bins, ctx.pb, ctx.workdir, model.parent.parent,
                         f"{model.parent.name}/{model.name}", stage_cpus, threads, ctx.other_cpus,
                         layers=layers, microbatches=microbatches,
                         max_batch_tokens=MAX_BATCH_TOKENS, kv_mb=kv_mb, tag=name)
    log(f"{name}: starting {len(stage_cpus)} stage(s) on cores "
        f"{' | '.join(daemons.cpu_list(c) for c in stage_cpus)}, {threads} thread(s) each, "
        f"microbatches={microbatches or 'default'}")
    try:
        p.start()
        partition = p.partition()
        _, warm = p.client.run_requests([prompts[0][:16]], 2, timeout=300)
        if warm[0]["error"]:
            raise RuntimeError(f"{name}: the warm-up request failed: {warm[0]['error']}\n"
                               + p.logs_tail())
        warm_ids = [mb.microbatch_id for mb in p.client.trace().microbatches]
        last_warm = max(warm_ids) if warm_ids else 0
        log(f"{name}: partition {partition}; running {len(prompts)} requests × "
            f"{len(prompts[0])}-token prompts × {max_tokens} tokens")
        noise = Noise(p)
        t_submit, res = p.client.run_requests(prompts, max_tokens, timeout=3600)
        noise = noise.end()
        errors = [r["error"] for r in res if r["error"]]
        short = [i for i, r in enumerate(res) if sum(n for _, n in r["times"]) != max_tokens]
        if errors or short:
            raise RuntimeError(f"{name}: requests failed: {errors[:3]}; requests with fewer than "
                               f"{max_tokens} tokens: {short}\n" + p.logs_tail())
        p.check_alive()
        mbs = [mb for mb in p.client.trace().microbatches if mb.microbatch_id > last_warm]
        mbs.sort(key=lambda mb: mb.microbatch_id)
    finally:
        killed = p.stop()
        if killed:
            log(f"{name}: BUG? these did not stop within 15 s of SIGTERM: {killed}")
    t_end = max(t for r in res for t, _ in r["times"])
    n_prompt = sum(len(x) for x in prompts)
    n_gen = len(prompts) * max_tokens
    elapsed = t_end - t_submit
    log(f"{name}: {elapsed:.1f} s, {(n_prompt + n_gen) / elapsed:.1f} tok/s, foreign load "
        f"{noise['foreign_cores']:.2f} cores; ours by process: "
        + ", ".join(f"{k} {v:.3f}" for k, v in noise["cores_by_process"].items()))
    if ctx.dump_trace:
        t0 = min(mb.sent for mb in mbs)
        with open(ctx.dump_trace / f"{name}.trace.json", "w") as f:
            json.dump([trace_entry(mb, t0) for mb in mbs], f, indent=1)
    n_st = len(stage_cpus)
    full = [mb for mb in mbs if mb.n_tokens == MAX_BATCH_TOKENS]
    full_compute = [analysis.summary([s.compute_end - s.compute_start for mb in full
                                      for s in mb.spans if s.stage == k]) for k in range(n_st)]
    return {"name": name, "partition": partition, "stage_cpus": stage_cpus, "threads": threads,
            # 0 leaves it to the coordinator, whose default is stages + 1 (coordinator/setup.c)
            "microbatches_in_flight": microbatches or n_st + 1, "prompt_tokens": n_prompt,
            "generated_tokens": n_gen, "elapsed_s": elapsed,
            "tokens_per_s": (n_prompt + n_gen) / elapsed, "n_microbatches": len(mbs),
            "stage_busy_fraction": analysis.busy_and_bubble(mbs, n_st)["busy_fraction"],
            "full_microbatch_compute_s": full_compute,
            "noise": noise, "killed_at_stop": killed, "_mbs": mbs, "_res": res}


def decode_window(res):
    """The interval in which every stream is generating: from the last stream's first token to the
    first stream's last token; returns (t_a, t_b, tokens received inside it)."""
    t_a = max(r["times"][0][0] for r in res)
    t_b = min(r["times"][-1][0] for r in res)
    n = sum(k for r in res for t, k in r["times"] if t_a < t <= t_b)
    return t_a, t_b, n


def decode_rate(r):
    t_a, t_b, n = decode_window(r["_res"])
    return n / (t_b - t_a)


class Ctx:
    pass


def source_state():
    """The commit the checkout is at and the files changed since (the daemons' source may move)."""
    def git(*args):
        p = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        return p.stdout.rstrip("\n") if p.returncode == 0 else ""
    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line]
    return {"commit": git("rev-parse", "--short", "HEAD"), "changed_files": changed}


def fmt_rate(x):
    return f"{x / 1e9:.2f} GB/s"


def strip(run):
    return {x: y for x, y in run.items() if not x.startswith("_")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=REPO / "build",
                    help="build folder with ppserve, the daemons and bench/pp_bench_machine")
    ap.add_argument("--models", type=Path, default=Path("/tmp/pp_bench_pipeline"),
                    help="models are written here by `ppserve synth` when missing")
    ap.add_argument("--layers", type=int, default=22,
                    help="layers of the prefill-heavy model (default tinyllama's 22, a round of "
                         "about 9 minutes on 2 quiet cores; 2, one per stage, takes 1.5)")
    ap.add_argument("--decode-layers", type=int, default=22, help="layers of the decode model")
    ap.add_argument("--decode-split", default="auto",
                    help="decode partition: auto (balance the bytes each stage reads), planned "
                         "(the coordinator's planner) or A,B")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration this many times, interleaved; the best counts")
    ap.add_argument("--cpus", default="0,1", help="the two cores the stages are pinned to")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--decode-prompt", type=int, default=8)
    ap.add_argument("--tcp-reps", type=int, default=60)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dump-trace", type=Path, help="write each run's Trace timeline here")
    ap.add_argument("--workdir", type=Path, help="daemon logs (default: a temporary folder)")
    a = ap.parse_args()

    ctx = Ctx()
    b = a.build.resolve()
    ctx.bins = {"coordinator": b / "ppserve-coordinator", "stage": b / "ppserve-stage",
                "ppserve": b / "ppserve", "machine": b / "bench/pp_bench_machine"}
    missing = [str(p) for p in ctx.bins.values() if not p.exists()]
    if missing:
        sys.exit(f"bench_pipeline: not built: {', '.join(missing)}")
    cpus = [int(c) for c in a.cpus.split(",")]
    if len(cpus) != 2:
        sys.exit("bench_pipeline: --cpus takes two cores")
    online = sorted(os.sched_getaffinity(0))
    others = [c for c in online if c not in cpus]
    # the coordinator and this client go to other cores when there are any; on a 2-core machine
    # they share the stages' cores (and the output says so)
    ctx.other_cpus = others or cpus
    os.sched_setaffinity(0, set(ctx.other_cpus))
    tmp = tempfile.TemporaryDirectory(prefix="pp_bench_pipeline.")
    ctx.workdir = a.workdir or Path(tmp.name)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    ctx.dump_trace = a.dump_trace
    if ctx.dump_trace:
        ctx.dump_trace.mkdir(parents=True, exist_ok=True)
    (ctx.workdir / "protos").mkdir(exist_ok=True)
    ctx.pb = daemons.compile_protos(REPO, ctx.workdir / "protos")

    t_bench = time.time()
    quiet = Noise()
    time.sleep(2.0)
    quiet = quiet.end()
    if quiet["foreign_cores"] > 0.2:
        log(f"warning: other processes are using {quiet['foreign_cores']:.2f} cores before the "
            "start; the figures will show a contended machine")
    noise_all = Noise()
    pre_model = ensure_model(ctx.bins, a.models, a.layers)
    dec_model = ensure_model(ctx.bins, a.models, a.decode_layers)
    pre_cfg = inspect(ctx.bins, pre_model)
    dec_cfg = inspect(ctx.bins, dec_model)
    dec_sizes = gguf_sizes.tensor_bytes(dec_model)
    if a.decode_split == "auto":
        dec_split = byte_balanced_split(dec_sizes, dec_cfg["layers"])
    elif a.decode_split == "planned":
        dec_split = None
    else:
        dec_split = [int(x) for x in a.decode_split.split(",")]

    log("machine figures (read bandwidth, FMA peak) for 1 and 2 threads")
    mach = [machine_figures(ctx.bins, cpus)]
    chunk_bytes = a.prompt_len * pre_cfg["dim"] * 4
    log(f"raw loopback TCP copy of {chunk_bytes} bytes, core {cpus[0]} -> core {cpus[1]}")
    tcp_idle = tcp_copy.copy_rate(chunk_bytes, a.tcp_reps, cpus)
    tcp_busy = tcp_copy.copy_rate(chunk_bytes, a.tcp_reps, cpus, busy=True)

    prompts = prompts_for(a.prompts, a.prompt_len, pre_cfg["vocab"], 1)
    dprompts = prompts_for(a.streams, a.decode_prompt, dec_cfg["vocab"], 2)
    even = even_split(a.layers, 2)
    pinned = [[cpus[0]], [cpus[1]]]
    all_runs = {"a": [], "b": [], "c": [], "d": []}
    for rnd in range(a.rounds):
        sfx = f"-r{rnd + 1}" if a.rounds > 1 else ""
        all_runs["a"].append(run_config(ctx, "a" + sfx, pre_model, pinned, 1, prompts, a.gen,
                                        layers=even))
        all_runs["b"].append(run_config(ctx, "b" + sfx, pre_model, [cpus], 2, prompts, a.gen))
        all_runs["c"].append(run_config(ctx, "c" + sfx, pre_model, pinned, 1, prompts, a.gen,
                                        layers=even, microbatches=1))
        all_runs["d"].append(run_config(ctx, "decode" + sfx, dec_model, pinned, 1, dprompts,
                                        a.decode_tokens, layers=dec_split))
    runs = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in all_runs.items() if k != "d"}
    runs["d"] = max(all_runs["d"], key=decode_rate)
    log("machine figures again")
    mach.append(machine_figures(ctx.bins, cpus))
    bw1 = max(m[1]["read_bytes_per_s"] for m in mach)
    bw2 = max(m[2]["read_bytes_per_s"] for m in mach)
    fma1 = max(m[1]["fma_flops_per_s"] for m in mach)
    fma2 = max(m[2]["fma_flops_per_s"] for m in mach)

    # ---- 1. prefill-heavy
    ra, rb, rc = runs["a"], runs["b"], runs["c"]
    a_b = ra["tokens_per_s"] / rb["tokens_per_s"]
    a_c = ra["tokens_per_s"] / rc["tokens_per_s"]

    # ---- 2. decode-heavy
    rd = runs["d"]
    t_a, t_b, n_win = decode_window(rd["_res"])
    measured = n_win / (t_b - t_a)
    win_mbs = [mb for mb in rd["_mbs"] if analysis.is_decode(mb) and mb.sent >= t_a - 1e-3
               and mb.delivered <= t_b + 1e-3]
    tok_per_mb = sum(mb.n_tokens for mb in win_mbs) / max(1, len(win_mbs))
    mean_ctx = a.decode_prompt + a.decode_tokens / 2
    w = analysis.stage_bytes(dec_sizes, rd["partition"], dec_cfg, tok_per_mb, mean_ctx)
    bound = analysis.decode_bound(w, bw1, bw2, tok_per_mb)
    n_st = len(rd["partition"])
    stage_compute = []
    for k in range(n_st):
        c = [s.compute_end - s.compute_start for mb in win_mbs for s in mb.spans if s.stage == k]
        stage_compute.append(sum(c) / len(c) if c else float("nan"))
    period = (t_b - t_a) / max(1, len(win_mbs))
    sizes_seen = {}
    for mb in win_mbs:
        e = sizes_seen.setdefault(mb.n_tokens, {"count": 0, "compute_s": [0.0] * n_st})
        e["count"] += 1
        for s in mb.spans:
            e["compute_s"][s.stage] += s.compute_end - s.compute_start
    for e in sizes_seen.values():
        e["compute_s"] = [c / e["count"] for c in e["compute_s"]]
    decode = {"window_s": t_b - t_a, "tokens_in_window": n_win, "measured_tokens_per_s": measured,
              "decode_microbatches_in_window": len(win_mbs), "tokens_per_microbatch": tok_per_mb,
              "mean_context": mean_ctx, "split": a.decode_split, "partition": rd["partition"],
              "stage_bytes": w, "bound": bound,
              "measured_over_predicted": measured / bound["tokens_per_s"],
              "measured_period_s": period, "stage_compute_s": stage_compute,
              "microbatch_sizes": {str(k): v for k, v in sorted(sizes_seen.items())},
              "stage_compute_bytes_per_s": [w[k] / stage_compute[k] for k in range(n_st)],
              "stage_compute_over_bw1": [w[k] / stage_compute[k] / bw1 for k in range(n_st)],
              "stage_idle_per_period_s": [period - c for c in stage_compute],
              "all_rounds_tokens_per_s": [decode_rate(r) for r in all_runs["d"]],
              "noise": rd["noise"]}

    # ---- 3. bubble of (a); 4. hops of the decode run; 5. activation hops of (a) and (c)
    bub = analysis.bubble_figures(ra["_mbs"], 2)
    hops = analysis.hop_latency(win_mbs, n_st)
    act = analysis.activation_hops(ra["_mbs"], 2, pre_cfg["dim"], a.prompt_len)
    act_c = analysis.activation_hops(rc["_mbs"], 2, pre_cfg["dim"], a.prompt_len)
    r = act["rate_bytes_per_s"]
    activation = {"trace_a": act, "trace_c_receiver_idle": act_c, "tcp_idle": tcp_idle,
                  "tcp_busy_cores": tcp_busy,
                  "ratio_best": r["max"] / tcp_idle["best_bytes_per_s"] if r else None,
                  "ratio_median": r["p50"] / tcp_idle["best_bytes_per_s"] if r else None}

    goals = {
        "prefill_a_over_b": {"goal": f">= {GOALS['prefill_a_over_b']}", "value": a_b,
                             "met": a_b >= GOALS["prefill_a_over_b"]},
        "prefill_a_over_c": {"goal": f">= {GOALS['prefill_a_over_c']}", "value": a_c,
                             "met": a_c >= GOALS["prefill_a_over_c"]},
        "decode_measured_over_predicted": {
            "goal": f">= {GOALS['decode_measured_over_predicted']}",
            "value": decode["measured_over_predicted"],
            "met": decode["measured_over_predicted"] >= GOALS["decode_measured_over_predicted"]},
        "bubble_points_over_gpipe": {
            "goal": f"<= {GOALS['bubble_points_over_gpipe']} points",
            "value": bub["whole"]["points_over_gpipe"],
            "met": bub["whole"]["points_over_gpipe"] <= GOALS["bubble_points_over_gpipe"]},
    }

    out = {
        "command": " ".join(sys.argv), "source": source_state(),
        "machine": {"cpus_for_stages": cpus, "cpus_for_coordinator_and_client": ctx.other_cpus,
                    "online_cpus": online, "read_bytes_per_s_1": bw1, "read_bytes_per_s_2": bw2,
                    "fma_flops_per_s_1": fma1, "fma_flops_per_s_2": fma2, "measurements": mach,
                    "noise_before_start": quiet, "noise_whole_bench": noise_all.end()},
        "models": {"prefill": {"path": str(pre_model), **pre_cfg},
                   "decode": {"path": str(dec_model), **dec_cfg}},
        "rounds": a.rounds,
        "prefill": {k: strip(runs[k]) for k in ("a", "b", "c")},
        "prefill_all_rounds": {k: [strip(x) for x in all_runs[k]] for k in ("a", "b", "c")},
        "prefill_ratio_a_over_b": a_b, "prefill_ratio_a_over_c": a_c,
        "decode": decode, "decode_run": strip(rd),
        "bubble": bub, "hop_latency": hops, "activation": activation, "goals": goals,
        "bench_seconds": time.time() - t_bench,
    }
    print_report(out, a)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
        log(f"wrote {a.json}")
    return 0


def ms(x):
    return f"{1e3 * x:.2f}"


def met(g):
    return "met" if g["met"] else "MISSED"


def print_report(o, a):
    m = o["machine"]
    pm, dm = o["models"]["prefill"], o["models"]["decode"]
    p = print
    nb = m["noise_whole_bench"]
    p(f"\nppserve pipeline bench — stages on cores {m['cpus_for_stages']}, coordinator and client "
      f"on {m['cpus_for_coordinator_and_client']} (online: {m['online_cpus']})")
    p(f"machine: read bandwidth 1 thread {fmt_rate(m['read_bytes_per_s_1'])}, 2 threads "
      f"{fmt_rate(m['read_bytes_per_s_2'])}; FMA peak {m['fma_flops_per_s_1'] / 1e9:.0f} / "
      f"{m['fma_flops_per_s_2'] / 1e9:.0f} GFLOP/s (best of before and after)")
    p(f"noise over the whole bench: load {nb['load_start']:.2f} -> {nb['load_end']:.2f}, other "
      f"processes {nb['foreign_cores']:.2f} cores (before the start: "
      f"{m['noise_before_start']['foreign_cores']:.2f}), steal {nb['steal_cores']:.2f} cores")
    p(f"models: prefill tinyllama shape f16 with {pm['layers']} layers (of 22); decode "
      f"{dm['layers']} layers; rounds {o['rounds']} (best of each counts)")

    p(f"\n1. prefill-heavy: {a.prompts} requests × {a.prompt_len}-token prompts × {a.gen} "
      f"generated, submitted at once")
    p(f"{'config':<40} {'layers':<18} {'tok/s':>7} {'time s':>7} {'mbs':>4} {'busy':>9} "
      f"{'512-tok mb compute s':>20} {'foreign':>8}")
    names = {"a": "(a) 2 stages, 1 core + 1 thread each",
             "b": "(b) 1 stage, 2 threads on both cores",
             "c": "(c) 2 stages, 1 microbatch in flight"}
    for k in ("a", "b", "c"):
        r = o["prefill"][k]
        busy = "/".join(f"{100 * x:.0f}%" for x in r["stage_busy_fraction"])
        fc = "/".join(f"{s['mean']:.2f}" if s else "-" for s in r["full_microbatch_compute_s"])
        p(f"{names[k]:<40} {str(r['partition']):<18} {r['tokens_per_s']:7.1f} "
          f"{r['elapsed_s']:7.1f} {r['n_microbatches']:4d} {busy:>9} {fc:>20} "
          f"{r['noise']['foreign_cores']:7.2f}c")
        if o["rounds"] > 1:
            p(f"{'':<4}all rounds: " + ", ".join(
                f"{x['tokens_per_s']:.1f} tok/s (foreign {x['noise']['foreign_cores']:.2f}c)"
                for x in o["prefill_all_rounds"][k]))
    g = o["goals"]
    p(f"(a)/(b) = {o['prefill_ratio_a_over_b']:.3f}   goal >= 0.85: {met(g['prefill_a_over_b'])}")
    p(f"(a)/(c) = {o['prefill_ratio_a_over_c']:.3f}   goal >= 1.7:  {met(g['prefill_a_over_c'])}")
    fa = o["prefill"]["a"]["full_microbatch_compute_s"]
    fcc = o["prefill"]["c"]["full_microbatch_compute_s"]
    if all(fa) and all(fcc):
        p("a stage's compute of a 512-token microbatch with the other stage computing too (a) / "
          "alone (c): " + ", ".join(f"stage {k} {fa[k]['mean'] / fcc[k]['mean']:.2f}×"
                                    for k in range(len(fa))))

    d = o["decode"]
    bd = d["bound"]
    p(f"\n2. decode-heavy: {a.streams} streams × {a.decode_tokens} tokens "
      f"({a.decode_prompt}-token prompts), 2 stages pinned, partition {d['partition']} "
      f"(split: {d['split']}); foreign load {d['noise']['foreign_cores']:.2f} cores")
    p(f"measured {d['measured_tokens_per_s']:.2f} tok/s over {d['window_s']:.1f} s with every "
      f"stream running ({d['decode_microbatches_in_window']} microbatches, "
      f"{d['tokens_per_microbatch']:.2f} tokens each)")
    p("predicted: stage k reads W_k bytes per decode microbatch (its layers' tensors, the LM head "
      f"on the last, KV at the mean context {d['mean_context']:.0f}); period >= max(max_k "
      "W_k / BW1, sum W / BW2); tok/s = tokens per microbatch / period")
    for k, wk in enumerate(d["stage_bytes"]):
        p(f"  stage {k}: W = {wk / 1e6:7.1f} MB -> {ms(bd['stage_read_s'][k])} ms at BW1; "
          f"measured compute {ms(d['stage_compute_s'][k])} ms "
          f"({fmt_rate(d['stage_compute_bytes_per_s'][k])} = "
          f"{100 * d['stage_compute_over_bw1'][k]:.0f}% of BW1), idle "
          f"{ms(d['stage_idle_per_period_s'][k])} ms per period")
    p("  decode microbatches by size: " + "; ".join(
        f"{k} tokens × {v['count']}: compute " + "/".join(ms(c) for c in v["compute_s"]) + " ms"
        for k, v in d["microbatch_sizes"].items()))
    p(f"  shared bus: sum W / BW2 = {ms(bd['shared_bus_s'])} ms; predicted period "
      f"{ms(bd['period_s'])} ms ({bd['limited_by']}), measured {ms(d['measured_period_s'])} ms")
    p(f"predicted {bd['tokens_per_s']:.2f} tok/s; measured/predicted = "
      f"{d['measured_over_predicted']:.3f}   goal >= 0.9: "
      f"{met(g['decode_measured_over_predicted'])}")

    bw = o["bubble"]["whole"]
    p(f"\n3. bubble of run (a) over [first compute start, last compute end] = "
      f"{bw['window_s']:.1f} s: busy {', '.join(f'{x:.1f} s' for x in bw['busy_s'])}")
    p(f"bubble {100 * bw['bubble']:.1f}% vs GPipe (P-1)/(M+P-1) = {100 * bw['gpipe']:.1f}% "
      f"(M = {bw['m']} microbatches in the window): {bw['points_over_gpipe']:+.1f} points   "
      f"goal within 5: {met(g['bubble_points_over_gpipe'])}")
    p("idle per stage: " + "; ".join(
        f"stage {k} fill {x['fill_s']:.2f} s, between {x['between_s']:.2f} s, drain "
        f"{x['drain_s']:.2f} s" for k, x in enumerate(bw["idle"])))
    pre = o["bubble"].get("prefill_phase")
    if pre:
        p(f"prefill phase alone (first {pre['window_s']:.1f} s, {pre['m']} microbatches with "
          f"prompt tokens): bubble {100 * pre['bubble']:.1f}% vs GPipe {100 * pre['gpipe']:.1f}%: "
          f"{pre['points_over_gpipe']:+.1f} points; the decode tail after it: "
          f"{bw['window_s'] - pre['window_s']:.1f} s")

    h = o["hop_latency"]
    p(f"\n4. per-hop latency of decode microbatches (ms; {h['n_decode_microbatches']} "
      f"microbatches)")
    p(f"{'':<44} {'mean':>8} {'p50':>8} {'p99':>8}")
    rows = [(f"hop {k}: recv_start(k+1) - compute_end(k)", v) for k, v in h["hops"].items()]
    rows += [("coordinator sent -> stage 0 recv_start", h["coordinator_to_stage0"]),
             ("last compute_end -> coordinator delivered", h["last_stage_to_coordinator"]),
             ("waits in stage queues (sum)", h["queue_wait_sum"]),
             ("round trip (delivered - sent)", h["round_trip"]),
             ("  of which compute (sum)", h["compute_sum"]),
             ("round trip - sum compute", h["round_trip_minus_compute"])]
    for name, s in rows:
        if s:
            p(f"{name:<44} {ms(s['mean']):>8} {ms(s['p50']):>8} {ms(s['p99']):>8}")

    ac = o["activation"]
    p(f"\n5. activation hops of {a.prompt_len}-token microbatches "
      f"({ac['trace_a']['bytes']} bytes)")
    for label, t in (("(a)", ac["trace_a"]), ("(c), receiver idle", ac["trace_c_receiver_idle"])):
        r = t["rate_bytes_per_s"]
        if r:
            p(f"trace {label}: bytes / (recv_end(1) - compute_end(0)): median "
              f"{fmt_rate(r['p50'])}, best {fmt_rate(r['max'])} (n = {r['n']}); compute_end -> "
              f"first chunk {ms(t['lead_s']['p50'])} ms, chunks arriving "
              f"{ms(t['arrival_s']['p50'])} ms (medians)")
    p(f"raw TCP loopback, best of {ac['tcp_idle']['reps']}: idle cores "
      f"{fmt_rate(ac['tcp_idle']['best_bytes_per_s'])}; both cores busy "
      f"{fmt_rate(ac['tcp_busy_cores']['best_bytes_per_s'])}")
    if ac["ratio_best"] is not None:
        p(f"ratio trace (a) / TCP (idle): median {ac['ratio_median']:.3f}, best "
          f"{ac['ratio_best']:.3f}")
    p(f"\nwhole bench: {o['bench_seconds']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
