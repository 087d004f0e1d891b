// tsnet's C driver: dlopens the built plugin like NCCL does and runs scenarios through any
// exported version's table (v6..v12), printing one TAP-like line per check.
//
//   driver <scenario|all> [--version N] [--lib PATH] [--procs 1|2] [--dev D] [--timeout S] [--verbose]
//
// Pair scenarios (transfer, inflight, grouped, marker) are written as a sender role and a
// receiver role, each a non-blocking step function, joined by a small message channel (a
// pipe). With --procs 1 both roles live in one process and their steps are interleaved;
// with --procs 2 the driver forks: the parent is the receiver (listen, accept), the child
// the sender (connect); each loads the library itself. The other scenarios (tables,
// badinput, lifecycle) run in one process.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

// ---------------------------------------------------------------- reporting

static int g_pass, g_fail;
static char g_prefix[96];  // "v11 transfer [recv]"
static double g_timeout = 20.0;
static int g_verbose;
static const char* g_lib = "build/libnccl-net-tsnet.so";
static int g_dev;

static void set_prefix(int version, const char* scenario, const char* role) {
  snprintf(g_prefix, sizeof g_prefix, "v%d %s%s%s%s", version, scenario, role ? " [" : "", role ? role : "",
           role ? "]" : "");
}

__attribute__((format(printf, 2, 3))) static int check(int cond, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("%s - %s: %s\n", cond ? "ok" : "not ok", g_prefix, msg);
  if (cond) g_pass++;
  else g_fail++;
  return cond;
}

__attribute__((format(printf, 1, 2))) static void note(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("# %s: %s\n", g_prefix, msg);
}

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (!g_verbose && level != TSN_LOG_WARN && level != TSN_LOG_ABORT) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[%d] %s: log %d: %s\n", (int)getpid(), g_prefix, level, msg);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// A watchdog for calls that block (close, dlopen...): a hang becomes a failure, not a stuck test.
static void on_alarm(int sig) {
  (void)sig;
  char buf[160];
  int k = snprintf(buf, sizeof buf, "not ok - %s: watchdog: still running after the scenario's time limit\n", g_prefix);
  if (k > 0) {
    ssize_t w = write(1, buf, (size_t)k);
    (void)w;
  }
  _exit(3);
}

static void watchdog(double seconds) {
  signal(SIGALRM, on_alarm);
  alarm(seconds > 0 ? (unsigned)seconds + 1 : 0);
}

// ---------------------------------------------------------------- data patterns

static uint32_t seed_of(size_t size, int index, int salt) {
  return (uint32_t)(size * 2654435761u) ^ (uint32_t)(index * 40503 + 1) ^ (uint32_t)(salt * 0x9e3779b9u);
}

static void fill(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    if ((i & 3) == 0) x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> (8 * (i & 3)));
  }
}

// First offset where p differs from the pattern, or -1.
static long mismatch(const uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed | 1;
  for (size_t i = 0; i < n; i++) {
    if ((i & 3) == 0) x = x * 1664525u + 1013904223u;
    if (p[i] != (uint8_t)(x >> (8 * (i & 3)))) return (long)i;
  }
  return -1;
}

#define GUARD 0xA5
// First offset in [from, to) whose byte is not GUARD, or -1.
static long guard_broken(const uint8_t* p, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (p[i] != GUARD) return (long)i;
  return -1;
}

// ---------------------------------------------------------------- the channel between roles

enum { MSG_HANDLE = 1, MSG_DONE = 2, MSG_ABORT = 3 };
typedef struct Msg {
  int32_t kind;
  int32_t len;
  uint8_t data[TSN_HANDLE_SIZE];
} Msg;  // < PIPE_BUF: writes are atomic, so a non-blocking read sees whole messages

typedef struct Chan {
  int rfd, wfd;
} Chan;

static void chan_put(Chan* c, int kind, const void* data, int len) {
  Msg m;
  memset(&m, 0, sizeof m);
  m.kind = kind;
  m.len = len;
  if (data && len > 0) memcpy(m.data, data, (size_t)len);
  ssize_t w;
  do w = write(c->wfd, &m, sizeof m);
  while (w < 0 && errno == EINTR);
}

// 1: a message; 0: none yet; -1: the peer closed its end.
static int chan_get(Chan* c, Msg* m) {
  ssize_t r = read(c->rfd, m, sizeof *m);
  if (r == (ssize_t)sizeof *m) return 1;
  if (r == 0) return -1;
  return 0;
}

// Two pipes: a carries sender -> receiver, b receiver -> sender.
static int chan_pair(Chan* snd, Chan* rcv) {
  int a[2], b[2];
  if (pipe(a) || pipe(b)) return -1;
  fcntl(a[0], F_SETFL, O_NONBLOCK);
  fcntl(b[0], F_SETFL, O_NONBLOCK);
  snd->rfd = b[0];
  snd->wfd = a[1];
  rcv->rfd = a[0];
  rcv->wfd = b[1];
  return 0;
}

static void chan_close(Chan* c) {
  if (c->rfd >= 0) close(c->rfd);
  if (c->wfd >= 0) close(c->wfd);
  c->rfd = c->wfd = -1;
}

// ---------------------------------------------------------------- roles

#define ROLE_MAX_MR 4
#define ROLE_MAX_BUF 4

typedef struct Role Role;
typedef struct RoleOps {
  int (*setup)(Role*);  // after the comm exists: allocate, register; 0 = ok
  int (*step)(Role*);   // 0 = more to do, 1 = done, -1 = failed
} RoleOps;

typedef struct PairScenario {
  const char* name;
  RoleOps send, recv;
} PairScenario;

enum { PH_CONNECT, PH_BODY, PH_WAITPEER, PH_CLEANUP, PH_FINISHED };

struct Role {
  const Net* net;
  void* ctx;
  int dev;
  int sender;
  int param;  // scenario variant
  Chan ch;
  const RoleOps* ops;
  int phase;
  double deadline;
  void* lc;
  void* comm;
  int have_handle;
  uint8_t handle[TSN_HANDLE_SIZE];
  int peer_done, peer_gone, aborted;
  void* mr[ROLE_MAX_MR];
  int nmr;
  void* buf[ROLE_MAX_BUF];
  int nbuf;
  void* st;  // scenario state (malloc'd, freed at cleanup)
};

static void* role_alloc(Role* r, size_t size) {
  void* p = malloc(size ? size : 1);
  if (p && r->nbuf < ROLE_MAX_BUF) r->buf[r->nbuf++] = p;
  return p;
}

static void* role_reg(Role* r, void* data, size_t size) {
  void* mh = NULL;
  tsn_result_t rc = shim_reg_mr(r->net, r->comm, data, size, TSN_PTR_HOST, &mh);
  if (!check(rc == TSN_SUCCESS && mh, "regMr of %zu host bytes (rc %d)", size, rc)) return NULL;
  if (r->nmr < ROLE_MAX_MR) r->mr[r->nmr++] = mh;
  return mh;
}

static void role_abort(Role* r, const char* why) {
  check(0, "%s", why);
  if (!r->peer_gone) chan_put(&r->ch, MSG_ABORT, NULL, 0);
  r->aborted = 1;
  r->phase = PH_CLEANUP;
}

static void role_set_prefix(Role* r, const char* scenario) {
  set_prefix(r->net->version, scenario, r->sender ? "send" : "recv");
}

// One step of a role; returns 1 once the role has finished (comm closed).
static int role_step(Role* r, const char* scenario) {
  role_set_prefix(r, scenario);
  if (r->phase == PH_FINISHED) return 1;
  Msg m;
  int got;
  while (!r->peer_gone && (got = chan_get(&r->ch, &m)) != 0) {
    if (got < 0) {
      r->peer_gone = 1;
      if (r->phase < PH_CLEANUP && !r->peer_done) role_abort(r, "the peer role went away before it was done");
      break;
    }
    if (m.kind == MSG_HANDLE && m.len == TSN_HANDLE_SIZE) {
      memcpy(r->handle, m.data, TSN_HANDLE_SIZE);
      r->have_handle = 1;
    } else if (m.kind == MSG_DONE) {
      r->peer_done = 1;
    } else if (m.kind == MSG_ABORT) {
      r->peer_gone = 1;  // it will not answer any more
      if (r->phase < PH_CLEANUP) role_abort(r, "the peer role failed, so this one stops too");
    }
  }
  if (r->phase < PH_CLEANUP && now_s() > r->deadline) {
    static const char* names[] = {"connect", "body", "waiting for the peer"};
    char why[96];
    snprintf(why, sizeof why, "timed out after %.0f s in phase '%s'", g_timeout, names[r->phase]);
    role_abort(r, why);
  }
  switch (r->phase) {
    case PH_CONNECT: {
      tsn_result_t rc;
      if (!r->sender) {
        if (!r->lc) {
          uint8_t handle[TSN_HANDLE_SIZE];
          memset(handle, 0, sizeof handle);
          rc = shim_listen(r->net, r->ctx, r->dev, handle, &r->lc);
          if (!check(rc == TSN_SUCCESS && r->lc, "listen on dev %d (rc %d)", r->dev, rc)) {
            r->lc = NULL;
            role_abort(r, "cannot listen");
            break;
          }
          chan_put(&r->ch, MSG_HANDLE, handle, TSN_HANDLE_SIZE);
        }
        rc = shim_accept(r->net, r->lc, &r->comm);
        if (rc != TSN_SUCCESS) {
          check(0, "accept returned %d", rc);
          r->comm = NULL;
          role_abort(r, "cannot accept");
          break;
        }
      } else {
        if (!r->have_handle) break;
        rc = shim_connect(r->net, r->ctx, r->dev, r->handle, &r->comm);
        if (rc != TSN_SUCCESS) {
          check(0, "connect returned %d", rc);
          r->comm = NULL;
          role_abort(r, "cannot connect");
          break;
        }
      }
      if (!r->comm) break;
      check(1, "%s gave a comm", r->sender ? "connect" : "accept");
      if (r->ops->setup(r) != 0) {
        role_abort(r, "scenario setup failed");
        break;
      }
      r->phase = PH_BODY;
      r->deadline = now_s() + g_timeout;
      break;
    }
    case PH_BODY: {
      int s = r->ops->step(r);
      if (s < 0) role_abort(r, "scenario step failed");
      if (s > 0) {
        chan_put(&r->ch, MSG_DONE, NULL, 0);
        r->phase = PH_WAITPEER;
        r->deadline = now_s() + g_timeout;
      }
      break;
    }
    case PH_WAITPEER:
      if (r->peer_done) r->phase = PH_CLEANUP;
      break;
  }
  if (r->phase == PH_CLEANUP) {
    // Normal end: deregister, then close. After a failure requests may be in flight: close
    // first (the plugin must stop touching our memory), and skip deregMr on a closed comm.
    if (!r->aborted)
      for (int i = 0; i < r->nmr; i++) {
        tsn_result_t rc = shim_dereg_mr(r->net, r->comm, r->mr[i]);
        check(rc == TSN_SUCCESS, "deregMr (rc %d)", rc);
      }
    if (r->comm) {
      tsn_result_t rc = r->sender ? shim_close_send(r->net, r->comm) : shim_close_recv(r->net, r->comm);
      check(r->aborted || rc == TSN_SUCCESS, "%s (rc %d)", r->sender ? "closeSend" : "closeRecv", rc);
    }
    if (r->lc) {
      tsn_result_t rc = shim_close_listen(r->net, r->lc);
      check(r->aborted || rc == TSN_SUCCESS, "closeListen (rc %d)", rc);
    }
    r->comm = r->lc = NULL;
    for (int i = 0; i < r->nbuf; i++) free(r->buf[i]);
    free(r->st);
    r->st = NULL;
    r->nbuf = r->nmr = 0;
    r->phase = PH_FINISHED;
    return 1;
  }
  return 0;
}

static void role_init(Role* r, const Net* net, void* ctx, int sender, int param, const PairScenario* sc, Chan ch) {
  memset(r, 0, sizeof *r);
  r->net = net;
  r->ctx = ctx;
  r->dev = g_dev;
  r->sender = sender;
  r->param = param;
  r->ch = ch;
  r->ops = sender ? &sc->send : &sc->recv;
  r->phase = PH_CONNECT;
  r->deadline = now_s() + g_timeout;
}

// Both roles in this process, their steps interleaved; ctx per role (v11+: two ranks' contexts).
static void run_pair_inproc(const Net* net, void* sctx, void* rctx, const PairScenario* sc, int param) {
  Chan cs, cr;
  if (chan_pair(&cs, &cr)) {
    check(0, "pipe: %s", strerror(errno));
    return;
  }
  Role s, r;
  role_init(&s, net, sctx, 1, param, sc, cs);
  role_init(&r, net, rctx, 0, param, sc, cr);
  int sd = 0, rd = 0;
  while (!sd || !rd) {
    if (!rd) rd = role_step(&r, sc->name);
    if (!sd) sd = role_step(&s, sc->name);
  }
  chan_close(&cs);
  chan_close(&cr);
}

// ---------------------------------------------------------------- helpers for requests

// Tests until done, an error or the deadline; returns the test result (or -1 on timeout).
static tsn_result_t wait_req(const Net* n, void* req, int* sizes, double timeout) {
  double end = now_s() + timeout;
  int done = 0;
  while (now_s() < end) {
    tsn_result_t rc = shim_test(n, req, &done, sizes);
    if (rc != TSN_SUCCESS || done) return rc;
  }
  return -1;
}

// ---------------------------------------------------------------- transfer / marker

static const size_t k_transfer_sizes[] = {0, 1, 7, 8, 4095, 4096, 65536, 65537, (1 << 20) + 3, 4 << 20};
static const size_t k_marker_sizes[] = {1, 64, 4096, 65536};
static const size_t k_quick_sizes[] = {0, 1, 65537};
#define TRANSFER_EXTRA 4096
#define TRANSFER_TAG 3

enum { P_TRANSFER = 0, P_MARKER = 1, P_QUICK = 2 };

typedef struct XferState {
  const size_t* sizes;
  int count;
  int i;
  void* req;
  int posted;
  uint8_t* buf;
  size_t cap;
  void* mh;
  long nulls;
} XferState;

static void xfer_sizes(int param, const size_t** sizes, int* count) {
  if (param == P_MARKER) *sizes = k_marker_sizes, *count = 4;
  else if (param == P_QUICK) *sizes = k_quick_sizes, *count = 3;
  else *sizes = k_transfer_sizes, *count = (int)(sizeof k_transfer_sizes / sizeof *k_transfer_sizes);
}

static int xfer_setup(Role* r) {
  XferState* x = calloc(1, sizeof *x);
  r->st = x;
  xfer_sizes(r->param, &x->sizes, &x->count);
  size_t max = 0;
  for (int i = 0; i < x->count; i++)
    if (x->sizes[i] > max) max = x->sizes[i];
  x->cap = max + (r->sender ? 0 : TRANSFER_EXTRA + 64);
  x->buf = role_alloc(r, x->cap);
  if (!x->buf) return -1;
  memset(x->buf, GUARD, x->cap);
  x->mh = role_reg(r, x->buf, x->cap);
  return x->mh ? 0 : -1;
}

static int xfer_send_step(Role* r) {
  XferState* x = r->st;
  if (x->i == x->count) return 1;
  size_t size = x->sizes[x->i];
  if (!x->req) {
    if (!x->posted) fill(x->buf, size, seed_of(size, x->i, 0));
    x->posted = 1;
    tsn_result_t rc = shim_isend(r->net, r->comm, x->buf, size, TRANSFER_TAG, x->mh, &x->req);
    if (!check(rc == TSN_SUCCESS || !x->req, "isend %zu bytes (rc %d)", size, rc) || rc) return -1;
    if (!x->req) x->nulls++;
    return 0;
  }
  int done = 0, got = -1;
  tsn_result_t rc = shim_test(r->net, x->req, &done, &got);
  if (rc != TSN_SUCCESS) return check(0, "test of the isend of %zu bytes returned %d", size, rc), -1;
  if (!done) return 0;
  check(got == (int)size, "send of %zu bytes: test reports size %d", size, got);
  x->req = NULL;
  x->posted = 0;
  x->i++;
  return x->i == x->count;
}

static int xfer_recv_step(Role* r) {
  XferState* x = r->st;
  if (x->i == x->count) return 1;
  size_t size = x->sizes[x->i];
  if (!x->req) {
    if (!x->posted) memset(x->buf, GUARD, x->cap);
    x->posted = 1;
    void* data = x->buf;
    size_t room = size + TRANSFER_EXTRA;
    int tag = TRANSFER_TAG;
    if (r->param == P_MARKER) x->req = (void*)0x1;  // NCCL's optional completion marker (LL/LL128)
    tsn_result_t rc = shim_irecv(r->net, r->comm, 1, &data, &room, &tag, &x->mh, &x->req);
    if (r->param == P_MARKER) {
      check(x->req != (void*)0x1, "irecv of %zu bytes overwrote the 0x1 marker in *request (now %p)", room, x->req);
      if (x->req == (void*)0x1) return -1;
    }
    if (!check(rc == TSN_SUCCESS, "irecv of room %zu (rc %d)", room, rc)) return -1;
    if (!x->req) x->nulls++;
    return 0;
  }
  int done = 0, got = -1;
  tsn_result_t rc = shim_test(r->net, x->req, &done, &got);
  if (rc != TSN_SUCCESS) return check(0, "test of the irecv for %zu bytes returned %d", size, rc), -1;
  if (!done) return 0;
  check(got == (int)size, "recv of %zu bytes: test reports size %d", size, got);
  long bad = mismatch(x->buf, size, seed_of(size, x->i, 0));
  check(bad < 0, "recv of %zu bytes: data equal (first difference at %ld)", size, bad);
  long g = guard_broken(x->buf, size, x->cap);
  check(g < 0, "recv of %zu bytes: bytes after the message untouched (first changed at %ld)", size, g);
  x->req = NULL;
  x->posted = 0;
  x->i++;
  if (x->i == x->count && x->nulls) note("irecv returned a NULL request %ld times (retried)", x->nulls);
  return x->i == x->count;
}

static const PairScenario TRANSFER = {"transfer", {xfer_setup, xfer_send_step}, {xfer_setup, xfer_recv_step}};
static const PairScenario MARKER = {"marker", {xfer_setup, xfer_send_step}, {xfer_setup, xfer_recv_step}};

// ---------------------------------------------------------------- inflight

#define INFLIGHT 32
#define INFLIGHT_EXTRA 512

typedef struct InflightState {
  size_t size[INFLIGHT];
  size_t off[INFLIGHT];  // slot offsets in buf
  void* req[INFLIGHT];
  int done[INFLIGHT];
  int posted, ndone, steps;
  long nulls;
  uint8_t* buf;
  size_t cap;
  void* mh;
} InflightState;

static size_t inflight_size(int i) { return 1 + (size_t)((i * 37) % INFLIGHT) * 4099 + (size_t)i; }

static int inflight_setup(Role* r) {
  InflightState* s = calloc(1, sizeof *s);
  r->st = s;
  size_t off = 0;
  for (int i = 0; i < INFLIGHT; i++) {
    s->size[i] = inflight_size(i);
    s->off[i] = off;
    off += s->size[i] + (r->sender ? 0 : INFLIGHT_EXTRA);
  }
  s->cap = off;
  s->buf = role_alloc(r, s->cap);
  if (!s->buf) return -1;
  memset(s->buf, GUARD, s->cap);
  if (r->sender)
    for (int i = 0; i < INFLIGHT; i++) fill(s->buf + s->off[i], s->size[i], seed_of(s->size[i], i, 1));
  s->mh = role_reg(r, s->buf, s->cap);
  return s->mh ? 0 : -1;
}

static int inflight_step(Role* r) {
  InflightState* s = r->st;
  int first = s->steps++ == 0;
  // Post everything possible; a NULL request means "try again" (then test meanwhile).
  while (s->posted < INFLIGHT) {
    int i = s->posted;
    tsn_result_t rc;
    if (r->sender) {
      rc = shim_isend(r->net, r->comm, s->buf + s->off[i], s->size[i], i, s->mh, &s->req[i]);
    } else {
      void* data = s->buf + s->off[i];
      size_t room = s->size[i] + INFLIGHT_EXTRA;
      int tag = i;
      rc = shim_irecv(r->net, r->comm, 1, &data, &room, &tag, &s->mh, &s->req[i]);
    }
    if (rc != TSN_SUCCESS) return check(0, "%s #%d returned %d", r->sender ? "isend" : "irecv", i, rc), -1;
    if (!s->req[i]) {
      s->nulls++;
      break;
    }
    s->posted++;
  }
  if (first && s->posted == INFLIGHT) {
    check(1, "all %d %s posted before testing any", INFLIGHT, r->sender ? "sends" : "receives");
    return 0;
  }
  for (int i = 0; i < s->posted; i++) {
    if (s->done[i]) continue;
    int done = 0, got = -1;
    tsn_result_t rc = shim_test(r->net, s->req[i], &done, &got);
    if (rc != TSN_SUCCESS) return check(0, "test of #%d returned %d", i, rc), -1;
    if (!done) continue;
    s->done[i] = 1;
    s->ndone++;
    int ok = check(got == (int)s->size[i], "#%d (%zu bytes): test reports size %d", i, s->size[i], got);
    if (!r->sender) {
      long bad = mismatch(s->buf + s->off[i], s->size[i], seed_of(s->size[i], i, 1));
      long g = guard_broken(s->buf + s->off[i], s->size[i], s->size[i] + INFLIGHT_EXTRA);
      ok &= check(bad < 0 && g < 0, "#%d: data equal (first difference %ld), bytes after it untouched (%ld)", i, bad, g);
    }
    (void)ok;
  }
  if (s->ndone == INFLIGHT) {
    if (s->nulls) note("%ld NULL requests retried", s->nulls);
    return 1;
  }
  return 0;
}

static const PairScenario INFLIGHT_SC = {"inflight", {inflight_setup, inflight_step}, {inflight_setup, inflight_step}};

// ---------------------------------------------------------------- grouped

#define GROUP_ROUNDS 20
#define GROUP_SLOT 65536
#define GROUP_SLACK 256

static size_t group_size(int round, int tag) {
  // Distinct per buffer: tag picks a band, the round moves within it.
  return 100 + (size_t)tag * 7000 + (size_t)((round * 2654435761u + (unsigned)tag * 97u) % 6000u);
}

typedef struct GroupState {
  int n, round;
  int order[TSN_MAX_RECVS];  // sender: tags in posting order
  void* req[TSN_MAX_RECVS];
  int done[TSN_MAX_RECVS];
  int posted, ndone;
  uint8_t* buf;
  size_t cap;
  void* mh;
  long nulls;
} GroupState;

static int group_setup(Role* r) {
  GroupState* g = calloc(1, sizeof *g);
  r->st = g;
  g->n = r->param;
  g->cap = (size_t)g->n * (GROUP_SLOT + GROUP_SLACK);
  g->buf = role_alloc(r, g->cap);
  if (!g->buf) return -1;
  memset(g->buf, GUARD, g->cap);
  g->mh = role_reg(r, g->buf, g->cap);
  return g->mh ? 0 : -1;
}

static uint8_t* group_slot(GroupState* g, int t) { return g->buf + (size_t)t * (GROUP_SLOT + GROUP_SLACK); }

static void group_shuffle(GroupState* g) {
  uint32_t x = 0x12345u + (uint32_t)g->round * 7919u + (uint32_t)g->n;
  for (int t = 0; t < g->n; t++) g->order[t] = t;
  for (int t = g->n - 1; t > 0; t--) {
    x = x * 1664525u + 1013904223u;
    int j = (int)((x >> 8) % (uint32_t)(t + 1));
    int k = g->order[t];
    g->order[t] = g->order[j];
    g->order[j] = k;
  }
  if (g->order[0] == 0 && g->n > 1) {  // never the identity's first element: keep it shuffled
    int k = g->order[0];
    g->order[0] = g->order[1];
    g->order[1] = k;
  }
}

static int group_send_step(Role* r) {
  GroupState* g = r->st;
  if (g->round == GROUP_ROUNDS) return 1;
  if (g->posted == 0 && g->ndone == 0 && !g->req[0]) {
    group_shuffle(g);
    for (int t = 0; t < g->n; t++) fill(group_slot(g, t), group_size(g->round, t), seed_of(0, t, 100 + g->round));
  }
  while (g->posted < g->n) {
    int t = g->order[g->posted];
    size_t size = group_size(g->round, t);
    tsn_result_t rc = shim_isend(r->net, r->comm, group_slot(g, t), size, t, g->mh, &g->req[g->posted]);
    if (rc != TSN_SUCCESS) return check(0, "round %d: isend tag %d returned %d", g->round, t, rc), -1;
    if (!g->req[g->posted]) {
      g->nulls++;
      break;
    }
    g->posted++;
  }
  for (int k = 0; k < g->posted; k++) {
    if (g->done[k]) continue;
    int done = 0, got = -1;
    tsn_result_t rc = shim_test(r->net, g->req[k], &done, &got);
    if (rc != TSN_SUCCESS) return check(0, "round %d: test of send #%d returned %d", g->round, k, rc), -1;
    if (!done) continue;
    g->done[k] = 1;
    g->ndone++;
    int t = g->order[k];
    if (got != (int)group_size(g->round, t))
      check(0, "n=%d round %d: send tag %d: test reports %d, sent %zu", g->n, g->round, t, got, group_size(g->round, t));
  }
  if (g->ndone < g->n) return 0;
  if (g->round == GROUP_ROUNDS - 1) check(1, "n=%d: %d rounds of %d sends in shuffled tag order completed", g->n, GROUP_ROUNDS, g->n);
  g->round++;
  g->posted = g->ndone = 0;
  memset(g->req, 0, sizeof g->req);
  memset(g->done, 0, sizeof g->done);
  return g->round == GROUP_ROUNDS;
}

static int group_recv_step(Role* r) {
  GroupState* g = r->st;
  if (g->round == GROUP_ROUNDS) return 1;
  if (!g->req[0]) {
    memset(g->buf, GUARD, g->cap);
    void* data[TSN_MAX_RECVS];
    size_t room[TSN_MAX_RECVS];
    int tags[TSN_MAX_RECVS];
    void* mhs[TSN_MAX_RECVS];
    for (int t = 0; t < g->n; t++) {
      data[t] = group_slot(g, t);
      room[t] = GROUP_SLOT - (size_t)t * 8;  // capacities differ too
      tags[t] = t;
      mhs[t] = g->mh;
    }
    tsn_result_t rc = shim_irecv(r->net, r->comm, g->n, data, room, tags, mhs, &g->req[0]);
    if (rc != TSN_SUCCESS) return check(0, "round %d: irecv n=%d returned %d", g->round, g->n, rc), -1;
    if (!g->req[0]) g->nulls++;
    return 0;
  }
  int sizes[TSN_MAX_RECVS + 1];
  for (int t = 0; t <= TSN_MAX_RECVS; t++) sizes[t] = -7;
  int done = 0;
  tsn_result_t rc = shim_test(r->net, g->req[0], &done, sizes);
  if (rc != TSN_SUCCESS) return check(0, "round %d: test of irecv n=%d returned %d", g->round, g->n, rc), -1;
  if (!done) return 0;
  int ok = 1;
  for (int t = 0; t < g->n; t++) {
    size_t want = group_size(g->round, t);
    uint8_t* p = group_slot(g, t);
    long bad = mismatch(p, want, seed_of(0, t, 100 + g->round));
    long gb = guard_broken(p, want, GROUP_SLOT + GROUP_SLACK);
    if (sizes[t] != (int)want || bad >= 0 || gb >= 0) {
      ok = 0;
      check(0, "n=%d round %d buffer %d (tag %d): size %d want %zu; data first difference %ld; guard first change %ld",
            g->n, g->round, t, t, sizes[t], want, bad, gb);
    }
  }
  if (g->n <= TSN_MAX_RECVS && sizes[g->n] != -7) ok = 0, check(0, "n=%d: test wrote sizes beyond n", g->n);
  if (ok) check(1, "n=%d round %d: %d buffers got the messages of their tags, sizes in buffer order", g->n, g->round, g->n);
  g->req[0] = NULL;
  g->round++;
  if (g->round == GROUP_ROUNDS && g->nulls) note("%ld NULL requests retried", g->nulls);
  return g->round == GROUP_ROUNDS;
}

static const PairScenario GROUPED = {"grouped", {group_setup, group_send_step}, {group_setup, group_recv_step}};

// ---------------------------------------------------------------- library, init, two processes

static int open_net(Net* n, int version) {
  char err[512];
  if (shim_open(n, g_lib, version, err, sizeof err) != 0) {
    check(0, "load: %s", err);
    return -1;
  }
  return 0;
}

static int init_ctx(const Net* n, void** ctx, uint64_t commId) {
  *ctx = NULL;
  tsn_result_t rc = shim_init(n, ctx, commId, logger);
  if (!check(rc == TSN_SUCCESS, "init (rc %d)", rc)) return -1;
  if (shim_has_ctx(n->version) && !check(*ctx != NULL, "init gave a context")) return -1;
  return 0;
}

static void fini_ctx(const Net* n, void* ctx) {
  if (!shim_has_ctx(n->version) || !ctx) return;
  tsn_result_t rc = shim_finalize(n, ctx);
  check(rc == TSN_SUCCESS, "finalize (rc %d)", rc);
}

static int max_recvs(const Net* n) {
  uint8_t raw[256];
  tsn_props_t p;
  if (shim_get_properties_raw(n, g_dev, raw) != TSN_SUCCESS) return 1;
  shim_props_to_neutral(n->version, raw, &p);
  return p.maxRecvs;
}

#define COMM_ID 0x74736e6574300001ULL

static int g_procs = 1;

// One role in a forked process: it loads the library itself; reports its counts on resfd.
static void __attribute__((noreturn)) role_process(int version, const PairScenario* sc, int param, int sender, Chan ch,
                                                   int resfd) {
  g_pass = g_fail = 0;
  set_prefix(version, sc->name, sender ? "send" : "recv");
  Net n;
  void* ctx = NULL;
  if (open_net(&n, version) == 0) {
    if (init_ctx(&n, &ctx, COMM_ID) == 0) {
      Role r;
      role_init(&r, &n, ctx, sender, param, sc, ch);
      while (!role_step(&r, sc->name)) {
      }
      set_prefix(version, sc->name, sender ? "send" : "recv");
      fini_ctx(&n, ctx);
    } else {
      chan_put(&ch, MSG_ABORT, NULL, 0);
    }
    shim_close(&n);
  } else {
    chan_put(&ch, MSG_ABORT, NULL, 0);
  }
  int counts[2] = {g_pass, g_fail};
  ssize_t w = write(resfd, counts, sizeof counts);
  (void)w;
  fflush(stdout);
  _exit(g_fail ? 1 : 0);
}

// Waits (at most until `end`) for a role process and folds its results in.
static void reap_role(pid_t pid, int resfd, const char* what, double end) {
  int status = 0;
  pid_t w;
  while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < end) usleep(1000);
  if (w == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    check(0, "the %s process (pid %d) did not exit in time: killed", what, (int)pid);
  }
  int counts[2] = {0, 0};
  ssize_t got = read(resfd, counts, sizeof counts);
  close(resfd);
  if (got == (ssize_t)sizeof counts) {
    g_pass += counts[0];
    g_fail += counts[1];
  }
  if (WIFSIGNALED(status))
    check(0, "the %s process died of signal %d", what, WTERMSIG(status));
  else
    check(got == (ssize_t)sizeof counts && WIFEXITED(status),
          "the %s process reported its results (exit status %d, %d passed, %d failed)", what,
          WIFEXITED(status) ? WEXITSTATUS(status) : -1, counts[0], counts[1]);
}

// Runs a pair scenario in one process, or in two: --procs 2 forks a receiver process (listen,
// accept) and a sender process (connect); the handle goes from one to the other over the
// channel. Both are children of a coordinator that never loads the library: a process whose
// plugin has started its Node thread cannot fork a child that uses the plugin (the thread
// does not survive fork), so the caller must stay clean to run several pairs in a row.
static void run_pair(int version, const PairScenario* sc, int param) {
  set_prefix(version, sc->name, NULL);
  if (g_procs == 1) {
    Net n;
    if (open_net(&n, version)) return;
    void *sctx = NULL, *rctx = NULL;
    if (init_ctx(&n, &rctx, COMM_ID) == 0 && (!shim_has_ctx(version) || init_ctx(&n, &sctx, COMM_ID) == 0)) {
      if (!shim_has_ctx(version)) sctx = rctx;
      run_pair_inproc(&n, sctx, rctx, sc, param);
    }
    set_prefix(version, sc->name, NULL);
    fini_ctx(&n, sctx);
    fini_ctx(&n, rctx);
    shim_close(&n);
    return;
  }
  Chan cs, cr;
  int rres[2], sres[2];
  if (chan_pair(&cs, &cr) || pipe(rres) || pipe(sres)) {
    check(0, "pipe: %s", strerror(errno));
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t rpid = fork();
  if (rpid == 0) {
    chan_close(&cs);
    close(rres[0]);
    close(sres[0]);
    close(sres[1]);
    role_process(version, sc, param, 0, cr, rres[1]);
  }
  pid_t spid = rpid > 0 ? fork() : -1;
  if (spid == 0) {
    chan_close(&cr);
    close(sres[0]);
    close(rres[0]);
    close(rres[1]);
    role_process(version, sc, param, 1, cs, sres[1]);
  }
  chan_close(&cs);
  chan_close(&cr);
  close(rres[1]);
  close(sres[1]);
  if (rpid < 0 || spid < 0) {
    check(0, "fork: %s", strerror(errno));
    if (rpid > 0) kill(rpid, SIGKILL), waitpid(rpid, NULL, 0);
    close(rres[0]);
    close(sres[0]);
    return;
  }
  // Each role fails its own waits after g_timeout per phase; this is the backstop.
  double end = now_s() + 4 * g_timeout;
  reap_role(spid, sres[0], "sender", end);
  reap_role(rpid, rres[0], "receiver", end);
}

// ---------------------------------------------------------------- one-process helpers

// listen/connect/accept in this process, polling both; 0 on success.
static int pair_open(const Net* n, void* ctx, void** lc, void** sc, void** rc) {
  uint8_t handle[TSN_HANDLE_SIZE];
  memset(handle, 0, sizeof handle);
  *lc = *sc = *rc = NULL;
  tsn_result_t r = shim_listen(n, ctx, g_dev, handle, lc);
  if (!check(r == TSN_SUCCESS && *lc, "listen (rc %d)", r)) return -1;
  double end = now_s() + g_timeout;
  while ((!*sc || !*rc) && now_s() < end) {
    if (!*sc && (r = shim_connect(n, ctx, g_dev, handle, sc)) != TSN_SUCCESS) return check(0, "connect (rc %d)", r), -1;
    if (!*rc && (r = shim_accept(n, *lc, rc)) != TSN_SUCCESS) return check(0, "accept (rc %d)", r), -1;
  }
  return check(*sc && *rc, "connect and accept gave a comm pair") ? 0 : -1;
}

static void pair_close(const Net* n, void* lc, void* sc, void* rc, int expect_ok) {
  tsn_result_t a = sc ? shim_close_send(n, sc) : 0;
  tsn_result_t b = rc ? shim_close_recv(n, rc) : 0;
  tsn_result_t c = lc ? shim_close_listen(n, lc) : 0;
  if (expect_ok) check(a == 0 && b == 0 && c == 0, "closeSend, closeRecv, closeListen (rc %d, %d, %d)", a, b, c);
  else note("closeSend, closeRecv, closeListen returned %d, %d, %d", a, b, c);
}

// ---------------------------------------------------------------- tables

static void sc_tables(int version) {
  set_prefix(version, "tables", NULL);
  Net n;
  if (open_net(&n, version)) return;
  check(1, "symbol ncclNetPlugin_v%d resolves", version);
  check(n.name && strcmp(n.name, "tsnet") == 0, "name is \"tsnet\" (%s)", n.name ? n.name : "(null)");
  ShimSlots s;
  shim_slots(&n, &s);
  struct {
    const char* name;
    shim_fn_t p;
  } req[] = {{"init", s.init},         {"devices", s.devices},     {"getProperties", s.getProperties},
             {"listen", s.listen},     {"connect", s.connect},     {"accept", s.accept},
             {"regMr", s.regMr},       {"deregMr", s.deregMr},     {"isend", s.isend},
             {"irecv", s.irecv},       {"iflush", s.iflush},       {"test", s.test},
             {"closeSend", s.closeSend}, {"closeRecv", s.closeRecv}, {"closeListen", s.closeListen},
             {"finalize", s.finalize}};
  int nreq = (int)(sizeof req / sizeof *req) - (version >= 11 ? 0 : 1);
  int missing = 0;
  for (int i = 0; i < nreq; i++)
    if (!req[i].p) missing++, check(0, "slot %s is NULL", req[i].name);
  check(missing == 0, "all %d required slots are set", nreq);
  if (missing) {
    shim_close(&n);
    return;
  }
  if (version >= 7)
    check(!s.getDeviceMr && !s.irecvConsumed, "getDeviceMr and irecvConsumed are NULL (a host plugin)");
  void* ctx = NULL;
  if (init_ctx(&n, &ctx, COMM_ID)) {
    shim_close(&n);
    return;
  }
  int ndev = -1;
  tsn_result_t rc = shim_devices(&n, &ndev);
  check(rc == TSN_SUCCESS && ndev > 0, "devices (rc %d) reports %d > 0", rc, ndev);
  size_t psz = shim_props_size(version);
  enum { GUARD_BYTES = 64, MAXDEV = 64 };
  uint8_t raw[256 + GUARD_BYTES];
  char* names[MAXDEV];
  int nnames = 0;
  for (int d = 0; d < ndev && d < MAXDEV; d++) {
    memset(raw, 0xCD, sizeof raw);
    rc = shim_get_properties_raw(&n, d, raw);
    if (!check(rc == TSN_SUCCESS, "getProperties(%d) (rc %d)", d, rc)) continue;
    long g = -1;
    for (size_t i = psz; i < psz + GUARD_BYTES; i++)
      if (raw[i] != 0xCD) {
        g = (long)i;
        break;
      }
    check(g < 0, "getProperties(%d) wrote nothing past sizeof(props_v%d) = %zu (first write at %ld)", d, version, psz, g);
    tsn_props_t p;
    shim_props_to_neutral(version, raw, &p);
    int uniq = p.name != NULL;
    for (int k = 0; uniq && k < nnames; k++)
      if (strcmp(names[k], p.name) == 0) uniq = 0;
    check(uniq, "dev %d: name %s is non-NULL and unique", d, p.name ? p.name : "(null)");
    if (p.name && nnames < MAXDEV) names[nnames++] = p.name;
    check(p.ptrSupport & TSN_PTR_HOST, "dev %d: ptrSupport 0x%x has HOST", d, p.ptrSupport);
    check(p.speed > 0, "dev %d: speed %d > 0", d, p.speed);
    check(p.latency >= 0, "dev %d: latency %g >= 0", d, (double)p.latency);
    check(p.maxComms > 0, "dev %d: maxComms %d > 0", d, p.maxComms);
    check(p.maxRecvs >= 1 && p.maxRecvs <= TSN_MAX_RECVS, "dev %d: maxRecvs %d in 1..%d", d, p.maxRecvs, TSN_MAX_RECVS);
    if (version >= 7) check(p.netDeviceType == TSN_NET_DEVICE_HOST, "dev %d: netDeviceType %d is HOST", d, p.netDeviceType);
    if (version >= 9) {
      check(p.vProps.ndevs == 1 && p.vProps.devs[0] == d, "dev %d: vProps = {%d, {%d}}, want {1, {%d}}", d,
            p.vProps.ndevs, p.vProps.devs[0], d);
      check(p.maxP2pBytes > 0 && p.maxP2pBytes <= TSN_MAX_TRANSFER_BYTES, "dev %d: maxP2pBytes %zu in (0, 2^40]", d,
            p.maxP2pBytes);
      check(p.maxCollBytes > 0 && p.maxCollBytes <= TSN_MAX_TRANSFER_BYTES, "dev %d: maxCollBytes %zu in (0, 2^40]",
            d, p.maxCollBytes);
    }
    if (version >= 12)
      check(p.railId == TSN_UNSET && p.planeId == TSN_UNSET, "dev %d: railId %d, planeId %d are -1", d, p.railId,
            p.planeId);
  }
  int bad[] = {ndev, -1, ndev + 1000};
  for (int i = 0; i < 3; i++) {
    memset(raw, 0xCD, sizeof raw);
    rc = shim_get_properties_raw(&n, bad[i], raw);
    long g = -1;
    for (size_t k = psz; k < psz + GUARD_BYTES; k++)
      if (raw[k] != 0xCD) {
        g = (long)k;
        break;
      }
    check(rc != TSN_SUCCESS && g < 0, "getProperties(%d) fails (rc %d) and leaves the guard alone (%ld)", bad[i], rc, g);
  }
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- badinput

static void sc_badinput(int version) {
  set_prefix(version, "badinput", NULL);
  Net n;
  if (open_net(&n, version)) return;
  void* ctx = NULL;
  if (init_ctx(&n, &ctx, COMM_ID)) { shim_close(&n); return; }
  uint8_t raw[256];
  tsn_props_t props;
  int ndev = 0;
  shim_devices(&n, &ndev);
  tsn_result_t rc = shim_get_properties_raw(&n, g_dev, raw);
  shim_props_to_neutral(version, raw, &props);
  void *lc, *sc, *rcm;
  if (pair_open(&n, ctx, &lc, &sc, &rcm) == 0) {
    enum { SZ = 16384 };
    uint8_t* sbuf = malloc(SZ);
    uint8_t* rbuf = malloc(2 * 4096);
    fill(sbuf, SZ, 77);
    memset(rbuf, GUARD, 2 * 4096);
    // Memory kinds the device does not support.
    int kinds[] = {TSN_PTR_CUDA, TSN_PTR_DMABUF};
    for (int i = 0; i < 2; i++) {
      if (props.ptrSupport & kinds[i]) continue;
      void* mh = NULL;
      rc = shim_reg_mr(&n, sc, sbuf, SZ, kinds[i], &mh);
      check(rc != TSN_SUCCESS, "regMr with type 0x%x (not in ptrSupport 0x%x) fails (rc %d)", kinds[i],
            props.ptrSupport, rc);
      if (rc == TSN_SUCCESS && mh) shim_dereg_mr(&n, sc, mh);
    }
    void* smh = NULL;
    void* rmh = NULL;
    rc = shim_reg_mr(&n, sc, sbuf, 4096, TSN_PTR_HOST, &smh);  // only the first 4 KiB
    check(rc == TSN_SUCCESS, "regMr of the first 4 KiB of the send buffer (rc %d)", rc);
    rc = shim_reg_mr(&n, rcm, rbuf, 2 * 4096, TSN_PTR_HOST, &rmh);
    check(rc == TSN_SUCCESS, "regMr of the receive buffer (rc %d)", rc);
    // Buffers outside their region.
    struct {
      size_t off, len;
    } out[] = {{8192, 100}, {4000, 200}, {4096, 1}};
    for (int i = 0; i < 3; i++) {
      void* req = NULL;
      rc = shim_isend(&n, sc, sbuf + out[i].off, out[i].len, 0, smh, &req);
      check(rc != TSN_SUCCESS, "isend of [%zu, %zu) outside the registered [0, 4096) fails (rc %d)", out[i].off,
            out[i].off + out[i].len, rc);
    }
    // irecv with n out of range.
    void* data[9];
    size_t sizes[9];
    int tags[9];
    void* mhs[9];
    for (int i = 0; i < 9; i++) data[i] = rbuf, sizes[i] = 16, tags[i] = i, mhs[i] = rmh;
    int ns[] = {TSN_MAX_RECVS + 1, 0, -1};
    for (int i = 0; i < 3; i++) {
      void* req = NULL;
      rc = shim_irecv(&n, rcm, ns[i], data, sizes, tags, mhs, &req);
      check(rc != TSN_SUCCESS, "irecv with n = %d fails (rc %d)", ns[i], rc);
    }
    // test on a pointer that is not a request (readable memory, garbage content).
    uint64_t garbage[64];
    for (int i = 0; i < 64; i++) garbage[i] = 0x5a5a5a5a5a5a5a5aULL ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL;
    int done = 0, got[8];
    rc = shim_test(&n, garbage, &done, got);
    check(rc != TSN_SUCCESS, "test on a garbage pointer fails (rc %d)", rc);
    // A 16 KiB send into a 4 KiB receive: both end in an error; nothing written past 4 KiB.
    void* whole = NULL;
    rc = shim_reg_mr(&n, sc, sbuf, SZ, TSN_PTR_HOST, &whole);
    check(rc == TSN_SUCCESS, "regMr of the whole 16 KiB send buffer (rc %d)", rc);
    void *rreq = NULL, *sreq = NULL;
    void* d0 = rbuf;
    size_t room = 4096;
    int tag = 0;
    rc = shim_irecv(&n, rcm, 1, &d0, &room, &tag, &rmh, &rreq);
    check(rc == TSN_SUCCESS && rreq, "irecv of 4 KiB (rc %d)", rc);
    rc = shim_isend(&n, sc, sbuf, SZ, 0, whole, &sreq);
    if (rc != TSN_SUCCESS) {
      check(1, "isend of 16 KiB into a 4 KiB receive refused at once (rc %d)", rc);
    } else if (check(sreq != NULL, "isend of 16 KiB (rc %d)", rc)) {
      tsn_result_t src = 0, rrc = 0;
      int sdone = 0, rdone = 0;
      double end = now_s() + g_timeout;
      while ((!sdone || !rdone) && now_s() < end) {
        int dn = 0;
        if (!sdone && ((src = shim_test(&n, sreq, &dn, got)) != TSN_SUCCESS || dn)) sdone = 1;
        dn = 0;
        if (!rdone && ((rrc = shim_test(&n, rreq, &dn, got)) != TSN_SUCCESS || dn)) rdone = 1;
      }
      check(sdone && src != TSN_SUCCESS, "16 KiB send into a 4 KiB receive: the send ends in an error (%s, rc %d)",
            sdone ? "ended" : "timed out", src);
      check(rdone && rrc != TSN_SUCCESS, "16 KiB send into a 4 KiB receive: the receive ends in an error (%s, rc %d)",
            rdone ? "ended" : "timed out", rrc);
    }
    long g = guard_broken(rbuf, 4096, 2 * 4096);
    check(g < 0, "16 KiB send into a 4 KiB receive: nothing written past 4 KiB (first change at %ld)", g);
    pair_close(&n, lc, sc, rcm, 0);  // the pair is broken now; its close codes are informative
    free(sbuf);
    free(rbuf);
  }
  // connect with a random handle.
  uint8_t handle[TSN_HANDLE_SIZE];
  srand(12345);
  for (int i = 0; i < TSN_HANDLE_SIZE; i++) handle[i] = (uint8_t)rand();
  void* bogus = NULL;
  double end = now_s() + g_timeout;
  do rc = shim_connect(&n, ctx, g_dev, handle, &bogus);
  while (rc == TSN_SUCCESS && !bogus && now_s() < end);
  check(rc != TSN_SUCCESS && !bogus, "connect with a random 128-byte handle fails (rc %d, comm %p)", rc, bogus);
  if (bogus) shim_close_send(&n, bogus);
  int badd[] = {ndev, -1};
  for (int i = 0; i < 2; i++) {
    rc = shim_get_properties_raw(&n, badd[i], raw);
    check(rc != TSN_SUCCESS, "getProperties(%d) fails (rc %d)", badd[i], rc);
  }
  // Still healthy: a fresh pair carries data.
  run_pair_inproc(&n, ctx, ctx, &TRANSFER, P_QUICK);
  set_prefix(version, "badinput", NULL);
  check(1, "the process is still healthy after the bad calls");
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- lifecycle

static void sc_lifecycle(int version) {
  set_prefix(version, "lifecycle", NULL);
  Net n;
  if (open_net(&n, version)) return;
  void* ctx = NULL;
  if (init_ctx(&n, &ctx, COMM_ID)) { shim_close(&n); return; }
  enum { MB = 1 << 20, K = 3 };
  uint8_t* buf = malloc(K * MB);
  memset(buf, 1, K * MB);
  void *lc, *sc, *rc;
  tsn_result_t r;
  // 1. Receives in flight when both comms close.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void* mh = NULL;
    r = shim_reg_mr(&n, rc, buf, K * MB, TSN_PTR_HOST, &mh);
    int posted = 0;
    for (int i = 0; i < K && r == TSN_SUCCESS; i++) {
      void* d = buf + (size_t)i * MB;
      size_t room = MB;
      int tag = 0;
      void* req = NULL;
      if (shim_irecv(&n, rc, 1, &d, &room, &tag, &mh, &req) == TSN_SUCCESS && req) posted++;
    }
    check(posted == K, "%d receives in flight", posted);
    pair_close(&n, lc, sc, rc, 1);
    check(1, "closing comms with receives in flight returned");
  }
  // 2. Sends in flight (no receive posted) when both comms close.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void* mh = NULL;
    r = shim_reg_mr(&n, sc, buf, K * MB, TSN_PTR_HOST, &mh);
    int posted = 0;
    for (int i = 0; i < K && r == TSN_SUCCESS; i++) {
      void* req = NULL;
      if (shim_isend(&n, sc, buf + (size_t)i * MB, MB, 0, mh, &req) == TSN_SUCCESS && req) posted++;
    }
    check(posted == K, "%d sends of 1 MiB in flight", posted);
    pair_close(&n, lc, sc, rc, 1);
    check(1, "closing comms with sends in flight returned");
  }
  // 3. The receiving side closes while sends are in flight: they end (with an error), not hang.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void* mh = NULL;
    r = shim_reg_mr(&n, sc, buf, K * MB, TSN_PTR_HOST, &mh);
    void* reqs[K] = {0};
    for (int i = 0; i < K && r == TSN_SUCCESS; i++) shim_isend(&n, sc, buf + (size_t)i * MB, MB, 0, mh, &reqs[i]);
    r = shim_close_recv(&n, rc);
    check(r == TSN_SUCCESS, "closeRecv with the peer's sends in flight (rc %d)", r);
    int ended = 0, errs = 0;
    for (int i = 0; i < K; i++) {
      if (!reqs[i]) continue;
      int sz = -1;
      tsn_result_t t = wait_req(&n, reqs[i], &sz, g_timeout);
      if (t != -1) ended++;
      if (t != TSN_SUCCESS) errs++;
    }
    check(ended == K, "all %d sends in flight ended after the receiver closed (%d ended, %d with an error)", K, ended,
          errs);
    r = shim_dereg_mr(&n, sc, mh);
    check(r == TSN_SUCCESS, "deregMr after the requests ended (rc %d)", r);
    tsn_result_t a = shim_close_send(&n, sc), b = shim_close_listen(&n, lc);
    check(a == TSN_SUCCESS && b == TSN_SUCCESS, "closeSend, closeListen (rc %d, %d)", a, b);
  }
  // 4. deregMr, and registering the same memory again.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void *m1 = NULL, *m2 = NULL, *m3 = NULL;
    tsn_result_t a = shim_reg_mr(&n, sc, buf, MB, TSN_PTR_HOST, &m1);
    tsn_result_t b = shim_reg_mr(&n, sc, buf, MB, TSN_PTR_HOST, &m2);  // overlapping registrations
    check(a == 0 && b == 0 && m1 && m2 && m1 != m2, "two registrations of the same memory (rc %d, %d)", a, b);
    a = shim_dereg_mr(&n, sc, m1);
    b = shim_dereg_mr(&n, sc, m2);
    check(a == 0 && b == 0, "deregMr of both (rc %d, %d)", a, b);
    a = shim_reg_mr(&n, rc, buf, MB, TSN_PTR_HOST, &m3);
    b = m3 ? shim_dereg_mr(&n, rc, m3) : -1;
    check(a == 0 && b == 0, "regMr and deregMr on the receive comm (rc %d, %d)", a, b);
    pair_close(&n, lc, sc, rc, 1);
  }
  // 5. closeListen: with nothing connected, and a connect to a closed listener fails.
  {
    uint8_t handle[TSN_HANDLE_SIZE];
    void* l = NULL;
    r = shim_listen(&n, ctx, g_dev, handle, &l);
    check(r == TSN_SUCCESS && l, "listen (rc %d)", r);
    r = l ? shim_close_listen(&n, l) : -1;
    check(r == TSN_SUCCESS, "closeListen with nothing connected (rc %d)", r);
    void* s = NULL;
    double end = now_s() + g_timeout;
    do r = shim_connect(&n, ctx, g_dev, handle, &s);
    while (r == TSN_SUCCESS && !s && now_s() < end);
    check(r != TSN_SUCCESS && !s, "connect to a closed listener fails (rc %d)", r);
    if (s) shim_close_send(&n, s);
  }
  free(buf);
  // 6. v11+: two contexts with the same commId, each carrying its own transfers.
  if (shim_has_ctx(version)) {
    void *a = NULL, *b = NULL;
    tsn_result_t ra = shim_init(&n, &a, COMM_ID + 1, logger), rb = shim_init(&n, &b, COMM_ID + 1, logger);
    check(ra == 0 && rb == 0 && a && b && a != b, "two inits with one commId give two contexts (%p, %p)", a, b);
    if (a && b) {
      run_pair_inproc(&n, a, a, &TRANSFER, P_QUICK);
      run_pair_inproc(&n, b, b, &TRANSFER, P_QUICK);
      run_pair_inproc(&n, a, b, &TRANSFER, P_QUICK);  // across the two contexts
      set_prefix(version, "lifecycle", NULL);
      // finalize with a listener still open: the context releases it.
      uint8_t handle[TSN_HANDLE_SIZE];
      void* l = NULL;
      r = shim_listen(&n, b, g_dev, handle, &l);
      check(r == TSN_SUCCESS, "listen left open before finalize (rc %d)", r);
      ra = shim_finalize(&n, a);
      rb = shim_finalize(&n, b);
      check(ra == 0 && rb == 0, "finalize of each context (rc %d, %d)", ra, rb);
    }
  } else {
    note("skip: contexts exist from v11");
  }
  // 7. dlclose, dlopen again (as NCCL between communicators) and carry data again.
  fini_ctx(&n, ctx);
  shim_close(&n);
  check(1, "dlclose");
  if (open_net(&n, version)) return;
  check(1, "dlopen again");
  if (init_ctx(&n, &ctx, COMM_ID + 2) == 0) {
    run_pair_inproc(&n, ctx, ctx, &TRANSFER, P_QUICK);
    set_prefix(version, "lifecycle", NULL);
    fini_ctx(&n, ctx);
  }
  shim_close(&n);
}

// ---------------------------------------------------------------- main

static void sc_transfer(int v) { run_pair(v, &TRANSFER, P_TRANSFER); }
static void sc_marker(int v) { run_pair(v, &MARKER, P_MARKER); }
static void sc_inflight(int v) { run_pair(v, &INFLIGHT_SC, 0); }
static void sc_grouped(int v) {
  int want[] = {8, 4};
  int mr = 0;
  if (g_procs == 1) {
    Net n;
    set_prefix(v, "grouped", NULL);
    if (open_net(&n, v)) return;
    void* ctx;
    if (init_ctx(&n, &ctx, COMM_ID) == 0) {
      mr = max_recvs(&n);
      fini_ctx(&n, ctx);
    }
    shim_close(&n);
  } else {
    mr = TSN_MAX_RECVS;  // the receiver's irecv fails clearly if the device has fewer
  }
  for (int i = 0; i < 2; i++) {
    set_prefix(v, "grouped", NULL);
    if (want[i] > mr) {
      note("skip n=%d: the device's maxRecvs is %d", want[i], mr);
      continue;
    }
    run_pair(v, &GROUPED, want[i]);
  }
}

typedef struct Scenario {
  const char* name;
  void (*run)(int version);
  int two_procs;  // runs with --procs 2
} Scenario;

static const Scenario SCENARIOS[] = {
    {"tables", sc_tables, 0},     {"transfer", sc_transfer, 1}, {"inflight", sc_inflight, 1},
    {"grouped", sc_grouped, 1},   {"marker", sc_marker, 1},     {"badinput", sc_badinput, 0},
    {"lifecycle", sc_lifecycle, 0},
};
#define NSCENARIOS ((int)(sizeof SCENARIOS / sizeof *SCENARIOS))

// Runs one scenario of one version in a child process, so a crash is a failed check of that
// scenario, not the end of the run. The parent never loads the library (no threads to fork).
static void run_isolated(const Scenario* s, int version) {
  int res[2];
  if (pipe(res)) {
    set_prefix(version, s->name, NULL);
    check(0, "pipe: %s", strerror(errno));
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(res[0]);
    g_pass = g_fail = 0;
    watchdog(g_timeout * 6);
    s->run(version);
    int counts[2] = {g_pass, g_fail};
    ssize_t w = write(res[1], counts, sizeof counts);
    (void)w;
    fflush(stdout);
    _exit(g_fail ? 1 : 0);
  }
  close(res[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  int counts[2] = {0, 0};
  ssize_t got = read(res[0], counts, sizeof counts);
  close(res[0]);
  g_pass += counts[0];
  g_fail += counts[1];
  set_prefix(version, s->name, NULL);
  if (WIFSIGNALED(status)) check(0, "the scenario's process died of signal %d", WTERMSIG(status));
  else if (got != (ssize_t)sizeof counts) check(0, "the scenario's process exited (status %d) without reporting", WEXITSTATUS(status));
}

static void usage(void) {
  fprintf(stderr,
          "usage: driver <scenario|all|list> [--version N] [--lib PATH] [--procs 1|2] [--dev D] [--timeout S] "
          "[--verbose]\n"
          "  scenarios: tables transfer inflight grouped marker badinput lifecycle\n"
          "  --version N   table version 6..12 (default: 12; 'all' runs 6..12 unless given)\n"
          "  --lib PATH    plugin library (default: $TSNET_DRIVER_LIB or build/libnccl-net-tsnet.so)\n"
          "  --procs 2     sender in a forked child, receiver in the parent (transfer, inflight, grouped, marker)\n"
          "  --timeout S   seconds any wait may take before it fails (default 20)\n");
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) return usage(), 2;
  const char* what = argv[1];
  int version = 0;
  if (getenv("TSNET_DRIVER_LIB")) g_lib = getenv("TSNET_DRIVER_LIB");
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--verbose")) g_verbose = 1;
    else if (v && !strcmp(a, "--version")) version = atoi(v), i++;
    else if (v && !strcmp(a, "--lib")) g_lib = v, i++;
    else if (v && !strcmp(a, "--procs")) g_procs = atoi(v), i++;
    else if (v && !strcmp(a, "--dev")) g_dev = atoi(v), i++;
    else if (v && !strcmp(a, "--timeout")) g_timeout = atof(v), i++;
    else return fprintf(stderr, "unknown or incomplete option %s\n", a), usage(), 2;
  }
  if (!strcmp(what, "list")) {
    for (int i = 0; i < NSCENARIOS; i++) printf("%s%s\n", SCENARIOS[i].name, SCENARIOS[i].two_procs ? " (--procs 2)" : "");
    return 0;
  }
  if (g_procs != 1 && g_procs != 2) return fprintf(stderr, "--procs must be 1 or 2\n"), 2;
  if (version && (version < SHIM_MIN_VERSION || version > SHIM_MAX_VERSION))
    return fprintf(stderr, "--version must be %d..%d\n", SHIM_MIN_VERSION, SHIM_MAX_VERSION), 2;
  int lo = version ? version : (strcmp(what, "all") ? SHIM_MAX_VERSION : SHIM_MIN_VERSION);
  int hi = version ? version : SHIM_MAX_VERSION;
  int ran = 0;
  for (int v = lo; v <= hi; v++)
    for (int i = 0; i < NSCENARIOS; i++) {
      const Scenario* s = &SCENARIOS[i];
      if (strcmp(what, "all") && strcmp(what, s->name)) continue;
      ran++;
      if (g_procs == 2 && !s->two_procs) {
        if (strcmp(what, "all")) return fprintf(stderr, "%s runs in one process only\n", s->name), 2;
        continue;
      }
      run_isolated(s, v);
    }
  if (!ran) return fprintf(stderr, "unknown scenario %s\n", what), usage(), 2;
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
