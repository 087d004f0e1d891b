// tsnet-bench: one measurement of the loopback benchmark, printed as one JSON line on stdout.
//
//   tsnet-bench tsnet-lat|tsnet-bw|tcp-lat|tcp-bw --size BYTES [--duration S] [--warmup S]
//               [--streams N] [--inflight K] [--version V] [--lib PATH] [--dev D]
//               [--timeout S] [--spin] [--verbose] [--mem host|cuda] [--curve N] [--rounds R]
//               [--gap-us US]
//
// Every mode runs two processes, A and B, forked by a coordinator that never loads the plugin
// (a process whose plugin has started its Node thread cannot fork a child that uses it). A and
// B talk over a pipe channel for set-up and stop signals only; the traffic itself goes through
// the plugin (tsnet-*) or plain TCP sockets over 127.0.0.1 with TCP_NODELAY (tcp-*).
//
//   *-lat  ping-pong, A -> B -> A, one message of --size each way; one-way latency = RTT / 2.
//          tsnet: both sides keep their next irecv posted before they send, as NCCL's proxy
//          does, and poll test(). tcp: one socket, blocking send/recv. A reports.
//   *-bw   A streams messages of --size to B. tsnet: over --pairs comm pairs (1), up to
//          --inflight (8) isends and irecvs in flight per comm, refilled as test() reports them
//          done; bytes/s and messages/s of the receives completed in the measured window, and
//          the CPU that each side's protocol threads (tsnet-plugin, tsnet-proto*) and I/O
//          threads (tsnet-io*) used per message in that window (/proc/self/task/*/schedstat). tcp: --streams sockets, one sending and one receiving
//          thread each; every message is cut into stripes the way tsnet's schedule cuts it
//          (max(128 KiB, size/N) rounded up to 4 KiB, round-robin over the streams, starting
//          where the previous message ended), each stream carries its stripes back to back.
//          B reports.
//
// --mem cuda (tsnet-bw only): both sides' buffers are CUDA memory on GPU 0, registered as
// NCCL_PTR_CUDA (the plugin must offer it: libfabric with FI_HMEM), and B calls iflush after
// every receive and waits for it, as NCCL's proxy does with GPUDirect; the data are not read.
//
// --curve N (tsnet-lat only): no warm-up; exactly N round trips from the comms' first message,
// and the line adds curve_us, the median one-way latency of round trips 1, 2-10, 11-100,
// 101-300, 301-1000, 1001-2000, 2001-5000, then by 5000 up to N: how long the plugin takes to
// reach its steady latency (V8 compiling the hot path, first-touch costs). The other figures
// then cover all N.
//
// --gap-us US (tsnet-lat, tcp-lat): A sleeps US µs before each round trip but the first, so
// that every ping finds the peer's threads idle, as a training job's collective after its
// compute does: the latency after an idle gap. The sleeps are not in the figures.
//
// --rounds R (tsnet-lat only, 1 .. 20): the comms are closed and new ones opened R - 1 more
// times in the same two processes, each round measured like the first, and the line adds
// rounds_us, every round's curve (with --curve) or its buckets over the measured window. A
// slow start that comes back in every round belongs to the comm; one that only the first
// round shows belongs to the process (V8 compiling the code).
//
// Warm-up (--warmup seconds, and a few messages) is not counted. Every wait has a deadline
// (--timeout); on failure the process prints why on stderr and the bench exits non-zero.
// tsnet lines also carry setup_s {init, connect}: the reporting process's seconds to load and
// init the plugin, and from its first listen until all its comms were up. At its exit each
// process removes any libfabric shm region of its own left in /dev/shm, saying so on stderr
// (the coordinator does it for a process killed by a signal).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

// ---------------------------------------------------------------- options and reporting

typedef enum { M_TSNET_LAT, M_TSNET_BW, M_TCP_LAT, M_TCP_BW } Mode;
static const char* const k_mode_names[] = {"tsnet-lat", "tsnet-bw", "tcp-lat", "tcp-bw"};

typedef struct Opts {
  Mode mode;
  size_t size;      // bytes per message
  double duration;  // measured seconds
  double warmup;    // seconds not counted
  int streams;      // tcp-bw sockets
  int inflight;     // tsnet-bw requests in flight per comm and side
  int pairs;        // tsnet-bw comm pairs
  int version;      // plugin table version
  const char* lib;  // plugin path
  int dev;          // plugin device
  double timeout;   // seconds any one wait may take
  int spin;         // poll test() without giving the CPU away
  int idle_us;      // when a poll finds nothing: sleep this long (0: sched_yield)
  int gap_us;       // *-lat: A sleeps this long between round trips (latency after an idle gap)
  int verbose;      // plugin INFO lines on stderr
  int cuda;         // --mem cuda: tsnet-bw buffers in GPU memory, registered as NCCL_PTR_CUDA
  long curve;       // --curve N: tsnet-lat measures round trips 1..N, no warm-up, and reports their curve
  int rounds;       // --rounds R: tsnet-lat opens and closes its comms R times in the same processes
} Opts;

static Opts g_o = {.duration = 1.0, .warmup = 0.2, .streams = 1, .inflight = 8, .pairs = 1, .rounds = 1, .version = 12,
                   .lib = "build/libnccl-net-tsnet.so", .timeout = 30.0};
static const char* g_role = "coordinator";
static double g_init_s = -1, g_connect_s = -1;  // tsnet: load + init, and listen until every comm is up
static int shm_sweep(pid_t pid, const char* who);

#define MIN_STRIPE 131072  // tsnet's TSNET_MIN_STRIPE default
#define STRIPE_ALIGN 4096
#define MAX_INFLIGHT 32
#define MAX_STREAMS 64
#define MAX_PAIRS 16  // per-comm counts travel in one channel message (16 x 8 bytes)
#define RECV_POOL_BYTES (256u << 20)  // receive buffers per side, at most (at least one message)
#define COMM_ID 0x74736e6562656e63ULL

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tsnet-bench %s [%s]: %s\n", k_mode_names[g_o.mode], g_role, msg);
  if (strcmp(g_role, "coordinator") != 0) shm_sweep(getpid(), g_role);
  fflush(stderr);
  _exit(1);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// libfabric's shm provider keeps a region per endpoint in /dev/shm named "<pid>:<uid>:<index>"
// and unlinks it when the endpoint is closed; the plugin closes its endpoints at the last
// finalize. A process that still has one at its exit (an older table, a failure before
// finalize, a process killed by a signal) would leave 16 MiB behind per region, and a later
// process with the same pid would fail fi_enable with EBUSY. Removes pid's regions, saying so
// on stderr (the benchmark counts the "left behind" lines); returns how many. A role's own
// sweep tells apart the regions an earlier process with its pid left before it loaded the
// plugin (test/driver/shim.h): those are not tsnet's.
static ShimStale g_stale;

typedef struct {
  const char* who;
  int own;  // pid is this process's: g_stale applies
} Sweep;

static void sweep_one(const char* path, void* arg) {
  const Sweep* w = arg;
  int stale = w->own && shim_stale_has(&g_stale, path);
  if (unlink(path) != 0) return;
  if (stale)
    fprintf(stderr, "tsnet-bench %s [%s]: libfabric's shm region %s was there before this process loaded tsnet (an earlier process with pid %d left it); removed it\n",
            k_mode_names[g_o.mode], w->who, path, (int)getpid());
  else
    fprintf(stderr, "tsnet-bench %s [%s]: libfabric's shm region %s was left behind; removed it\n", k_mode_names[g_o.mode], w->who,
            path);
}

static int shm_sweep(pid_t pid, const char* who) {
  Sweep w = {who, pid == getpid()};
  return shim_shm_regions((int)pid, 0, sweep_one, &w);
}

// CPU nanoseconds used so far by this process's threads whose name starts with prefix.
static void add_cpu_ns(const char* name, const char* dir, void* total) {
  (void)name;
  char path[340];
  snprintf(path, sizeof path, "%s/schedstat", dir);
  FILE* f = fopen(path, "r");
  unsigned long long ns = 0;
  if (f && fscanf(f, "%llu", &ns) == 1) *(uint64_t*)total += ns;
  if (f) fclose(f);
}

static uint64_t threads_cpu_ns(const char* prefix) {
  uint64_t total = 0;
  shim_threads(prefix, add_cpu_ns, &total);
  return total;
}

typedef struct Cpu {
  uint64_t proto, io;  // ns
} Cpu;

static Cpu cpu_now(void) {
  Cpu c = {threads_cpu_ns("tsnet-plugin") + threads_cpu_ns("tsnet-proto"), threads_cpu_ns("tsnet-io")};
  return c;
}

// Called when a poll of test() found nothing new: NCCL's proxy yields its CPU there.
static void idle(void) {
  if (g_o.spin) return;
  if (g_o.idle_us > 0) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)g_o.idle_us * 1000};
    nanosleep(&ts, NULL);
  } else {
    sched_yield();
  }
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (!g_o.verbose && level != TSN_LOG_WARN && level != TSN_LOG_ABORT) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  // WARN lines say so: the benchmark keeps them with the measurement (bench/run.ts).
  fprintf(stderr, "[%s %d] %s%s\n", g_role, (int)getpid(), level == TSN_LOG_WARN ? "WARN " : level == TSN_LOG_ABORT ? "ABORT " : "", msg);
}

// --mem cuda: GPU 0's memory, through the CUDA driver opened at run time (test/driver/shim.c).
static void* alloc_gpu(size_t size) {
  static ShimCuda cu;
  static int opened;
  char why[160];
  if (!opened && shim_cuda_open(&cu, why, sizeof why) != 0) die("--mem cuda: %s", why);
  opened = 1;
  ShimCuPtr d = 0;
  ShimCuRes rc = cu.memAlloc(&d, size ? size : 1);
  if (!rc) rc = cu.memsetD8(d, 0x5a, size);
  if (rc) die("--mem cuda: cuMemAlloc of %zu bytes failed (CUresult %d)", size, rc);
  return (void*)(uintptr_t)d;
}

static void* alloc_buf(size_t size) {
  if (g_o.cuda) return alloc_gpu(size);
  void* p = NULL;
  if (posix_memalign(&p, 4096, size ? size : 1) != 0) die("posix_memalign of %zu bytes failed", size);
  memset(p, 0x5a, size);  // touch every page before measuring
  return p;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// Nearest-rank quantile of sorted v[n].
static double quantile(const double* v, size_t n, double q) {
  size_t k = (size_t)(q * (double)n + 0.999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return v[k - 1];
}

// Latency samples (one-way microseconds per iteration) -> the JSON line.
// streams: the sockets of a tcp-* mode; 0 for tsnet (its own TSNET_NSOCKS), printed as null.
static void streams_json(char* out, size_t len, int streams) {
  if (streams > 0) snprintf(out, len, "%d", streams);
  else snprintf(out, len, "null");
}

// tsnet: ,"setup_s":{"init":...,"connect":...} of the reporting process; "" for plain TCP.
static void setup_json(char* out, size_t len) {
  if (g_init_s >= 0 && g_connect_s >= 0)
    snprintf(out, len, ",\"setup_s\":{\"init\":%.4f,\"connect\":%.4f}", g_init_s, g_connect_s);
  else
    out[0] = 0;
}

// The medians of the curve's buckets (--curve), from us in the order measured, as a JSON array.
static void curve_array(char* out, size_t cap, const double* us, size_t n) {
  static const size_t ends[] = {1, 10, 100, 300, 1000, 2000, 5000};
  size_t used = (size_t)snprintf(out, cap, "[");
  double* part = malloc(n * sizeof *part);
  if (!part) die("out of memory");
  for (size_t from = 0, k = 0; from < n && used < cap; k++) {
    size_t to = k < sizeof ends / sizeof ends[0] ? ends[k] : ends[sizeof ends / sizeof ends[0] - 1] + 5000 * (k + 1 - sizeof ends / sizeof ends[0]);
    if (to > n) to = n;
    memcpy(part, us + from, (to - from) * sizeof *part);
    qsort(part, to - from, sizeof *part, cmp_double);
    used += (size_t)snprintf(out + used, cap - used, "%s{\"from\":%zu,\"to\":%zu,\"median\":%.3f}", from ? "," : "", from + 1, to,
                             quantile(part, to - from, 0.5));
    from = to;
  }
  if (used < cap) snprintf(out + used, cap - used, "]");
  free(part);
}

// The curve of every round (--rounds R > 1) as the JSON member "rounds_us", built up round by round.
#define CURVE_CAP 2048
static char* g_rounds_json;
static void rounds_add(const double* us, size_t n, int round) {
  size_t len = g_rounds_json ? strlen(g_rounds_json) : 0;
  char* grown = realloc(g_rounds_json, len + CURVE_CAP + 32);
  if (!grown) die("out of memory");
  g_rounds_json = grown;
  int head = snprintf(g_rounds_json + len, 32, "%s", round ? "," : ",\"rounds_us\":[");
  curve_array(g_rounds_json + len + head, CURVE_CAP, us, n);
}

static void report_lat(double* us, size_t n, double seconds, int streams) {
  if (n == 0) die("no latency sample was measured");
  char curve[CURVE_CAP + 16] = "";
  if (g_o.curve) {
    int head = snprintf(curve, sizeof curve, ",\"curve_us\":");
    curve_array(curve + head, sizeof curve - (size_t)head, us, n);
  }
  qsort(us, n, sizeof *us, cmp_double);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += us[i];
  char sj[16], setup[96];
  streams_json(sj, sizeof sj, streams);
  setup_json(setup, sizeof setup);
  printf("{\"mode\":\"%s\",\"size\":%zu,\"streams\":%s,\"version\":%d,\"iterations\":%zu,\"seconds\":%.6f,"
         "\"lat_us\":{\"median\":%.3f,\"p99\":%.3f,\"min\":%.3f,\"max\":%.3f,\"mean\":%.3f}%s%s%s%s}\n",
         k_mode_names[g_o.mode], g_o.size, sj, g_o.version, n, seconds, quantile(us, n, 0.5),
         quantile(us, n, 0.99), us[0], us[n - 1], sum / (double)n, curve, g_rounds_json ? g_rounds_json : "",
         g_rounds_json ? "]" : "", setup);
  fflush(stdout);
}

// cpu: for tsnet, the protocol and I/O threads' CPU of the sender (A) and receiver (B) over the
// window, in ns; NULL for plain TCP.
static void report_bw(uint64_t bytes, uint64_t messages, double seconds, int streams, const Cpu* send, const Cpu* recv) {
  if (seconds <= 0 || bytes == 0) die("no bandwidth window was measured");
  char sj[16], cpu[256] = "", setup[96];
  streams_json(sj, sizeof sj, streams);
  setup_json(setup, sizeof setup);
  if (send && recv && messages)
    snprintf(cpu, sizeof cpu,
             ",\"cpu_us_per_msg\":{\"send_proto\":%.3f,\"send_io\":%.3f,\"recv_proto\":%.3f,\"recv_io\":%.3f}",
             (double)send->proto / 1e3 / (double)messages, (double)send->io / 1e3 / (double)messages,
             (double)recv->proto / 1e3 / (double)messages, (double)recv->io / 1e3 / (double)messages);
  printf("{\"mode\":\"%s\",\"size\":%zu,\"streams\":%s,\"version\":%d,\"inflight\":%d,\"pairs\":%d,\"mem\":\"%s\","
         "\"messages\":%llu,\"bytes\":%llu,\"seconds\":%.6f,\"bw_GBps\":%.6f,\"msgs_per_s\":%.1f%s%s}\n",
         k_mode_names[g_o.mode], g_o.size, sj, g_o.version, g_o.inflight, streams ? 1 : g_o.pairs, g_o.cuda ? "cuda" : "host",
         (unsigned long long)messages, (unsigned long long)bytes, seconds, (double)bytes / seconds / 1e9,
         (double)messages / seconds, cpu, setup);
  fflush(stdout);
}

// ---------------------------------------------------------------- the channel between A and B

enum { CH_HANDLE = 1, CH_PORT = 2, CH_STOP = 3, CH_TOTAL = 4, CH_DONE = 5, CH_START = 6, CH_CPU = 7 };
typedef struct ChMsg {
  int32_t kind;
  int32_t pad;
  uint64_t value;
  uint8_t data[TSN_HANDLE_SIZE];
} ChMsg;  // < PIPE_BUF: writes are atomic

typedef struct Chan {
  int rfd, wfd;
} Chan;

static void ch_put(Chan c, int kind, uint64_t value, const void* data) {
  ChMsg m;
  memset(&m, 0, sizeof m);
  m.kind = kind;
  m.value = value;
  if (data) memcpy(m.data, data, TSN_HANDLE_SIZE);
  ssize_t w;
  do w = write(c.wfd, &m, sizeof m);
  while (w < 0 && errno == EINTR);
  if (w != (ssize_t)sizeof m) die("channel write: %s", w < 0 ? strerror(errno) : "short");
}

// Waits up to `wait` seconds (0: just looks) for a message of `kind`; 1 when one came.
static int ch_get(Chan c, int kind, ChMsg* m, double wait) {
  struct pollfd p = {.fd = c.rfd, .events = POLLIN};
  int r;
  do r = poll(&p, 1, (int)(wait * 1000));
  while (r < 0 && errno == EINTR);
  if (r == 0) return 0;
  ssize_t got = read(c.rfd, m, sizeof *m);
  if (got == 0) die("the peer process went away");
  if (got != (ssize_t)sizeof *m) die("channel read: %s", got < 0 ? strerror(errno) : "short");
  if (kind && m->kind != kind) die("channel: expected message %d, got %d", kind, m->kind);
  return 1;
}

static void ch_wait(Chan c, int kind, ChMsg* m, const char* what) {
  if (!ch_get(c, kind, m, g_o.timeout)) die("timed out after %.0f s waiting for %s", g_o.timeout, what);
}

// ---------------------------------------------------------------- tsnet: set-up

typedef struct Plug {
  Net net;
  void* ctx;
  int pairs;
  void* lcs[MAX_PAIRS];  // listen comms
  void* scs[MAX_PAIRS];  // send comms (to the peer)
  void* rcs[MAX_PAIRS];  // recv comms (from the peer)
  void* lc;  // the first of each
  void* sc;
  void* rc;
} Plug;

// Loads and initialises the plugin, then opens pairs send comms to the peer and as many recv
// comms from it: each side listens once per pair, hands its handles over, connects to the
// peer's, and accepts, polling connect and accept (both non-blocking) until all comms exist.
// pl_load loads and initialises; pl_connect opens the comms (again after pl_disconnect: --rounds).
static void pl_load(Plug* t) {
  memset(t, 0, sizeof *t);
  char err[512];
  double t_load = now_s();
  if (shim_open(&t->net, g_o.lib, g_o.version, err, sizeof err) != 0) die("load: %s", err);
  tsn_result_t rc = shim_init(&t->net, &t->ctx, COMM_ID, logger);
  if (rc != TSN_SUCCESS) die("init failed (rc %d)", rc);
  int ndev = 0;
  rc = shim_devices(&t->net, &ndev);
  if (rc != TSN_SUCCESS || ndev <= g_o.dev) die("devices: rc %d, %d device(s), --dev %d", rc, ndev, g_o.dev);
  g_init_s = now_s() - t_load;
}

static void pl_connect(Plug* t, Chan ch, int pairs) {
  tsn_result_t rc;
  memset(t->lcs, 0, sizeof t->lcs);
  memset(t->scs, 0, sizeof t->scs);
  memset(t->rcs, 0, sizeof t->rcs);
  t->pairs = pairs;
  double t_listen = now_s();
  uint8_t peer[MAX_PAIRS][TSN_HANDLE_SIZE];
  for (int i = 0; i < pairs; i++) {
    uint8_t mine[TSN_HANDLE_SIZE];
    memset(mine, 0, sizeof mine);
    rc = shim_listen(&t->net, t->ctx, g_o.dev, mine, &t->lcs[i]);
    if (rc != TSN_SUCCESS || !t->lcs[i]) die("listen failed (rc %d)", rc);
    ch_put(ch, CH_HANDLE, (uint64_t)i, mine);
  }
  for (int i = 0; i < pairs; i++) {
    ChMsg m;
    ch_wait(ch, CH_HANDLE, &m, "the peer's handles");
    memcpy(peer[m.value], m.data, TSN_HANDLE_SIZE);
  }
  double end = now_s() + g_o.timeout;
  for (int up = 0; up < 2 * pairs;) {
    up = 0;
    for (int i = 0; i < pairs; i++) {
      if (!t->scs[i] && (rc = shim_connect(&t->net, t->ctx, g_o.dev, peer[i], &t->scs[i])) != TSN_SUCCESS)
        die("connect failed (rc %d)", rc);
      if (!t->rcs[i] && (rc = shim_accept(&t->net, t->lcs[i], &t->rcs[i])) != TSN_SUCCESS) die("accept failed (rc %d)", rc);
      up += (t->scs[i] != NULL) + (t->rcs[i] != NULL);
    }
    if (now_s() > end) die("timed out after %.0f s connecting (%d of %d comms up)", g_o.timeout, up, 2 * pairs);
    if (up < 2 * pairs) idle();
  }
  if (g_connect_s < 0) g_connect_s = now_s() - t_listen;  // the first round's
  t->lc = t->lcs[0];
  t->sc = t->scs[0];
  t->rc = t->rcs[0];
}

static void pl_open_n(Plug* t, Chan ch, int pairs) {
  pl_load(t);
  pl_connect(t, ch, pairs);
}

static void* pl_reg(Plug* t, void* comm, void* data, size_t size) {
  void* mh = NULL;
  tsn_result_t rc = shim_reg_mr(&t->net, comm, data, size, g_o.cuda ? TSN_PTR_CUDA : TSN_PTR_HOST, &mh);
  if (rc != TSN_SUCCESS || !mh)
    die("regMr of %zu bytes of %s memory failed (rc %d)", size, g_o.cuda ? "GPU" : "host", rc);
  return mh;
}

// Both sides finished every request before either closes (NCCL destroys a communicator after
// a bootstrap barrier too): a close right after the last send completed can reach the peer
// before that send's data does.
static void pl_disconnect(Plug* t, Chan ch, void** mrs, void** comms, int nmr) {
  ch_put(ch, CH_DONE, 0, NULL);
  ChMsg m;
  ch_wait(ch, CH_DONE, &m, "the peer to finish");
  for (int i = 0; i < nmr; i++) {
    tsn_result_t rc = shim_dereg_mr(&t->net, comms[i], mrs[i]);
    if (rc != TSN_SUCCESS) die("deregMr failed (rc %d)", rc);
  }
  tsn_result_t rc;
  for (int i = 0; i < t->pairs; i++) {
    if ((rc = shim_close_send(&t->net, t->scs[i])) != TSN_SUCCESS) die("closeSend failed (rc %d)", rc);
    if ((rc = shim_close_recv(&t->net, t->rcs[i])) != TSN_SUCCESS) die("closeRecv failed (rc %d)", rc);
    if ((rc = shim_close_listen(&t->net, t->lcs[i])) != TSN_SUCCESS) die("closeListen failed (rc %d)", rc);
  }
}

static void pl_finalize(Plug* t) {
  tsn_result_t rc;
  if (shim_has_ctx(g_o.version) && (rc = shim_finalize(&t->net, t->ctx)) != TSN_SUCCESS)
    die("finalize failed (rc %d)", rc);
}

static void pl_close(Plug* t, Chan ch, void** mrs, void** comms, int nmr) {
  pl_disconnect(t, ch, mrs, comms, nmr);
  pl_finalize(t);
}

// isend / irecv of one buffer on a comm; NULL while the comm's request pool is full.
static void* pl_isend_on(Plug* t, void* comm, void* data, void* mh) {
  void* req = NULL;
  tsn_result_t rc = shim_isend(&t->net, comm, data, g_o.size, 0, mh, &req);
  if (rc != TSN_SUCCESS) die("isend failed (rc %d)", rc);
  return req;
}

static void* pl_irecv_on(Plug* t, void* comm, void* data, void* mh) {
  void* req = NULL;
  size_t size = g_o.size;
  int tag = 0;
  tsn_result_t rc = shim_irecv(&t->net, comm, 1, &data, &size, &tag, &mh, &req);
  if (rc != TSN_SUCCESS) die("irecv failed (rc %d)", rc);
  return req;
}

static void* pl_isend(Plug* t, void* data, void* mh) { return pl_isend_on(t, t->sc, data, mh); }
static void* pl_irecv(Plug* t, void* data, void* mh) { return pl_irecv_on(t, t->rc, data, mh); }

// Posts with retries until the pool gives a request (bounded by the deadline).
static void* pl_post(Plug* t, int send, void* data, void* mh) {
  double end = now_s() + g_o.timeout;
  for (;;) {
    void* req = send ? pl_isend(t, data, mh) : pl_irecv(t, data, mh);
    if (req) return req;
    if (now_s() > end) die("timed out after %.0f s: the %s request pool stayed full", g_o.timeout, send ? "send" : "recv");
    idle();
  }
}

// One test(); 1 when done (and checks the size a receive reports).
static int pl_done(Plug* t, void* req, int recv) {
  int done = 0, size = -1;
  tsn_result_t rc = shim_test(&t->net, req, &done, &size);
  if (rc != TSN_SUCCESS) die("test failed (rc %d)", rc);
  if (done && recv && (size_t)size != g_o.size) die("a receive reported %d bytes, expected %zu", size, g_o.size);
  return done;
}

// --mem cuda: iflush of a completed receive, waited for (NULL request: nothing to do).
static void pl_flush(Plug* t, void* comm, void* data, void* mh) {
  void* req = NULL;
  int size = (int)g_o.size;
  tsn_result_t rc = shim_iflush(&t->net, comm, 1, &data, &size, &mh, &req);
  if (rc != TSN_SUCCESS) die("iflush failed (rc %d)", rc);
  double end = now_s() + g_o.timeout;
  while (req && !pl_done(t, req, 0))
    if (now_s() > end) die("timed out after %.0f s waiting for an iflush", g_o.timeout);
}

// ---------------------------------------------------------------- tsnet: latency

// --gap-us: A waits between round trips, so that each ping finds the peer's threads idle (a
// training job's collective after its compute). The wait is not in the figures.
static void gap(void) {
  struct timespec ts = {.tv_sec = g_o.gap_us / 1000000, .tv_nsec = (long)(g_o.gap_us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// A: ping, wait for the pong; the last ping carries 1 in its first byte. With --rounds R the
// comms are closed and opened again R - 1 times in the same process, each round measured
// from its first message; the figures but rounds_us are the first round's.
static void tsnet_lat_a(Chan ch) {
  Plug t;
  pl_load(&t);
  uint8_t* sbuf = alloc_buf(g_o.size);
  uint8_t* rbuf = alloc_buf(g_o.size);
  size_t cap = 1 << 16, n = 0, first_n = 0;
  double* us = malloc(cap * sizeof *us);
  double* first = NULL;
  double first_seconds = 0;
  if (!us) die("out of memory");
  for (int round = 0; round < g_o.rounds; round++) {
    pl_connect(&t, ch, 1);
    void* mrs[2] = {pl_reg(&t, t.sc, sbuf, g_o.size), pl_reg(&t, t.rc, rbuf, g_o.size)};
    void* comms[2] = {t.sc, t.rc};
    double start = now_s(), mstart = 0;
    long warm = 0;
    int measuring = 0, last = 0;
    n = 0;
    void* rreq = pl_post(&t, 0, rbuf, mrs[1]);
    while (!last) {
      if (g_o.gap_us && (n || warm)) gap();
      double t0 = now_s();
      if (!measuring && (g_o.curve || (t0 - start >= g_o.warmup && warm >= 3))) measuring = 1, mstart = t0;
      if (!measuring) warm++;
      last = g_o.curve ? (long)n + 1 >= g_o.curve : measuring && t0 - mstart >= g_o.duration;
      sbuf[0] = (uint8_t)last;
      void* sreq = pl_post(&t, 1, sbuf, mrs[0]);
      double t1 = 0, end = t0 + g_o.timeout;
      while (sreq || !t1) {
        if (sreq && pl_done(&t, sreq, 0)) sreq = NULL;
        if (!t1 && pl_done(&t, rreq, 1)) t1 = now_s();
        if (now_s() > end) die("timed out after %.0f s in a ping-pong", g_o.timeout);
        if (sreq || !t1) idle();
      }
      if (!last) rreq = pl_post(&t, 0, rbuf, mrs[1]);  // the next pong's receive, before the next ping
      if (measuring) {
        if (n == cap && !(us = realloc(us, (cap *= 2) * sizeof *us))) die("out of memory");
        us[n++] = (t1 - t0) * 1e6 / 2;
      }
    }
    double seconds = now_s() - mstart;
    pl_disconnect(&t, ch, mrs, comms, 2);
    if (g_o.rounds > 1) rounds_add(us, n, round);
    if (round == 0 && g_o.rounds > 1) {
      if (!(first = malloc(n * sizeof *first))) die("out of memory");
      memcpy(first, us, n * sizeof *first);
      first_n = n, first_seconds = seconds;
    } else if (round == 0) {
      first = us, first_n = n, first_seconds = seconds;
    }
  }
  pl_finalize(&t);
  report_lat(first, first_n, first_seconds, 0);
}

// B: wait for a ping, post the next receive, pong (each round of --rounds).
static void tsnet_lat_b(Chan ch) {
  Plug t;
  pl_load(&t);
  uint8_t* sbuf = alloc_buf(g_o.size);
  uint8_t* rbuf = alloc_buf(g_o.size);
  for (int round = 0; round < g_o.rounds; round++) {
    pl_connect(&t, ch, 1);
    void* mrs[2] = {pl_reg(&t, t.sc, sbuf, g_o.size), pl_reg(&t, t.rc, rbuf, g_o.size)};
    void* comms[2] = {t.sc, t.rc};
    void* rreq = pl_post(&t, 0, rbuf, mrs[1]);
    for (int last = 0; !last;) {
      double end = now_s() + g_o.timeout;
      while (!pl_done(&t, rreq, 1)) {
        if (now_s() > end) die("timed out after %.0f s waiting for a ping", g_o.timeout);
        idle();
      }
      last = rbuf[0];
      if (!last) rreq = pl_post(&t, 0, rbuf, mrs[1]);
      void* sreq = pl_post(&t, 1, sbuf, mrs[0]);
      while (!pl_done(&t, sreq, 0)) {
        if (now_s() > end) die("timed out after %.0f s sending a pong", g_o.timeout);
        idle();
      }
    }
    pl_disconnect(&t, ch, mrs, comms, 2);
  }
  pl_finalize(&t);
}

// ---------------------------------------------------------------- tsnet: bandwidth

// A: keeps up to --inflight isends in flight on each of its --pairs send comms until B says
// stop at (at least) R messages in all, then tells B how many it sent; measures its threads'
// CPU between B's start and stop and hands it to B.
static void tsnet_bw_a(Chan ch) {
  Plug t;
  int P = g_o.pairs, K = g_o.inflight;
  pl_open_n(&t, ch, P);
  uint8_t* sbuf = alloc_buf(g_o.size);
  void* mrs[MAX_PAIRS];
  for (int p = 0; p < P; p++) mrs[p] = pl_reg(&t, t.scs[p], sbuf, g_o.size);
  void* req[MAX_PAIRS][MAX_INFLIGHT];
  memset(req, 0, sizeof req);
  // Per comm: messages posted, and (after B's stop) how many to send in all.
  uint64_t posted[MAX_PAIRS] = {0}, stop_at[MAX_PAIRS];
  for (int p = 0; p < P; p++) stop_at[p] = UINT64_MAX;
  int busy = 0, stopped = 0;
  Cpu c0 = {0, 0}, c1 = {0, 0};
  double next_look = 0, progress = now_s();
  for (;;) {
    int more = busy > 0;
    for (int p = 0; p < P; p++) more |= posted[p] < stop_at[p];
    if (!more) break;
    for (int p = 0; p < P; p++)
      for (int i = 0; i < K && posted[p] < stop_at[p]; i++)
        if (!req[p][i]) {
          if (!(req[p][i] = pl_isend_on(&t, t.scs[p], sbuf, mrs[p]))) break;
          posted[p]++, busy++;
        }
    int quiet = 1;
    for (int p = 0; p < P; p++)
      for (int i = 0; i < K; i++)
        if (req[p][i] && pl_done(&t, req[p][i], 0)) req[p][i] = NULL, busy--, quiet = 0;
    double now = now_s();
    if (!quiet) progress = now;
    else if (now - progress > g_o.timeout) die("timed out after %.0f s: no send completed", g_o.timeout);
    if (!stopped && now >= next_look) {
      ChMsg m;
      while (!stopped && ch_get(ch, 0, &m, 0)) {
        if (m.kind == CH_START) c0 = cpu_now();
        else if (m.kind == CH_STOP) {
          // B's receives posted per comm: each comm sends at least that many, then its count.
          c1 = cpu_now();
          uint64_t theirs[MAX_PAIRS];
          memcpy(theirs, m.data, sizeof theirs);
          for (int p = 0; p < P; p++) stop_at[p] = theirs[p] > posted[p] ? theirs[p] : posted[p];
          stopped = 1;
          ch_put(ch, CH_TOTAL, 0, stop_at);  // at once: B may have to post more receives
        } else die("channel: unexpected message %d", m.kind);
      }
      next_look = now + 0.001;
    }
    if (quiet) idle();
  }
  Cpu d = {c1.proto - c0.proto, c1.io - c0.io};
  ch_put(ch, CH_CPU, d.proto, &d.io);
  void* comms[MAX_PAIRS];
  for (int p = 0; p < P; p++) comms[p] = t.scs[p];
  pl_close(&t, ch, mrs, comms, P);
}

// B: keeps up to --inflight irecvs posted on each recv comm; measures the receives completed
// between the end of the warm-up and the stop, then receives whatever A still sends.
static void tsnet_bw_b(Chan ch) {
  Plug t;
  int P = g_o.pairs, K = g_o.inflight;
  pl_open_n(&t, ch, P);
  size_t nbuf = RECV_POOL_BYTES / (g_o.size ? g_o.size : 1) / (size_t)P;
  if (nbuf > (size_t)K) nbuf = (size_t)K;
  if (nbuf < 1) nbuf = 1;
  uint8_t* pools[MAX_PAIRS];
  void* mrs[MAX_PAIRS];
  for (int p = 0; p < P; p++) {
    pools[p] = alloc_buf(nbuf * g_o.size);
    mrs[p] = pl_reg(&t, t.rcs[p], pools[p], nbuf * g_o.size);
  }
  void* req[MAX_PAIRS][MAX_INFLIGHT];
  uint8_t* at[MAX_PAIRS][MAX_INFLIGHT];  // where each receive lands (the iflush's buffer)
  memset(req, 0, sizeof req);
  // Per comm: receives posted and done; limit: after the stop, no more than B told A (A sends
  // at least that many on each comm), then exactly what A says it sent.
  uint64_t posted[MAX_PAIRS] = {0}, got[MAX_PAIRS] = {0}, limit[MAX_PAIRS];
  for (int p = 0; p < P; p++) limit[p] = UINT64_MAX;
  uint64_t done = 0, n0 = 0, n1 = 0;
  int totals = 0;
  Cpu c0 = {0, 0}, c1 = {0, 0};
  double start = 0, t0 = 0, t1 = 0, progress = now_s();
  for (;;) {
    int more = !totals;
    for (int p = 0; p < P; p++) more |= got[p] < limit[p];
    if (!more) break;
    for (int p = 0; p < P; p++)
      for (int i = 0; i < K && posted[p] < limit[p]; i++)
        if (!req[p][i]) {
          at[p][i] = pools[p] + (posted[p] % nbuf) * g_o.size;
          if (!(req[p][i] = pl_irecv_on(&t, t.rcs[p], at[p][i], mrs[p]))) break;
          posted[p]++;
        }
    int quiet = 1;
    for (int p = 0; p < P; p++)
      for (int i = 0; i < K; i++)
        if (req[p][i] && pl_done(&t, req[p][i], 1)) {
          if (g_o.cuda) pl_flush(&t, t.rcs[p], at[p][i], mrs[p]);
          req[p][i] = NULL, done++, got[p]++, quiet = 0;
        }
    double now = now_s();
    if (!quiet) progress = now;
    else if (now - progress > g_o.timeout) die("timed out after %.0f s: no receive completed", g_o.timeout);
    if (!quiet && !start) start = now;  // the warm-up starts with the first message
    if (start && !t0 && now - start >= g_o.warmup && done >= 2) {
      t0 = now, n0 = done, c0 = cpu_now();
      ch_put(ch, CH_START, 0, NULL);
    }
    if (t0 && !t1 && now - t0 >= g_o.duration && done > n0) {
      t1 = now, n1 = done, c1 = cpu_now();
      for (int p = 0; p < P; p++) limit[p] = posted[p];
      ch_put(ch, CH_STOP, 0, posted);
    }
    if (t1 && !totals) {
      ChMsg m;
      if (ch_get(ch, CH_TOTAL, &m, 0)) {
        memcpy(limit, m.data, sizeof limit);
        totals = 1;
      }
    }
    if (quiet) idle();
  }
  ChMsg m;
  ch_wait(ch, CH_CPU, &m, "the sender's CPU figures");
  Cpu send = {m.value, 0}, recv = {c1.proto - c0.proto, c1.io - c0.io};
  memcpy(&send.io, m.data, sizeof send.io);
  void* comms[MAX_PAIRS];
  for (int p = 0; p < P; p++) comms[p] = t.rcs[p];
  pl_close(&t, ch, mrs, comms, P);
  report_bw((n1 - n0) * g_o.size, n1 - n0, t1 - t0, 0, &send, &recv);
}

// ---------------------------------------------------------------- plain TCP

static void tcp_opts(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die("TCP_NODELAY: %s", strerror(errno));
  struct timeval tv = {.tv_sec = (time_t)g_o.timeout, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// B: listens on 127.0.0.1, tells A the port, accepts n sockets; A says each one's index first.
static void tcp_accept_n(Chan ch, int* fds, int n) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (l < 0 || bind(l, (struct sockaddr*)&a, sizeof a) || listen(l, n) || getsockname(l, (struct sockaddr*)&a, &al))
    die("listen on 127.0.0.1: %s", strerror(errno));
  ch_put(ch, CH_PORT, ntohs(a.sin_port), NULL);
  for (int i = 0; i < n; i++) {
    struct pollfd p = {.fd = l, .events = POLLIN};
    if (poll(&p, 1, (int)(g_o.timeout * 1000)) != 1) die("timed out accepting stream %d of %d", i, n);
    int fd = accept(l, NULL, NULL);
    if (fd < 0) die("accept: %s", strerror(errno));
    tcp_opts(fd);
    int32_t idx = -1;
    if (recv(fd, &idx, sizeof idx, MSG_WAITALL) != (ssize_t)sizeof idx || idx < 0 || idx >= n || fds[idx] >= 0)
      die("stream %d: bad index", i);
    fds[idx] = fd;
  }
  close(l);
}

static void tcp_connect_n(Chan ch, int* fds, int n) {
  ChMsg m;
  ch_wait(ch, CH_PORT, &m, "the peer's port");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)m.value),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int32_t i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a)) die("connect to 127.0.0.1: %s", strerror(errno));
    tcp_opts(fd);
    if (send(fd, &i, sizeof i, MSG_NOSIGNAL) != (ssize_t)sizeof i) die("send: %s", strerror(errno));
    fds[i] = fd;
  }
}

// Blocking send / receive of exactly len bytes; receive returns 0 at a clean end of stream.
static void send_all(int fd, const uint8_t* p, size_t len) {
  while (len) {
    ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("send: %s", w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out" : strerror(errno));
    p += w, len -= (size_t)w;
  }
}

static int recv_all(int fd, uint8_t* p, size_t len, _Atomic uint64_t* count) {
  size_t want = len;
  while (len) {
    ssize_t r = recv(fd, p, len, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && len == want) return 0;
    if (r <= 0) die("recv: %s", r == 0 ? "the stream ended inside a message" : errno == EAGAIN ? "timed out" : strerror(errno));
    if (count) atomic_fetch_add_explicit(count, (uint64_t)r, memory_order_relaxed);
    p += r, len -= (size_t)r;
  }
  return 1;
}

static void tcp_lat_a(Chan ch) {
  int fd = -1;
  tcp_connect_n(ch, &fd, 1);
  uint8_t* sbuf = alloc_buf(g_o.size);
  uint8_t* rbuf = alloc_buf(g_o.size);
  size_t cap = 1 << 16, n = 0;
  double* us = malloc(cap * sizeof *us);
  if (!us) die("out of memory");
  double start = now_s(), mstart = 0;
  long warm = 0;
  int measuring = 0, last = 0;
  while (!last) {
    if (g_o.gap_us && (n || warm)) gap();
    double t0 = now_s();
    if (!measuring && t0 - start >= g_o.warmup && warm >= 3) measuring = 1, mstart = t0;
    if (!measuring) warm++;
    last = measuring && t0 - mstart >= g_o.duration;
    sbuf[0] = (uint8_t)last;
    send_all(fd, sbuf, g_o.size);
    if (!recv_all(fd, rbuf, g_o.size, NULL)) die("the peer closed its socket");
    double t1 = now_s();
    if (measuring) {
      if (n == cap && !(us = realloc(us, (cap *= 2) * sizeof *us))) die("out of memory");
      us[n++] = (t1 - t0) * 1e6 / 2;
    }
  }
  double seconds = now_s() - mstart;
  close(fd);
  report_lat(us, n, seconds, 1);
}

static void tcp_lat_b(Chan ch) {
  int fd = -1;
  tcp_accept_n(ch, &fd, 1);
  uint8_t* sbuf = alloc_buf(g_o.size);
  uint8_t* rbuf = alloc_buf(g_o.size);
  for (int last = 0; !last;) {
    if (!recv_all(fd, rbuf, g_o.size, NULL)) die("the peer closed its socket");
    last = rbuf[0];
    send_all(fd, sbuf, g_o.size);
  }
  close(fd);
}

// The stripes of message after message: which part of each message stream `lane` carries.
typedef struct Striper {
  size_t stripe;  // stripe length for this size
  int lanes;
  int next;  // lane of the next message's first stripe
} Striper;

static void striper_init(Striper* s, int lanes) {
  size_t len = g_o.size / (size_t)lanes;
  if (len < MIN_STRIPE) len = MIN_STRIPE;
  s->stripe = (len + STRIPE_ALIGN - 1) / STRIPE_ALIGN * STRIPE_ALIGN;
  s->lanes = lanes;
  s->next = 0;
}

typedef struct Stream {
  int fd, lane;
  uint8_t* buf;  // A: the message; B: nbuf messages
  size_t nbuf;
  _Atomic int* stop;         // A: set by the main thread
  _Atomic uint64_t* bytes;   // B: bytes received, all streams
  pthread_t th;
} Stream;

// The offsets and lengths of this lane's stripes of the next message (their count); advances.
static size_t striper_mine(Striper* s, int lane, size_t off[], size_t len[]) {
  size_t k = 0, i = 0;
  for (size_t o = 0; o < g_o.size; o += s->stripe, i++)
    if ((s->next + (int)i) % s->lanes == lane) {
      off[k] = o;
      len[k] = g_o.size - o < s->stripe ? g_o.size - o : s->stripe;
      k++;
    }
  if (g_o.size == 0) i = 1;
  s->next = (s->next + (int)i) % s->lanes;
  return k;
}

#define MAX_PARTS 1024

static void* tcp_send_stream(void* arg) {
  Stream* st = arg;
  Striper s;
  striper_init(&s, g_o.streams);
  size_t off[MAX_PARTS], len[MAX_PARTS];
  while (!atomic_load_explicit(st->stop, memory_order_relaxed)) {
    size_t k = striper_mine(&s, st->lane, off, len);
    for (size_t j = 0; j < k; j++) send_all(st->fd, st->buf + off[j], len[j]);
  }
  shutdown(st->fd, SHUT_WR);
  return NULL;
}

static void* tcp_recv_stream(void* arg) {
  Stream* st = arg;
  Striper s;
  striper_init(&s, g_o.streams);
  size_t off[MAX_PARTS], len[MAX_PARTS];
  for (uint64_t msg = 0;; msg++) {
    size_t k = striper_mine(&s, st->lane, off, len);
    uint8_t* base = st->buf + (msg % st->nbuf) * g_o.size;
    for (size_t j = 0; j < k; j++)
      if (!recv_all(st->fd, base + off[j], len[j], st->bytes)) return NULL;
  }
}

static void tcp_bw_a(Chan ch) {
  int n = g_o.streams, fds[MAX_STREAMS];
  tcp_connect_n(ch, fds, n);
  uint8_t* sbuf = alloc_buf(g_o.size);
  _Atomic int stop = 0;
  Stream st[MAX_STREAMS];
  for (int i = 0; i < n; i++) {
    st[i] = (Stream){.fd = fds[i], .lane = i, .buf = sbuf, .stop = &stop};
    if (pthread_create(&st[i].th, NULL, tcp_send_stream, &st[i])) die("pthread_create failed");
  }
  ChMsg m;
  if (!ch_get(ch, CH_STOP, &m, g_o.warmup + g_o.duration + g_o.timeout)) die("timed out waiting for the stop");
  atomic_store(&stop, 1);
  for (int i = 0; i < n; i++) pthread_join(st[i].th, NULL);
  for (int i = 0; i < n; i++) close(fds[i]);
}

static void tcp_bw_b(Chan ch) {
  int n = g_o.streams, fds[MAX_STREAMS];
  for (int i = 0; i < n; i++) fds[i] = -1;
  tcp_accept_n(ch, fds, n);
  size_t nbuf = RECV_POOL_BYTES / (g_o.size ? g_o.size : 1);
  if (nbuf > (size_t)g_o.inflight) nbuf = (size_t)g_o.inflight;
  if (nbuf < 1) nbuf = 1;
  uint8_t* pool = alloc_buf(nbuf * g_o.size);
  _Atomic uint64_t bytes = 0;
  Stream st[MAX_STREAMS];
  for (int i = 0; i < n; i++) {
    st[i] = (Stream){.fd = fds[i], .lane = i, .buf = pool, .nbuf = nbuf, .bytes = &bytes};
    if (pthread_create(&st[i].th, NULL, tcp_recv_stream, &st[i])) die("pthread_create failed");
  }
  double end = now_s() + g_o.timeout;
  while (atomic_load(&bytes) == 0) {
    if (now_s() > end) die("timed out waiting for the first bytes");
    usleep(100);
  }
  usleep((useconds_t)(g_o.warmup * 1e6));
  double t0 = now_s();
  uint64_t c0 = atomic_load(&bytes);
  usleep((useconds_t)(g_o.duration * 1e6));
  double t1 = now_s();
  uint64_t c1 = atomic_load(&bytes);
  ch_put(ch, CH_STOP, 0, NULL);
  for (int i = 0; i < n; i++) pthread_join(st[i].th, NULL);
  for (int i = 0; i < n; i++) close(fds[i]);
  report_bw(c1 - c0, (c1 - c0) / (g_o.size ? g_o.size : 1), t1 - t0, n, NULL, NULL);
}

// ---------------------------------------------------------------- processes

static void usage(void) {
  fprintf(stderr,
          "usage: tsnet-bench tsnet-lat|tsnet-bw|tcp-lat|tcp-bw --size BYTES [--duration S] [--warmup S]\n"
          "                   [--streams N] [--inflight K] [--pairs P] [--version 6..12] [--lib PATH] [--dev D]\n"
          "                   [--timeout S] [--spin | --idle-us US] [--verbose] [--mem host|cuda] [--curve N]\n"
          "                   [--rounds R] [--gap-us US]\n");
  exit(2);
}

static void role_main(int a, Chan ch) {
  g_role = a ? "A" : "B";
  shim_stale_note(&g_stale);  // before the plugin is loaded
  signal(SIGPIPE, SIG_IGN);
  alarm((unsigned)(g_o.rounds * (g_o.warmup + g_o.duration + 4 * g_o.timeout)) + 1);  // the backstop of every wait
  switch (g_o.mode) {
    case M_TSNET_LAT: a ? tsnet_lat_a(ch) : tsnet_lat_b(ch); break;
    case M_TSNET_BW: a ? tsnet_bw_a(ch) : tsnet_bw_b(ch); break;
    case M_TCP_LAT: a ? tcp_lat_a(ch) : tcp_lat_b(ch); break;
    case M_TCP_BW: a ? tcp_bw_a(ch) : tcp_bw_b(ch); break;
  }
  fflush(stdout);
  shm_sweep(getpid(), g_role);
  fflush(stderr);
  _exit(0);
}

int main(int argc, char** argv) {
  if (argc < 2) usage();
  int found = 0;
  for (int m = 0; m < 4; m++)
    if (!strcmp(argv[1], k_mode_names[m])) g_o.mode = (Mode)m, found = 1;
  if (!found) usage();
  int have_size = 0, have_curve = 0;
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--spin")) g_o.spin = 1;
    else if (!strcmp(a, "--verbose")) g_o.verbose = 1;
    else if (!v) usage();
    else if (!strcmp(a, "--size")) g_o.size = strtoull(v, NULL, 10), have_size = 1, i++;
    else if (!strcmp(a, "--duration")) g_o.duration = atof(v), i++;
    else if (!strcmp(a, "--warmup")) g_o.warmup = atof(v), i++;
    else if (!strcmp(a, "--streams")) g_o.streams = atoi(v), i++;
    else if (!strcmp(a, "--inflight")) g_o.inflight = atoi(v), i++;
    else if (!strcmp(a, "--pairs")) g_o.pairs = atoi(v), i++;
    else if (!strcmp(a, "--version")) g_o.version = atoi(v), i++;
    else if (!strcmp(a, "--lib")) g_o.lib = v, i++;
    else if (!strcmp(a, "--dev")) g_o.dev = atoi(v), i++;
    else if (!strcmp(a, "--timeout")) g_o.timeout = atof(v), i++;
    else if (!strcmp(a, "--idle-us")) g_o.idle_us = atoi(v), i++;
    else if (!strcmp(a, "--gap-us")) g_o.gap_us = atoi(v), i++;
    else if (!strcmp(a, "--curve")) g_o.curve = atol(v), have_curve = 1, i++;
    else if (!strcmp(a, "--rounds")) g_o.rounds = atoi(v), i++;
    else if (!strcmp(a, "--mem") && (!strcmp(v, "host") || !strcmp(v, "cuda"))) g_o.cuda = !strcmp(v, "cuda"), i++;
    else usage();
  }
  if (g_o.gap_us < 0 || g_o.gap_us > 10000000) die("--gap-us must be 0 .. 10000000");
  if (g_o.gap_us && g_o.mode != M_TSNET_LAT && g_o.mode != M_TCP_LAT) die("--gap-us is for tsnet-lat and tcp-lat");
  if (!have_size || g_o.size < 1 || g_o.size > ((size_t)1 << 30)) die("--size must be 1 .. 2^30 bytes");
  if (g_o.streams < 1 || g_o.streams > MAX_STREAMS) die("--streams must be 1 .. %d", MAX_STREAMS);
  if (g_o.inflight < 1 || g_o.inflight > MAX_INFLIGHT) die("--inflight must be 1 .. %d", MAX_INFLIGHT);
  if (g_o.pairs < 1 || g_o.pairs > MAX_PAIRS) die("--pairs must be 1 .. %d", MAX_PAIRS);
  if (g_o.duration <= 0 || g_o.warmup < 0 || g_o.timeout <= 0) die("bad --duration, --warmup or --timeout");
  if (g_o.mode == M_TCP_LAT) g_o.streams = 1;
  if (g_o.cuda && g_o.mode != M_TSNET_BW) die("--mem cuda is for tsnet-bw only");
  if (have_curve && (g_o.mode != M_TSNET_LAT || g_o.curve < 1 || g_o.curve > 1000000)) die("--curve N is for tsnet-lat, N 1 .. 1000000");
  if (g_o.rounds != 1 && (g_o.mode != M_TSNET_LAT || g_o.rounds < 1 || g_o.rounds > 20)) die("--rounds R is for tsnet-lat, R 1 .. 20");
  if ((g_o.size + MIN_STRIPE - 1) / MIN_STRIPE > MAX_PARTS) die("--size too large for the stripe table");

  // Two pipes: A -> B and B -> A.
  int ab[2], ba[2];
  if (pipe(ab) || pipe(ba)) die("pipe: %s", strerror(errno));
  fflush(stdout);
  fflush(stderr);
  pid_t pb = fork();
  if (pb < 0) die("fork: %s", strerror(errno));
  if (pb == 0) {
    close(ab[1]), close(ba[0]);
    role_main(0, (Chan){.rfd = ab[0], .wfd = ba[1]});
  }
  pid_t pa = fork();
  if (pa < 0) {
    kill(pb, SIGKILL);
    die("fork: %s", strerror(errno));
  }
  if (pa == 0) {
    close(ab[0]), close(ba[1]);
    role_main(1, (Chan){.rfd = ba[0], .wfd = ab[1]});
  }
  close(ab[0]), close(ab[1]), close(ba[0]), close(ba[1]);

  // Wait for both; when one fails, the other is stopped.
  double end = now_s() + g_o.rounds * (g_o.warmup + g_o.duration + 4 * g_o.timeout) + 5;
  int left = 2, failed = 0;
  pid_t pids[2] = {pa, pb};
  const char* names[2] = {"A", "B"};
  while (left) {
    int status = 0;
    pid_t w = waitpid(-1, &status, WNOHANG);
    if (w == 0) {
      if (now_s() > end) {
        fprintf(stderr, "tsnet-bench: the measurement did not finish in time; stopping it\n");
        for (int i = 0; i < 2; i++)
          if (pids[i] > 0) kill(pids[i], SIGKILL);
        failed = 1;
        end = now_s() + 5;
      }
      usleep(2000);
      continue;
    }
    if (w < 0) break;
    for (int i = 0; i < 2; i++)
      if (pids[i] == w) {
        pids[i] = 0;
        left--;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) {
          if (WIFSIGNALED(status)) {
            fprintf(stderr, "tsnet-bench: process %s died of signal %d\n", names[i], WTERMSIG(status));
            shm_sweep(w, names[i]);  // it could not clean up after itself
          }
          failed = 1;
          for (int j = 0; j < 2; j++)
            if (pids[j] > 0) kill(pids[j], SIGKILL);
        }
      }
  }
  return failed ? 1 : 0;
}
