/* ppserve cluster: a whole pipeline on this machine for trying things out. Starts one
 * ppserve-coordinator and N ppserve-stage processes on loopback (each with --tp/--ep workers when
 * given: N stages x W-way tensor parallelism, on the devices --devices names: a GPU list is dealt
 * out W ids per stage in order), waits until the coordinator says "serving", shows
 * the status table, and supervises: Ctrl-C or SIGTERM stops them all (exit 0); a daemon that dies
 * on its own, or a pipeline the coordinator says cannot form (a stage refused its assignment),
 * stops the rest (exit 1). */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/args.h"
#include "client/commands.h"
#include "client/remote/cluster_proc.h"
#include "client/remote/remote.h"
#include "common/alloc.h"
#include "common/limits.h"
#include "common/log.h"
#include "kernels/devices.h"

#define STARTUP_TIMEOUT_S 120.0
#define STOP_GRACE_S 15.0
#define POLL_CALL_TIMEOUT_MS 2000

struct cluster_opts {
    const char *model;
    int32_t stages;
    struct pp_id_list layers;
    char layers_text[1024]; /* the same list for the coordinator's --layers; "" = planned */
    int32_t port;
    int32_t threads;
    int32_t tp;
    int32_t ep;
    int32_t kv_mb;
    int64_t memory_mb; /* each stage's share of the memory this process may use */
    int32_t max_batch_tokens;
    int32_t microbatches;
    const char *log_level;
    const char *devices;
    const char *cpu_weights;
    struct pp_device_spec want; /* --devices as parsed (check_opts) */
    int32_t workers;            /* per stage: tp, or ep alone, or 1 (check_opts) */
    struct pp_device_spec use;  /* the resolved devices: the CPU, or stages × workers GPUs */
    int help;
};

/* Where the model is, as the daemons want it: a root folder and a name inside it. */
struct model_path {
    char root[PATH_MAX];
    char name[PATH_MAX];
};

struct cluster {
    struct pp_child *kids; /* [0] the coordinator, [1 + i] stage i */
    int n;
    int stop_requested;
    struct pp_child *died; /* the first child that exited on its own */
};

static int split_model(const char *path, struct model_path *m)
{
    char real[PATH_MAX];
    if (!realpath(path, real)) {
        fprintf(stderr, "ppserve cluster: error: --model %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *slash = strrchr(real, '/');
    if (!slash || !slash[1]) {
        fprintf(stderr, "ppserve cluster: error: --model %s: expected a file or folder below a "
                "folder, got %s\n", path, real);
        return -1;
    }
    snprintf(m->name, sizeof(m->name), "%s", slash + 1);
    if (slash == real)
        snprintf(m->root, sizeof(m->root), "/");
    else
        snprintf(m->root, sizeof(m->root), "%.*s", (int)(slash - real), real);
    return 0;
}

/* A bind to the port tells whether something already listens there: the coordinator would fail,
 * and worse, waiting for the port would then find the other program. */
static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 1; /* cannot tell; the coordinator will say */
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

static int port_accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* Waits up to timeout_s for a signal, then takes every pending one. */
static void take_events(struct cluster *c, double timeout_s)
{
    for (int sig = pp_cluster_wait_event(timeout_s); sig != 0; sig = pp_cluster_wait_event(0))
        if (sig == SIGINT || sig == SIGTERM)
            c->stop_requested = 1;
}

/* Takes pending signals and exited children; 1 while nothing asks to stop. */
static int keep_going(void *ud)
{
    struct cluster *c = ud;
    take_events(c, 0);
    struct pp_child *d = pp_cluster_reap(c->kids, c->n);
    if (d && !c->died)
        c->died = d;
    return !c->stop_requested && !c->died;
}

static void report_death(const struct pp_child *d, const char *when)
{
    char how[128];
    pp_cluster_describe_exit(d->status, how, sizeof(how));
    fprintf(stderr, "ppserve cluster: error: %s (pid %d) %s%s; stopping the others\n", d->name,
            (int)d->pid, how, when);
}

/* Waits (up to the deadline) until the coordinator accepts connections, so the stages find it. */
static int wait_coordinator_port(struct cluster *c, int port, double deadline)
{
    while (keep_going(c)) {
        if (port_accepts(port))
            return 0;
        if (pp_clock_mono() >= deadline) {
            fprintf(stderr, "ppserve cluster: error: the coordinator did not listen on "
                    "127.0.0.1:%d within %.0f s\n", port, STARTUP_TIMEOUT_S);
            return -1;
        }
        take_events(c, 0.05);
    }
    return -1;
}

static int start_coordinator(struct cluster *c, const struct cluster_opts *o,
                             const struct model_path *m, const char *path, const sigset_t *mask)
{
    char listen[64], stages[16], mbt[16], mbs[16];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", o->port);
    snprintf(stages, sizeof(stages), "%d", o->stages);
    snprintf(mbt, sizeof(mbt), "%d", o->max_batch_tokens);
    snprintf(mbs, sizeof(mbs), "%d", o->microbatches);
    char *argv[24];
    int k = 0;
    argv[k++] = "ppserve-coordinator";
    argv[k++] = "--listen";
    argv[k++] = listen;
    /* where the last stage delivers results: the same loopback address, said explicitly */
    argv[k++] = "--advertise";
    argv[k++] = listen;
    argv[k++] = "--model";
    argv[k++] = (char *)m->name;
    argv[k++] = "--model_root";
    argv[k++] = (char *)m->root;
    argv[k++] = "--stages";
    argv[k++] = stages;
    if (o->layers_text[0]) {
        argv[k++] = "--layers";
        argv[k++] = (char *)o->layers_text;
    }
    if (o->max_batch_tokens > 0) {
        argv[k++] = "--max_batch_tokens";
        argv[k++] = mbt;
    }
    if (o->microbatches >= 0) {
        argv[k++] = "--microbatches";
        argv[k++] = mbs;
    }
    argv[k++] = "--log_level";
    argv[k++] = (char *)o->log_level;
    argv[k] = NULL;
    snprintf(c->kids[0].name, sizeof(c->kids[0].name), "ppserve-coordinator");
    return pp_cluster_spawn(&c->kids[0], path, argv, mask);
}

static int start_stage(struct cluster *c, int i, const struct cluster_opts *o,
                       const struct model_path *m, const char *path, const sigset_t *mask)
{
    char coord[64], threads[16], kv[16], mem[24], tp[16], ep[16],
        devices[PP_DEVICES_MAX * 4 + 8];
    snprintf(coord, sizeof(coord), "127.0.0.1:%d", o->port);
    snprintf(threads, sizeof(threads), "%d", o->threads);
    snprintf(kv, sizeof(kv), "%d", o->kv_mb);
    snprintf(mem, sizeof(mem), "%lld", (long long)o->memory_mb);
    snprintf(tp, sizeof(tp), "%d", o->tp);
    snprintf(ep, sizeof(ep), "%d", o->ep);
    char *argv[28];
    int k = 0;
    argv[k++] = "ppserve-stage";
    argv[k++] = "--coordinator";
    argv[k++] = coord;
    argv[k++] = "--listen";
    argv[k++] = "127.0.0.1:0";
    argv[k++] = "--model_root";
    argv[k++] = (char *)m->root;
    argv[k++] = "--threads";
    argv[k++] = threads;
    if (o->kv_mb > 0) {
        argv[k++] = "--kv_mb";
        argv[k++] = kv;
    }
    if (o->memory_mb > 0) { /* the stages share this host's memory: each offers its share */
        argv[k++] = "--memory_mb";
        argv[k++] = mem;
    }
    if (o->tp > 0) {
        argv[k++] = "--tp";
        argv[k++] = tp;
    }
    if (o->ep > 0) {
        argv[k++] = "--ep";
        argv[k++] = ep;
    }
    /* this stage's share of the devices: its W GPUs in order, or the CPU */
    struct pp_device_spec mine = {o->use.kind, 0, {0}};
    if (o->use.kind == PP_DEVICE_CUDA) {
        int w = o->workers;
        mine.n = w;
        memcpy(mine.ids, o->use.ids + i * w, (size_t)w * sizeof(int));
    }
    pp_device_spec_format(&mine, devices, sizeof(devices));
    argv[k++] = "--devices";
    argv[k++] = devices;
    argv[k++] = "--cpu_weights";
    argv[k++] = (char *)o->cpu_weights;
    argv[k++] = "--log_level";
    argv[k++] = (char *)o->log_level;
    argv[k] = NULL;
    struct pp_child *kid = &c->kids[1 + i];
    snprintf(kid->name, sizeof(kid->name), "ppserve-stage #%d", i);
    return pp_cluster_spawn(kid, path, argv, mask);
}

/* Polls Status until serving; prints the banner and the table. 0 when serving. */
static int wait_serving(struct cluster *c, const struct cluster_opts *o,
                        const struct model_path *m, double deadline)
{
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", o->port);
    Ppserve__V1__StatusResponse *s = NULL;
    struct pp_remote_wait why;
    double left = deadline - pp_clock_mono();
    pp_rpc_init();
    pp_status st = pp_remote_wait_serving(addr, left > 0 ? left : 0, POLL_CALL_TIMEOUT_MS,
                                          keep_going, c, 1, &s, &why);
    if (st == PP_OK) {
        printf("ppserve cluster: serving %s on %s with %d stages\n", m->name, addr, o->stages);
        pp_remote_status_print(stdout, s);
        fflush(stdout);
        protobuf_c_message_free_unpacked(&s->base, NULL);
    } else if (why.blocked) { /* every stage runs with the same flags: nothing will change */
        fprintf(stderr, "ppserve cluster: error: the pipeline cannot form: %s\n", why.reason);
    } else if (!why.stopped) { /* (when stopped, the caller says why) */
        fprintf(stderr, "ppserve cluster: error: not serving after %.0f s: %s\n", STARTUP_TIMEOUT_S,
                why.reason);
    }
    pp_rpc_shutdown();
    return st == PP_OK ? 0 : -1;
}

/* Until a signal asks to stop or a child dies. */
static void supervise(struct cluster *c)
{
    fprintf(stderr, "ppserve cluster: Ctrl-C (or SIGTERM) stops the cluster\n");
    while (keep_going(c))
        take_events(c, 1.0);
}

static int run_cluster(const struct cluster_opts *o, const struct model_path *m,
                       const char *coord_path, const char *stage_path)
{
    struct cluster c = {0};
    c.n = 1 + o->stages;
    c.kids = pp_calloc(PP_MEM_MISC, (size_t)c.n, sizeof(*c.kids));
    if (!c.kids) {
        fprintf(stderr, "ppserve cluster: error: out of memory\n");
        return 1;
    }
    sigset_t old;
    pp_cluster_signals_block(&old);
    double deadline = pp_clock_mono() + STARTUP_TIMEOUT_S;
    int serving = 0, ok = start_coordinator(&c, o, m, coord_path, &old) == 0 &&
                          wait_coordinator_port(&c, o->port, deadline) == 0;
    for (int i = 0; ok && i < o->stages; i++)
        ok = start_stage(&c, i, o, m, stage_path, &old) == 0;
    if (ok && wait_serving(&c, o, m, deadline) == 0) {
        serving = 1;
        supervise(&c);
    }
    /* a stop asked for is a clean exit, whatever the children did meanwhile */
    int rc = c.stop_requested ? 0 : 1;
    if (c.died && !c.stop_requested)
        report_death(c.died, serving ? "" : " while the cluster was starting");
    pp_cluster_stop(c.kids, c.n, STOP_GRACE_S);
    if (rc == 0)
        fprintf(stderr, "ppserve cluster: stopped\n");
    pp_free(PP_MEM_MISC, c.kids);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

static int check_opts(struct cluster_opts *o)
{
    if (!o->model) {
        fprintf(stderr, "ppserve cluster: --model is required\n");
        return 2;
    }
    if (o->tp > 0 && o->ep > 0 && o->tp % o->ep != 0) {
        fprintf(stderr, "ppserve cluster: --ep: expected a divisor of --tp (%d), got %d\n", o->tp,
                o->ep);
        return 2;
    }
    if (o->layers.ids) {
        if (o->layers.n != o->stages) {
            fprintf(stderr, "ppserve cluster: --layers: expected one count per stage (%d), "
                    "got %d\n", o->stages, o->layers.n);
            return 2;
        }
        for (int i = 0; i < o->layers.n; i++)
            if (o->layers.ids[i] < 1) {
                fprintf(stderr, "ppserve cluster: --layers: every stage needs a layer\n");
                return 2;
            }
        size_t len = 0;
        for (int i = 0; i < o->layers.n; i++)
            len += (size_t)snprintf(o->layers_text + len, sizeof(o->layers_text) - len, "%s%d",
                                    i ? "," : "", o->layers.ids[i]);
    }
    if (pp_device_spec_parse(o->devices, &o->want) != PP_OK) {
        fprintf(stderr, "ppserve cluster: --devices: %s\n", pp_error_detail());
        return 2;
    }
    int map;
    if (pp_cpu_weights_parse(o->cpu_weights, &map) != PP_OK) {
        fprintf(stderr, "ppserve cluster: --cpu-weights: %s\n", pp_error_detail());
        return 2;
    }
    o->workers = o->tp > 0 ? o->tp : o->ep > 0 ? o->ep : 1;
    if (o->want.kind == PP_DEVICE_CUDA && o->want.n != o->stages * o->workers) {
        fprintf(stderr, "ppserve cluster: --devices: expected %d GPU ids (%d stages x %d workers, "
                "dealt out in order), got %d\n", o->stages * o->workers, o->stages, o->workers,
                o->want.n);
        return 2;
    }
    int level = pp_log_level_parse(o->log_level);
    if (level < 0 || level > PP_LOG_ERROR) {
        fprintf(stderr, "ppserve cluster: --log-level: expected debug, info, warn or error, got "
                "'%s'\n", o->log_level);
        return 2;
    }
    return 0;
}

int pp_cmd_cluster(int argc, char **argv)
{
    struct cluster_opts o = {0};
    o.stages = 2;
    o.port = 7000;
    o.microbatches = -1;
    o.log_level = "warn";
    o.devices = "auto";
    o.cpu_weights = "copy";
    struct pp_cpus cpus;
    pp_cpus_read(&cpus);
    struct pp_arg args[] = {
        {"model", PP_ARG_STRING, &o.model, 0, 0, "GGUF file or HF checkpoint directory (required)"},
        {"stages", PP_ARG_INT, &o.stages, 1, 64, "stage processes (default 2)"},
        {"layers", PP_ARG_IDS, &o.layers, 0, 0, "layers per stage, e.g. 2,3,3 (default: planned)"},
        {"port", PP_ARG_INT, &o.port, 1, 65535,
         "the coordinator's port on 127.0.0.1 (default 7000)"},
        {"threads", PP_ARG_INT, &o.threads, 1, 1024,
         "compute threads per stage, shared by its tp workers (default: usable CPUs / stages)"},
        {"tp", PP_ARG_INT, &o.tp, 1, 64,
         "tensor-parallel workers per stage, stages x tp in all (default 1; --ep alone sets it)"},
        {"ep", PP_ARG_INT, &o.ep, 1, 64,
         "expert groups among each stage's workers (MoE models; divides tp)"},
        {"kv-mb", PP_ARG_INT, &o.kv_mb, 1, 1 << 24,
         "KV cache per stage in MiB (default: the stage's)"},
        {"max-batch-tokens", PP_ARG_INT, &o.max_batch_tokens, 1, 1 << 16,
         "token budget of one microbatch (default: the coordinator's)"},
        {"microbatches", PP_ARG_INT, &o.microbatches, 0, 256,
         "microbatches in flight (default: the coordinator's)"},
        {"log-level", PP_ARG_STRING, &o.log_level, 0, 0,
         "the daemons' debug|info|warn|error (default warn)"},
        {"devices", PP_ARG_STRING, &o.devices, 0, 0,
         "auto | cpu | cuda:N[,N...] (stages x tp GPU ids, dealt out in order; default auto)"},
        {"cpu-weights", PP_ARG_STRING, &o.cpu_weights, 0, 0,
         "copy | map: stages on the CPU copy weights into huge-page memory (default) or compute "
         "from the mapped model file"},
        {"help", PP_ARG_FLAG, &o.help, 0, 0, "show this help"},
    };
    int n = (int)(sizeof(args) / sizeof(args[0]));
    int rc = pp_args_parse("cluster", args, n, argc, argv, NULL);
    if (rc == 0 && !o.help)
        rc = check_opts(&o);
    if (rc != 0 || o.help) {
        if (o.help)
            pp_args_usage("cluster", "--model PATH [--stages P] [--tp W] [--port N] [flags]", args,
                          n);
        pp_id_list_free(&o.layers);
        return rc;
    }
    struct pp_memory memory;
    pp_memory_read(&memory);
    o.memory_mb = (int64_t)(memory.usable / (uint64_t)o.stages >> 20);
    if (!pp_args_seen(args, n, "threads"))
        o.threads = cpus.usable / o.stages > 1 ? cpus.usable / o.stages : 1;
    /* what --devices means here, once for all the stages: "auto" takes GPUs only when there are
     * enough for every stage's workers; an explicit list that cannot be used stops here */
    char note[512];
    pp_status st = pp_devices_resolve(&o.want, o.stages * o.workers, &o.use, note, sizeof(note));
    if (st != PP_OK) {
        rc = pp_cli_fail("cluster", st);
        pp_id_list_free(&o.layers);
        return rc;
    }
    if (note[0])
        PP_INFO("devices=cpu requested=%s reason=\"no GPU is used: %s\"", o.devices, note);
    char warn[1024];
    pp_cpus_threads(&cpus, o.stages * o.threads, warn, sizeof(warn));
    if (o.use.kind == PP_DEVICE_CPU && warn[0]) /* more stages than CPUs, or --threads */
        PP_WARN("%d stages, %d thread%s each: %s", o.stages, o.threads, o.threads == 1 ? "" : "s",
                warn);
    struct model_path m;
    char coord_path[PATH_MAX], stage_path[PATH_MAX];
    rc = 1;
    if (split_model(o.model, &m) != 0 ||
        pp_cluster_find_daemon("ppserve-coordinator", coord_path, sizeof(coord_path)) != 0 ||
        pp_cluster_find_daemon("ppserve-stage", stage_path, sizeof(stage_path)) != 0)
        goto done;
    if (!port_free(o.port)) {
        fprintf(stderr, "ppserve cluster: error: 127.0.0.1:%d is already in use (pick another "
                "--port)\n", o.port);
        goto done;
    }
    rc = run_cluster(&o, &m, coord_path, stage_path);
done:
    pp_id_list_free(&o.layers);
    return rc;
}
