#!/usr/bin/env bash
# Quick start 1: install the dependencies, build, synthesise a demo model, serve it with a two-stage
# pipeline on loopback (`ppserve cluster`), and generate through the cluster's gRPC API.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
model=out/demo
if [ ! -f "$model/model.gguf" ]; then
    ./build/ppserve synth --out "$model" --shape demo --format both >/dev/null
fi
for daemon in ppserve-coordinator ppserve-stage; do
    if [ ! -x "build/$daemon" ]; then
        echo "demo: error: build/$daemon was not built (needs gRPC, protobuf-c, libconfig)" >&2
        exit 1
    fi
done

# the first port from 7000 on that nothing listens on
port=7000
while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    port=$((port + 1))
done
addr=127.0.0.1:$port

cluster_pid=
stop_cluster() {
    if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
        kill -TERM "$cluster_pid"
        wait "$cluster_pid" || true
    fi
    cluster_pid=
}
trap stop_cluster EXIT

echo "== ppserve cluster: a coordinator and 2 stages on $addr, serving $model/model.gguf =="
echo "   (a random-weight demo model: the text is noise)"
# its banner and table go to /dev/null (`ppserve status` shows them below); logs stay on stderr
./build/ppserve cluster --model "$model/model.gguf" --stages 2 --port "$port" >/dev/null &
cluster_pid=$!

# wait until it serves, giving up at once if the cluster exits (it says why on stderr)
./build/ppserve status --addr "$addr" --wait 120 >/dev/null &
waiter=$!
while kill -0 "$waiter" 2>/dev/null; do
    if ! kill -0 "$cluster_pid" 2>/dev/null; then
        kill "$waiter" 2>/dev/null || true
        echo "demo: error: the cluster stopped before serving (see its messages above)" >&2
        exit 1
    fi
    sleep 0.5
done
if ! wait "$waiter"; then
    ./build/ppserve status --addr "$addr" || true
    echo "demo: error: the cluster did not start serving within 120 s" >&2
    exit 1
fi

echo "== ppserve generate --addr $addr =="
./build/ppserve generate --addr "$addr" --prompt "Once upon a time" --max-tokens 32
# the table shows the stages' counters as of their last heartbeat (every second)
sleep 1.5
echo "== ppserve status --addr $addr =="
./build/ppserve status --addr "$addr"
echo "== stopping the cluster =="
kill -TERM "$cluster_pid"
wait "$cluster_pid"
cluster_pid=
