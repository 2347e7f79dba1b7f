/* pp_bench_hop: one pipeline hop's activation transfer, through the stages' own code, against a
 * raw loopback TCP copy of the same bytes between the same two processes, measured in one run.
 *
 *   pp_bench_hop [--rows 512] [--dim 2048] [--rounds 40] [--cpus A,B] [--malloc keep|default]
 *                [--json PATH]
 *
 * The process starts a copy of itself as the receiver (pinned to core B, the sender to core A when
 * --cpus is given). A hop round: the sender encodes one f32 microbatch [rows, dim] into HopMessage
 * chunks (pp_hop_encode, packed straight into gRPC's buffers), queues them on a gRPC stream, and
 * waits for the receiver's one-byte answer, which it sends once it has unpacked every chunk and
 * reassembled the microbatch (pp_hop_assembler_push). A TCP round: the same bytes written to a
 * plain loopback socket, read whole by the receiver, answered with one byte. Rounds alternate; the
 * figures are the medians and the best, and their ratio (hop / TCP) is what to compare across
 * machines. Both processes keep large buffers in the C library's heap as ppserve-stage does
 * (pp_alloc_keep_large_buffers), unless --malloc default. Not run by ctest. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/alloc.h"
#include "common/json_write.h"
#include "common/rpc/hop.h"
#include "common/rpc/rpc.h"

#define METHOD "/ppserve.bench.Hop/Forward"

extern char **environ;

static void die(const char *what)
{
    fprintf(stderr, "pp_bench_hop: %s: %s\n", what, pp_error_detail()[0] ? pp_error_detail() : "");
    exit(1);
}

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        perror("pp_bench_hop: sched_setaffinity");
}

static int full_io(int fd, void *buf, size_t n, int writing)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = writing ? write(fd, (char *)buf + done, n - done)
                            : read(fd, (char *)buf + done, n - done);
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    return 0;
}

/* ---- the receiver ---------------------------------------------------------------------------- */

static struct pp_hop_assembler assembler; /* one stream at a time: the sender's */
static int stream_ud;

static void *recv_open(void *ud, struct pp_rpc_stream *st)
{
    (void)ud;
    (void)st;
    return &stream_ud;
}

static void recv_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)ud;
    ProtobufCMessage *m = NULL;
    int done = 0;
    if (pp_rpc_unpack(&ppserve__v1__hop_message__descriptor, data, len, &m) != PP_OK ||
        ((Ppserve__V1__HopMessage *)m)->body_case != PPSERVE__V1__HOP_MESSAGE__BODY_CHUNK ||
        pp_hop_assembler_push(&assembler, ((Ppserve__V1__HopMessage *)m)->chunk, &done) != PP_OK)
        die("receiver: a bad chunk");
    protobuf_c_message_free_unpacked(m, NULL);
    if (!done)
        return;
    /* as a stage does: the microbatch takes the payload, then lets it go after computing */
    struct pp_buf payload = assembler.payload;
    memset(&assembler.payload, 0, sizeof(assembler.payload));
    pp_hop_assembler_reset(&assembler);
    pp_buf_free(&payload);
    pp_rpc_stream_send(st, "k", 1);
}

static void recv_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)ud;
    (void)status;
    pp_rpc_stream_release(st);
}

static int serve(size_t bytes, int dim, int cpu, int keep)
{
    pin(cpu);
    if (keep)
        pp_alloc_keep_large_buffers(); /* as ppserve-stage does */
    pp_rpc_init();
    pp_hop_assembler_init(&assembler, bytes + 1, dim);
    static const struct pp_rpc_stream_cbs cbs = {recv_message, NULL, recv_end};
    struct pp_rpc_server_opts o = {"127.0.0.1:0", 2, 0};
    struct pp_rpc_server *srv;
    int rpc_port = 0;
    if (pp_rpc_server_new(&o, &srv) != PP_OK ||
        pp_rpc_server_add_stream(srv, METHOD, recv_open, &cbs, NULL) != PP_OK ||
        pp_rpc_server_start(srv, &rpc_port) != PP_OK)
        die("receiver: the gRPC server");
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
        die("receiver: the TCP socket");
    printf("%d %d\n", rpc_port, ntohs(a.sin_port));
    fflush(stdout);
    int fd = accept(lfd, NULL, NULL);
    char *buf = malloc(bytes);
    if (fd < 0 || !buf)
        die("receiver: accept");
    /* TCP rounds until the sender closes; the gRPC rounds run on the server's threads meanwhile */
    while (full_io(fd, buf, bytes, 0) == 0 && full_io(fd, "k", 1, 1) == 0)
        ;
    free(buf);
    close(fd);
    close(lfd);
    pp_rpc_server_free(srv, 1000);
    return 0;
}

/* ---- the sender ------------------------------------------------------------------------------ */

static pthread_mutex_t ack_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ack_cv = PTHREAD_COND_INITIALIZER;
static int acks;

static void ack_message(void *ud, struct pp_rpc_stream *st, const uint8_t *data, size_t len)
{
    (void)ud;
    (void)st;
    (void)data;
    (void)len;
    pthread_mutex_lock(&ack_mu);
    acks++;
    pthread_cond_broadcast(&ack_cv);
    pthread_mutex_unlock(&ack_mu);
}

static void ack_end(void *ud, struct pp_rpc_stream *st, pp_status status)
{
    (void)ud;
    (void)st;
    (void)status;
}

static pp_status emit(void *ud, const ProtobufCMessage *msg)
{
    return pp_rpc_stream_send_packed(ud, msg);
}

static double hop_round(struct pp_rpc_stream *st, const float *act, int rows, int dim, int round)
{
    Ppserve__V1__SeqPart part = PPSERVE__V1__SEQ_PART__INIT, *parts = &part;
    part.seq_id = 1;
    part.n_tokens = rows;
    int64_t shape[2] = {rows, dim};
    Ppserve__V1__MicrobatchHeader h = PPSERVE__V1__MICROBATCH_HEADER__INIT;
    h.microbatch_id = (uint64_t)round + 1;
    h.n_parts = 1;
    h.parts = &parts;
    h.dtype = PPSERVE__V1__DTYPE__DTYPE_F32;
    h.n_shape = 2;
    h.shape = shape;
    double t0 = pp_bench_now();
    if (pp_hop_encode(&h, act, (size_t)rows * (size_t)dim * sizeof(float), emit, st) != PP_OK)
        die("sender: encode");
    pthread_mutex_lock(&ack_mu);
    while (acks <= round)
        pthread_cond_wait(&ack_cv, &ack_mu);
    pthread_mutex_unlock(&ack_mu);
    return pp_bench_now() - t0;
}

static double tcp_round(int fd, const void *act, size_t bytes)
{
    char k;
    double t0 = pp_bench_now();
    if (full_io(fd, (void *)act, bytes, 1) != 0 || full_io(fd, &k, 1, 0) != 0)
        die("sender: the TCP copy");
    return pp_bench_now() - t0;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), pp_bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct opts {
    int rows, dim, rounds, cpu_send, cpu_recv;
    int keep; /* pp_alloc_keep_large_buffers in both processes (--malloc keep, the default) */
    const char *json;
};

static void report(const struct opts *o, double *hop, double *tcp, int n)
{
    size_t bytes = (size_t)o->rows * (size_t)o->dim * 4;
    double hop_med = median(hop, n), tcp_med = median(tcp, n);
    double hop_best = hop[0], tcp_best = tcp[0];
    printf("pp_bench_hop: one microbatch [%d, %d] f32 = %zu bytes, %d rounds each, alternating; "
           "malloc %s\n",
           o->rows, o->dim, bytes, n, o->keep ? "keep (as ppserve-stage)" : "default");
    printf("  hop (encode, gRPC stream, unpack, reassemble, answer): median %.3f ms = %.2f GB/s, "
           "best %.3f ms = %.2f GB/s\n",
           hop_med * 1e3, bytes / hop_med / 1e9, hop_best * 1e3, bytes / hop_best / 1e9);
    printf("  raw loopback TCP (write, read whole, answer):          median %.3f ms = %.2f GB/s, "
           "best %.3f ms = %.2f GB/s\n",
           tcp_med * 1e3, bytes / tcp_med / 1e9, tcp_best * 1e3, bytes / tcp_best / 1e9);
    printf("  hop / TCP throughput: median %.3f, best %.3f\n", tcp_med / hop_med,
           tcp_best / hop_best);
    if (!o->json)
        return;
    struct pp_json j;
    pp_json_init(&j);
    pp_json_begin_object(&j);
    pp_json_key(&j, "bytes");
    pp_json_int(&j, (int64_t)bytes);
    pp_json_key(&j, "rounds");
    pp_json_int(&j, n);
    pp_json_key(&j, "cpus");
    pp_json_begin_array(&j);
    pp_json_int(&j, o->cpu_send);
    pp_json_int(&j, o->cpu_recv);
    pp_json_end_array(&j);
    pp_json_key(&j, "hop_median_s");
    pp_json_double(&j, hop_med);
    pp_json_key(&j, "hop_best_s");
    pp_json_double(&j, hop_best);
    pp_json_key(&j, "tcp_median_s");
    pp_json_double(&j, tcp_med);
    pp_json_key(&j, "tcp_best_s");
    pp_json_double(&j, tcp_best);
    pp_json_key(&j, "hop_over_tcp_median");
    pp_json_double(&j, tcp_med / hop_med);
    pp_json_key(&j, "hop_over_tcp_best");
    pp_json_double(&j, tcp_best / hop_best);
    pp_json_key(&j, "malloc");
    pp_json_cstring(&j, o->keep ? "keep" : "default");
    pp_json_key(&j, "loadavg");
    pp_json_double(&j, pp_bench_loadavg());
    pp_json_end_object(&j);
    pp_bench_write_json(o->json, "pp_bench_hop", &j);
    pp_json_free(&j);
}

static int send_side(const struct opts *o, const char *self)
{
    size_t bytes = (size_t)o->rows * (size_t)o->dim * 4;
    char rows[16], dim[16], cpu[16], keep[4];
    snprintf(rows, sizeof(rows), "%d", o->rows);
    snprintf(dim, sizeof(dim), "%d", o->dim);
    snprintf(cpu, sizeof(cpu), "%d", o->cpu_recv);
    snprintf(keep, sizeof(keep), "%d", o->keep);
    int out[2];
    if (pipe(out) != 0)
        die("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char *argv[] = {(char *)self, "--serve", rows, dim, cpu, keep, NULL};
    pid_t pid;
    if (posix_spawn(&pid, self, &fa, NULL, argv, environ) != 0)
        die("cannot start the receiver");
    close(out[1]);
    pin(o->cpu_send);
    if (o->keep)
        pp_alloc_keep_large_buffers();
    FILE *rf = fdopen(out[0], "r");
    int rpc_port, tcp_port;
    if (!rf || fscanf(rf, "%d %d", &rpc_port, &tcp_port) != 2)
        die("the receiver did not start");

    pp_rpc_init();
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", rpc_port);
    static const struct pp_rpc_stream_cbs cbs = {ack_message, NULL, ack_end};
    struct pp_rpc_channel *ch;
    struct pp_rpc_stream *st;
    if (pp_rpc_channel_new(target, &ch) != PP_OK ||
        pp_rpc_stream_open(ch, METHOD, 0, &cbs, NULL, &st) != PP_OK)
        die("sender: the gRPC stream");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)tcp_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
        die("sender: the TCP socket");

    float *act = malloc(bytes);
    double *hop = malloc(sizeof(double) * (size_t)o->rounds);
    double *tcp = malloc(sizeof(double) * (size_t)o->rounds);
    if (!act || !hop || !tcp)
        die("no memory");
    for (size_t i = 0; i < bytes / 4; i++)
        act[i] = (float)i * 0.25f;
    int warm = 3, n = 0;
    for (int r = 0; r < warm + o->rounds; r++) {
        double th = hop_round(st, act, o->rows, o->dim, r);
        double tt = tcp_round(fd, act, bytes);
        if (r >= warm) {
            hop[n] = th;
            tcp[n++] = tt;
        }
    }
    report(o, hop, tcp, n);
    close(fd);
    pp_rpc_stream_close_send(st);
    int status;
    waitpid(pid, &status, 0);
    pp_rpc_stream_release(st);
    free(act);
    free(hop);
    free(tcp);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--serve") == 0) {
        int rows = atoi(argv[2]), dim = atoi(argv[3]);
        return serve((size_t)rows * (size_t)dim * 4, dim, atoi(argv[4]), atoi(argv[5]));
    }
    struct opts o = {512, 2048, 40, -1, -1, 1, NULL};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--rows") && v)
            o.rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && v)
            o.dim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && v)
            o.rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpus") && v &&
                 sscanf(argv[++i], "%d,%d", &o.cpu_send, &o.cpu_recv) == 2)
            ;
        else if (!strcmp(argv[i], "--malloc") && v && (!strcmp(v, "keep") || !strcmp(v, "default")))
            o.keep = !strcmp(argv[++i], "keep");
        else if (!strcmp(argv[i], "--json") && v)
            o.json = argv[++i];
        else {
            fprintf(stderr,
                    "usage: pp_bench_hop [--rows N] [--dim N] [--rounds N] [--cpus A,B] "
                    "[--malloc keep|default] [--json PATH]\n(got '%s')\n",
                    argv[i]);
            return 2;
        }
    }
    if (o.rows < 1 || o.dim < 1 || o.rounds < 1 ||
        (size_t)o.rows * (size_t)o.dim * 4 > (64u << 20)) {
        fprintf(stderr,
                "pp_bench_hop: expected rows, dim, rounds >= 1 and rows × dim × 4 <= 64 "
                "MiB; got rows %d, dim %d, rounds %d\n",
                o.rows, o.dim, o.rounds);
        return 2;
    }
    char self[4096];
    ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (k <= 0)
        die("cannot find this program's path");
    self[k] = '\0';
    return send_side(&o, self);
}
