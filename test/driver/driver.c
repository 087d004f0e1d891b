// tsnet's C driver: dlopens the built plugin like NCCL does and runs scenarios through any
// exported version's table (v6..v12), printing one TAP-like line per check.
//
//   driver <scenario|all> [--version N] [--lib PATH] [--procs 1|2] [--dev D] [--timeout S] [--verbose]
//          [--role send|recv --rendezvous DIR]
//
// Pair scenarios (transfer, inflight, grouped, pushback, teardown, marker, bulk; badinput's
// oversize send with --procs 2) are written as a sender role and a receiver role, each a
// non-blocking step function, joined by a small message channel (a pipe) that also carries
// the scenario's own marks, in order (an int and up to a handle's bytes: "posted", a new
// handle). With --procs 1 both roles live in one process and their steps are interleaved;
// with --procs 2 the driver forks a receiver process (listen, accept) and a sender process
// (connect); each loads the library itself. With --role one invocation runs one role only and
// the channel is a set of files in a directory both can see (two network namespaces, two
// hosts with a shared folder).
// killpeer and stranger manage their own processes and sockets; tables, badinput, lifecycle
// and fork otherwise run in one process.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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
static int g_procs = 1;
enum { ROLE_BOTH = 0, ROLE_SEND = 1, ROLE_RECV = 2 };
static int g_role;              // --role: this invocation runs one role of each pair

// The plugin's threads log through logger() while the main thread moves from role to role:
// the prefix changes under a lock, and a log line copies it under the same lock (snprintf
// empties the buffer before it writes, so an unlocked reader could see "").
static pthread_mutex_t g_prefix_mu = PTHREAD_MUTEX_INITIALIZER;

// A child forked while a plugin thread logs would find the lock held for good: fork takes it
// first, and the child starts with a fresh one.
static void prefix_lock(void) { pthread_mutex_lock(&g_prefix_mu); }
static void prefix_unlock(void) { pthread_mutex_unlock(&g_prefix_mu); }
static void note_stale_regions(void);
static void prefix_reset(void) {
  pthread_mutex_init(&g_prefix_mu, NULL);
  note_stale_regions();  // a forked child has a pid of its own
}

static void set_prefix(int version, const char* scenario, const char* role) {
  pthread_mutex_lock(&g_prefix_mu);
  snprintf(g_prefix, sizeof g_prefix, "v%d %s%s%s%s", version, scenario, role ? " [" : "", role ? role : "",
           role ? "]" : "");
  pthread_mutex_unlock(&g_prefix_mu);
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

// WARN lines the plugin logged in this process (any thread).
static atomic_int g_warn_count;

// The `held` scenario: the next WARN that contains g_hold_match is held inside the logger for
// g_hold_ms (once), as an application whose logger blocks holds the plugin's thread; the WARNs
// about a held event loop are counted and the last one kept.
static atomic_int g_hold_ms;
static const char* volatile g_hold_match;
static pthread_mutex_t g_held_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_held_line[1024];
static atomic_int g_held_count;

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level == TSN_LOG_WARN) atomic_fetch_add(&g_warn_count, 1);
  if (!g_verbose && level != TSN_LOG_WARN && level != TSN_LOG_ABORT) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == TSN_LOG_WARN && strstr(msg, "event loop was held for")) {
    pthread_mutex_lock(&g_held_mu);
    snprintf(g_held_line, sizeof g_held_line, "%s", msg);
    pthread_mutex_unlock(&g_held_mu);
    atomic_fetch_add(&g_held_count, 1);
  }
  const char* hold = g_hold_match;
  if (level == TSN_LOG_WARN && hold && strstr(msg, hold)) {
    int ms = atomic_exchange(&g_hold_ms, 0);
    if (ms > 0) usleep((useconds_t)ms * 1000);
  }
  char prefix[sizeof g_prefix];
  pthread_mutex_lock(&g_prefix_mu);
  memcpy(prefix, g_prefix, sizeof prefix);
  pthread_mutex_unlock(&g_prefix_mu);
  fprintf(stderr, "[%d] %s: log %d: %s\n", (int)getpid(), prefix, level, msg);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

// The plugin's link timeout (TSNET_TIMEOUT_SEC, 10 s by default): its greeting and dead-peer limits.
static double timeout_sec(void) {
  const char* t = getenv("TSNET_TIMEOUT_SEC");
  return t && atof(t) > 0 ? atof(t) : 10.0;
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

// Byte i is byte i % 4 (little-endian) of the (i / 4 + 1)-th value of an LCG; on a
// little-endian host whole blocks of four are written and compared at once.
#define LCG(x) ((x) * 1664525u + 1013904223u)
#define FAST_LE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)

static void fill(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed | 1;
  size_t i = 0;
  if (FAST_LE)
    for (; i + 4 <= n; i += 4) {
      x = LCG(x);
      memcpy(p + i, &x, 4);
    }
  for (; i < n; i++) {
    if ((i & 3) == 0) x = LCG(x);
    p[i] = (uint8_t)(x >> (8 * (i & 3)));
  }
}

// First offset where p differs from the pattern, or -1.
static long mismatch(const uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed | 1;
  size_t i = 0;
  if (FAST_LE)
    for (; i + 4 <= n; i += 4) {
      uint32_t w;
      memcpy(&w, p + i, 4);
      if (w != LCG(x)) break;  // the byte loop finds the byte
      x = LCG(x);
    }
  for (; i < n; i++) {
    if ((i & 3) == 0) x = LCG(x);
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

// MSG_MARK: a scenario's own word to the peer role (an int and up to 128 bytes, e.g. a new
// handle), delivered in the order sent; the role queues them for its step function.
enum { MSG_HANDLE = 1, MSG_DONE = 2, MSG_ABORT = 3, MSG_MARK = 4 };
typedef struct Msg {
  int32_t kind;
  int32_t len;
  int32_t arg;  // MSG_MARK: the scenario's word
  uint8_t data[TSN_HANDLE_SIZE];
} Msg;  // < PIPE_BUF: writes are atomic, so a non-blocking read sees whole messages

typedef struct Chan {
  int rfd, wfd;
  // File mode (--role): each message is a file in `dir` named after `key`; the peer polls.
  const char* dir;
  char key[64];
  int sender;
  int got;  // file mode: bit per message already delivered
  int marks_out, marks_in;  // file mode: marks written, marks delivered (numbered files)
  double next_poll;
} Chan;

static void chan_path(const Chan* c, char* out, size_t len, const char* what) {
  snprintf(out, len, "%s/%s.%s", c->dir, c->key, what);
}

// Marks are numbered per writer: "send-mark0", "send-mark1", ... (seq: the mark's number).
static const char* msg_file(int kind, int sender, int seq, char* buf, size_t len) {
  if (kind == MSG_HANDLE) return "handle";
  if (kind == MSG_MARK) snprintf(buf, len, "%s-mark%d", sender ? "send" : "recv", seq);
  else snprintf(buf, len, "%s-%s", sender ? "send" : "recv", kind == MSG_DONE ? "done" : "abort");
  return buf;
}

// Written under a temporary name, then renamed: the peer sees a whole file or none. A mark's
// file holds its int, then its bytes.
static void file_put(Chan* c, int kind, int arg, const void* data, int len) {
  char what[32], path[600], tmp[620];
  chan_path(c, path, sizeof path, msg_file(kind, c->sender, c->marks_out, what, sizeof what));
  if (kind == MSG_MARK) c->marks_out++;
  snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = kind == MSG_MARK ? write(fd, &arg, sizeof arg) : 0;
  w = data && len > 0 ? write(fd, data, (size_t)len) : 0;
  (void)w;
  close(fd);
  if (rename(tmp, path)) unlink(tmp);
}

static int file_get(Chan* c, Msg* m) {
  double t = now_s();
  if (t < c->next_poll) return 0;
  c->next_poll = t + 0.002;
  char what[32], path[600];
  memset(m, 0, sizeof *m);
  if (c->sender && !(c->got & 1)) {
    chan_path(c, path, sizeof path, "handle");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t k = read(fd, m->data, TSN_HANDLE_SIZE);
      close(fd);
      if (k == TSN_HANDLE_SIZE) {
        c->got |= 1;
        m->kind = MSG_HANDLE;
        m->len = TSN_HANDLE_SIZE;
        return 1;
      }
    }
  }
  // The peer's next mark (written before its done or abort, so seen first).
  chan_path(c, path, sizeof path, msg_file(MSG_MARK, !c->sender, c->marks_in, what, sizeof what));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    uint8_t buf[sizeof(int32_t) + TSN_HANDLE_SIZE];
    ssize_t k = read(fd, buf, sizeof buf);
    close(fd);
    if (k >= (ssize_t)sizeof(int32_t)) {
      c->marks_in++;
      m->kind = MSG_MARK;
      memcpy(&m->arg, buf, sizeof m->arg);
      m->len = (int32_t)(k - (ssize_t)sizeof(int32_t));
      memcpy(m->data, buf + sizeof(int32_t), (size_t)m->len);
      return 1;
    }
  }
  static const int kinds[] = {MSG_DONE, MSG_ABORT};
  for (int i = 0; i < 2; i++) {
    int bit = 2 << i;
    if (c->got & bit) continue;
    chan_path(c, path, sizeof path, msg_file(kinds[i], !c->sender, 0, what, sizeof what));
    if (access(path, F_OK) == 0) {
      c->got |= bit;
      m->kind = kinds[i];
      return 1;
    }
  }
  return 0;
}

static void chan_put_arg(Chan* c, int kind, int arg, const void* data, int len) {
  if (c->dir) {
    file_put(c, kind, arg, data, len);
    return;
  }
  Msg m;
  memset(&m, 0, sizeof m);
  m.kind = kind;
  m.len = len;
  m.arg = arg;
  if (data && len > 0) memcpy(m.data, data, (size_t)len);
  // A peer role that already ended (its init failed, say) closed its end: the write fails with
  // EPIPE and this role goes on to report its own checks. The SIGPIPE the kernel raises for it is
  // blocked around the write and taken back, so that it cannot kill the role, while a SIGPIPE from
  // the plugin on any other write still would.
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  ssize_t w;
  do w = write(c->wfd, &m, sizeof m);
  while (w < 0 && errno == EINTR);
  if (w < 0 && errno == EPIPE) {
    struct timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void chan_put(Chan* c, int kind, const void* data, int len) { chan_put_arg(c, kind, 0, data, len); }

// 1: a message; 0: none yet; -1: the peer closed its end.
static int chan_get(Chan* c, Msg* m) {
  if (c->dir) return file_get(c, m);
  ssize_t r = read(c->rfd, m, sizeof *m);
  if (r == (ssize_t)sizeof *m) return 1;
  if (r == 0) return -1;
  return 0;
}

// Two pipes: a carries sender -> receiver, b receiver -> sender.
static int chan_pair(Chan* snd, Chan* rcv) {
  int a[2], b[2];
  memset(snd, 0, sizeof *snd);
  memset(rcv, 0, sizeof *rcv);
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
#define ROLE_MAX_MARKS 16

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
  int broken;  // the scenario breaks the pair on purpose: deregMr/close codes are informative
  void* mr[ROLE_MAX_MR];
  int nmr;
  void* buf[ROLE_MAX_BUF];
  int nbuf;
  void* st;  // scenario state (malloc'd, freed at cleanup)
  Msg marks[ROLE_MAX_MARKS];  // the peer's marks not yet taken by the step function
  int mark_head, mark_count;
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

// A host buffer of cap bytes, GUARD in every byte, registered (*mh); NULL on failure.
static uint8_t* role_guarded(Role* r, size_t cap, void** mh) {
  uint8_t* b = role_alloc(r, cap);
  if (!b) return NULL;
  memset(b, GUARD, cap);
  *mh = role_reg(r, b, cap);
  return *mh ? b : NULL;
}

// A scenario's word to the peer role (arg, and len bytes of data: at most a handle).
static void role_put_mark(Role* r, int arg, const void* data, int len) { chan_put_arg(&r->ch, MSG_MARK, arg, data, len); }

// The peer's oldest mark not yet taken: 1 and *m, or 0 when none has come.
static int role_take_mark(Role* r, Msg* m) {
  if (!r->mark_count) return 0;
  *m = r->marks[r->mark_head];
  r->mark_head = (r->mark_head + 1) % ROLE_MAX_MARKS;
  r->mark_count--;
  return 1;
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
    } else if (m.kind == MSG_MARK) {
      if (r->mark_count == ROLE_MAX_MARKS) {
        role_abort(r, "more marks from the peer than this role holds");
        break;
      }
      r->marks[(r->mark_head + r->mark_count++) % ROLE_MAX_MARKS] = m;
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
        if (r->broken) note("deregMr on the broken comm returned %d", rc);
        else check(rc == TSN_SUCCESS, "deregMr (rc %d)", rc);
      }
    if (r->comm) {
      tsn_result_t rc = r->sender ? shim_close_send(r->net, r->comm) : shim_close_recv(r->net, r->comm);
      check(r->aborted || r->broken || rc == TSN_SUCCESS, "%s (rc %d)", r->sender ? "closeSend" : "closeRecv", rc);
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
// --procs 2 / --role: the same, then up to 64 MiB (striped over every data socket).
static const size_t k_big_sizes[] = {0,       1,       7,          8, 4095, 4096, 65536, 65537, (1 << 20) + 3, 4 << 20,
                                     (16 << 20) + 5, 64 << 20};
static const size_t k_marker_sizes[] = {1, 64, 4096, 65536};
static const size_t k_quick_sizes[] = {0, 1, 65537};
#define BULK_COUNT 8
static const size_t k_bulk_sizes[BULK_COUNT] = {64 << 20, 64 << 20, 64 << 20, 64 << 20,
                                                64 << 20, 64 << 20, 64 << 20, 64 << 20};
#define TRANSFER_EXTRA 4096
#define TRANSFER_TAG 3

enum { P_TRANSFER = 0, P_MARKER = 1, P_QUICK = 2, P_BIG = 3, P_BULK = 4 };
#define COUNT_OF(a) ((int)(sizeof(a) / sizeof *(a)))

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
  int staged;  // the sender's data are put in place by the scenario (GPU memory), not by fill()
} XferState;

static void xfer_sizes(int param, const size_t** sizes, int* count) {
  if (param == P_MARKER) *sizes = k_marker_sizes, *count = COUNT_OF(k_marker_sizes);
  else if (param == P_QUICK) *sizes = k_quick_sizes, *count = COUNT_OF(k_quick_sizes);
  else if (param == P_BIG) *sizes = k_big_sizes, *count = COUNT_OF(k_big_sizes);
  else if (param == P_BULK) *sizes = k_bulk_sizes, *count = COUNT_OF(k_bulk_sizes);
  else *sizes = k_transfer_sizes, *count = COUNT_OF(k_transfer_sizes);
}

static int xfer_setup(Role* r) {
  XferState* x = calloc(1, sizeof *x);
  r->st = x;
  xfer_sizes(r->param, &x->sizes, &x->count);
  size_t max = 0;
  for (int i = 0; i < x->count; i++)
    if (x->sizes[i] > max) max = x->sizes[i];
  x->cap = max + (r->sender ? 0 : TRANSFER_EXTRA + 64);
  x->buf = role_guarded(r, x->cap, &x->mh);
  return x->buf ? 0 : -1;
}

static int xfer_send_step(Role* r) {
  XferState* x = r->st;
  if (x->i == x->count) return 1;
  size_t size = x->sizes[x->i];
  if (!x->req) {
    if (!x->posted && !x->staged) fill(x->buf, size, seed_of(size, x->i, 0));
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
static const PairScenario BULK = {"bulk", {xfer_setup, xfer_send_step}, {xfer_setup, xfer_recv_step}};

// ---------------------------------------------------------------- gpu
// Both roles' buffers in CUDA device memory, registered as NCCL_PTR_CUDA (NCCL's GPUDirect
// path: no host staging), with iflush after every non-empty receive as NCCL calls it. Data are
// written through host copies and checked after copying back, guard bytes after the message
// included. Skipped (with a note) when the device's ptrSupport has no CUDA: TCP, or libfabric
// without FI_HMEM. A device that claims CUDA on a host without a usable GPU fails.

typedef ShimCuRes CUres;
typedef ShimCuPtr CUptr;

typedef struct GpuState {
  XferState x;  // first: xfer_send_step reads r->st as an XferState; x.buf is the GPU buffer (freed with the role's process)
  ShimCuda cu;
  int skip;
  uint8_t* host;  // staging for fills and checks, cap bytes
  void* freq;     // the iflush request in flight
  int got;        // the completed receive's size, while its flush runs
} GpuState;

static const size_t k_gpu_sizes[] = {0,     1,       8,          4095, 8192, 8193, 65536, 65537, (1 << 20) + 3, 4 << 20,
                                     (16 << 20) + 5, 64 << 20};

static int gpu_setup(Role* r) {
  GpuState* g = calloc(1, sizeof *g);
  r->st = g;
  XferState* x = &g->x;
  x->sizes = k_gpu_sizes, x->count = COUNT_OF(k_gpu_sizes);
  x->staged = 1;
  uint8_t raw[256];
  tsn_props_t props;
  tsn_result_t rc = shim_get_properties_raw(r->net, r->dev, raw);
  if (!check(rc == TSN_SUCCESS, "getProperties(%d) (rc %d)", r->dev, rc)) return -1;
  shim_props_to_neutral(r->net->version, raw, &props);
  if (!(props.ptrSupport & TSN_PTR_CUDA)) {
    note("skip: device %d's ptrSupport 0x%x has no CUDA (TCP, a provider without FI_HMEM, or one that calls CUDA inside libfabric, such as shm, without TSNET_OFI_CUDA_API=1)", r->dev, props.ptrSupport);
    g->skip = 1;
    return 0;
  }
  char why[160];
  if (!check(shim_cuda_open(&g->cu, why, sizeof why) == 0, "the device supports CUDA memory; this host's GPU 0: %s", why))
    return -1;
  x->cap = k_gpu_sizes[COUNT_OF(k_gpu_sizes) - 1] + (r->sender ? 0 : TRANSFER_EXTRA);
  CUptr d = 0;
  CUres cr = g->cu.memAlloc(&d, x->cap);
  if (!check(cr == 0, "cuMemAlloc of %zu bytes (CUresult %d)", x->cap, cr)) return -1;
  x->buf = (uint8_t*)(uintptr_t)d;
  g->host = role_alloc(r, x->cap);
  if (!g->host) return -1;
  void* mh = NULL;
  rc = shim_reg_mr(r->net, r->comm, x->buf, x->cap, TSN_PTR_CUDA, &mh);
  if (!check(rc == TSN_SUCCESS && mh, "regMr of %zu bytes of GPU memory (rc %d)", x->cap, rc)) return -1;
  if (r->nmr < ROLE_MAX_MR) r->mr[r->nmr++] = mh;
  x->mh = mh;
  return 0;
}

static int gpu_send_step(Role* r) {
  GpuState* g = r->st;
  XferState* x = &g->x;
  if (g->skip || x->i == x->count) return 1;
  size_t size = x->sizes[x->i];
  if (!x->req && !x->posted && size) {
    fill(g->host, size, seed_of(size, x->i, 9));
    CUres cr = g->cu.htod((CUptr)(uintptr_t)x->buf, g->host, size);
    if (!check(cr == 0, "copy of %zu bytes into the GPU send buffer (CUresult %d)", size, cr)) return -1;
  }
  return xfer_send_step(r);  // isend and test of x->buf (x->staged: it does not fill it)
}

static int gpu_recv_step(Role* r) {
  GpuState* g = r->st;
  XferState* x = &g->x;
  if (g->skip || x->i == x->count) return 1;
  size_t size = x->sizes[x->i];
  tsn_result_t rc;
  if (g->freq) {  // the flush of the completed receive
    int done = 0, fs = -1;
    rc = shim_test(r->net, g->freq, &done, &fs);
    if (rc != TSN_SUCCESS) return check(0, "test of the iflush of %d bytes returned %d", g->got, rc), -1;
    if (!done) return 0;
    g->freq = NULL;
  } else if (!x->req) {
    if (!x->posted) {
      memset(g->host, GUARD, size + TRANSFER_EXTRA);
      CUres cr = g->cu.htod((CUptr)(uintptr_t)x->buf, g->host, size + TRANSFER_EXTRA);
      if (!check(cr == 0, "guard bytes into the GPU receive buffer (CUresult %d)", cr)) return -1;
    }
    x->posted = 1;
    void* data = x->buf;
    size_t room = size + TRANSFER_EXTRA;
    int tag = TRANSFER_TAG;
    rc = shim_irecv(r->net, r->comm, 1, &data, &room, &tag, &x->mh, &x->req);
    if (!check(rc == TSN_SUCCESS, "irecv of room %zu into GPU memory (rc %d)", room, rc)) return -1;
    if (!x->req) x->nulls++;
    return 0;
  } else {
    int done = 0;
    g->got = -1;
    rc = shim_test(r->net, x->req, &done, &g->got);
    if (rc != TSN_SUCCESS) return check(0, "test of the irecv for %zu bytes returned %d", size, rc), -1;
    if (!done) return 0;
    x->req = NULL;
    check(g->got == (int)size, "recv of %zu bytes into GPU memory: test reports size %d", size, g->got);
    if (g->got > 0) {
      void* data = x->buf;
      rc = shim_iflush(r->net, r->comm, 1, &data, &g->got, &x->mh, &g->freq);
      if (!check(rc == TSN_SUCCESS, "iflush of %d bytes of GPU memory (rc %d)", g->got, rc)) return -1;
      if (g->freq) return 0;
    }
  }
  // Received and flushed: check through a copy back to the host.
  CUres cr = g->cu.dtoh(g->host, (CUptr)(uintptr_t)x->buf, size + TRANSFER_EXTRA);
  if (!check(cr == 0, "copy of the GPU receive buffer back (CUresult %d)", cr)) return -1;
  long bad = mismatch(g->host, size, seed_of(size, x->i, 9));
  check(bad < 0, "recv of %zu bytes into GPU memory: data equal (first difference at %ld)", size, bad);
  long gb = guard_broken(g->host, size, size + TRANSFER_EXTRA);
  check(gb < 0, "recv of %zu bytes into GPU memory: bytes after the message untouched (first changed at %ld)", size, gb);
  x->posted = 0;
  x->i++;
  if (x->i == x->count && x->nulls) note("irecv returned a NULL request %ld times (retried)", x->nulls);
  return x->i == x->count;
}

static const PairScenario GPU = {"gpu", {gpu_setup, gpu_send_step}, {gpu_setup, gpu_recv_step}};

// ---------------------------------------------------------------- oversize (badinput across processes)

// A 16 KiB send into a 4 KiB receive: the receive fails at once and nothing lands past 4 KiB;
// the send completes when its bytes are handed over (no round trip), so its error (the
// receiver's NACK) surfaces on the sender no later than the next operation on the comm: the
// sender posts 1-byte sends until one fails.
#define OVER_ROOM 4096
#define OVER_SEND 16384
#define OVER_NEXT_MAX 1000

typedef struct OverState {
  uint8_t* buf;
  size_t cap;
  void* mh;
  void* req;
  int next;  // sender: 1-byte sends posted after the oversize one
} OverState;

static int over_setup(Role* r) {
  OverState* o = calloc(1, sizeof *o);
  r->st = o;
  r->broken = 1;
  o->cap = r->sender ? OVER_SEND : 2 * OVER_ROOM;
  if (!(o->buf = role_guarded(r, o->cap, &o->mh))) return -1;
  if (r->sender) fill(o->buf, o->cap, 77);
  return 0;
}

static int over_step(Role* r) {
  OverState* o = r->st;
  if (!o->req) {
    tsn_result_t rc;
    if (r->sender) {
      rc = shim_isend(r->net, r->comm, o->buf, o->next ? 1 : OVER_SEND, 0, o->mh, &o->req);
      if (rc != TSN_SUCCESS && !o->next) return check(1, "isend of 16 KiB into a 4 KiB receive refused at once (rc %d)", rc), 1;
      if (rc != TSN_SUCCESS)
        return check(1, "16 KiB send into a 4 KiB receive: isend #%d after it returned the error (rc %d)", o->next, rc), 1;
    } else {
      void* d = o->buf;
      size_t room = OVER_ROOM;
      int tag = 0;
      rc = shim_irecv(r->net, r->comm, 1, &d, &room, &tag, &o->mh, &o->req);
      if (rc != TSN_SUCCESS) return check(0, "irecv of 4 KiB returned %d", rc), -1;
    }
    return 0;  // a NULL request: post again
  }
  int done = 0, got = -1;
  tsn_result_t rc = shim_test(r->net, o->req, &done, &got);
  if (rc == TSN_SUCCESS && !done) return 0;
  if (!r->sender) {
    check(rc != TSN_SUCCESS, "16 KiB send into a 4 KiB receive: the receive ends in an error (rc %d%s)", rc,
          rc == TSN_SUCCESS ? ", it completed instead" : "");
    long g = guard_broken(o->buf, OVER_ROOM, o->cap);
    check(g < 0, "16 KiB send into a 4 KiB receive: nothing written past 4 KiB (first change at %ld)", g);
    return 1;
  }
  if (rc != TSN_SUCCESS)
    return check(1, "16 KiB send into a 4 KiB receive: the sender's error surfaced (rc %d) on %s", rc,
                 o->next ? "a later send on the comm" : "the send itself"), 1;
  o->req = NULL;
  if (++o->next > OVER_NEXT_MAX)
    return check(0, "16 KiB send into a 4 KiB receive: %d later sends all succeeded: the error never surfaced", OVER_NEXT_MAX), 1;
  if (o->next > 1) usleep(1000);  // the receiver's word is on its way
  return 0;
}

static const PairScenario OVERSIZE = {"badinput", {over_setup, over_step}, {over_setup, over_step}};

// ---------------------------------------------------------------- inflight

#define INFLIGHT 32
#define INFLIGHT_EXTRA 512

typedef struct InflightState {
  int count;  // requests in flight: the role's param (8 or 32)
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
  s->count = r->param > 0 && r->param <= INFLIGHT ? r->param : INFLIGHT;
  size_t off = 0;
  for (int i = 0; i < s->count; i++) {
    s->size[i] = inflight_size(i);
    s->off[i] = off;
    off += s->size[i] + (r->sender ? 0 : INFLIGHT_EXTRA);
  }
  s->cap = off;
  if (!(s->buf = role_guarded(r, s->cap, &s->mh))) return -1;
  if (r->sender)
    for (int i = 0; i < s->count; i++) fill(s->buf + s->off[i], s->size[i], seed_of(s->size[i], i, 1));
  return 0;
}

static int inflight_step(Role* r) {
  InflightState* s = r->st;
  int first = s->steps++ == 0;
  // Post everything possible; a NULL request means "try again" (then test meanwhile).
  while (s->posted < s->count) {
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
  if (first && s->posted == s->count) {
    check(1, "all %d %s posted before testing any", s->count, r->sender ? "sends" : "receives");
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
  if (s->ndone == s->count) {
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
  g->buf = role_guarded(r, g->cap, &g->mh);
  return g->buf ? 0 : -1;
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

// ---------------------------------------------------------------- pushback

// Messages whose tag is already used in the earliest posted receive go to a later one (the
// matching rule: the earliest posted receive with an unused entry of the tag; equal tags keep
// their order). Each pattern is a list of receives (tags per entry, posting order) and a list
// of sends (tags, sending order); eager-size and striped messages are mixed. Both roles derive
// the same rounds from the tables: round r is pattern r % PB_NPAT, receiver first (its
// receives posted, then a mark; the sender posts once it has the mark) for r < PB_NPAT, else
// sender first (its sends posted, then a mark; the receiver posts PB_WAIT_S after the mark,
// so its receives meet messages that are already waiting).
#define PB_MAX_RECVS 8
#define PB_MAX_SENDS 16
#define PB_SLACK 256  // guard bytes checked after each buffer's room
#define PB_WAIT_S 0.03

typedef struct PbPattern {
  const char* name;
  int nrecv;
  int n[PB_MAX_RECVS];
  int tags[PB_MAX_RECVS][TSN_MAX_RECVS];
  int nsend;
  int send_tags[PB_MAX_SENDS];
} PbPattern;

static const PbPattern k_pb[] = {
    {"a: irecv(n=1, tag 8) before irecv(n=8, tags 0-7), sends 0 8 1..7",
     2, {1, 8}, {{8}, {0, 1, 2, 3, 4, 5, 6, 7}},
     9, {0, 8, 1, 2, 3, 4, 5, 6, 7}},
    {"b2: two receives of tags 0-3, two tag-1 messages before the first is full",
     2, {4, 4}, {{0, 1, 2, 3}, {0, 1, 2, 3}},
     8, {1, 1, 0, 2, 3, 0, 3, 2}},
    {"b3: three receives of tags 0-3, three tag-1 messages before the first is full",
     3, {4, 4, 4}, {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}},
     12, {1, 1, 0, 1, 2, 3, 0, 2, 3, 0, 3, 2}},
    {"c: single and grouped receives alternating",
     6, {1, 4, 1, 4, 1, 1}, {{2}, {0, 1, 2, 3}, {1}, {0, 1, 2, 3}, {3}, {0}},
     12, {3, 1, 0, 2, 1, 2, 3, 0, 3, 1, 2, 0}},
};
#define PB_NPAT COUNT_OF(k_pb)
#define PB_ROUNDS (2 * PB_NPAT)

// Eager-size (under 8 KiB: eager over TCP and libfabric) and striped (256 KiB to 4 MiB).
static const size_t k_pb_sizes[] = {100, (256 << 10) + 13, 1000, 1 << 20, 4096, (3 << 20) + 5, 8000, 4 << 20};

static size_t pb_size(int round, int k) { return k_pb_sizes[(size_t)(k * 3 + round * 5) % COUNT_OF(k_pb_sizes)]; }
static uint32_t pb_seed(int round, int k) { return seed_of(pb_size(round, k), k, 200 + round); }
// Room of the entry that takes send k: its size and a little more (differing per entry).
static size_t pb_room(int round, int k) { return pb_size(round, k) + (size_t)(k % 3) * 8; }

// The send that entry j of receive i must get by the rule: the q-th entry with tag t (in
// posting order, entries in order) takes the q-th message with tag t. -1 if none.
static int pb_expect(const PbPattern* p, int i, int j) {
  int t = p->tags[i][j], q = 0;
  for (int a = 0; a < p->nrecv; a++)
    for (int b = 0; b < p->n[a]; b++)
      if ((a < i || (a == i && b < j)) && p->tags[a][b] == t) q++;
  for (int k = 0; k < p->nsend; k++)
    if (p->send_tags[k] == t && q-- == 0) return k;
  return -1;
}

typedef struct PbState {
  int round;
  int posting;  // posting this round's requests (0: not yet started)
  int posted, ndone, marked;
  double post_at;  // receiver, sender first: when to post
  void* req[PB_MAX_SENDS];
  int done[PB_MAX_SENDS];
  size_t off[PB_MAX_SENDS];  // sender: per send; receiver: per entry (flattened in posting order)
  uint8_t* buf;
  size_t cap;
  void* mh;
  long nulls;
} PbState;

static int pb_setup(Role* r) {
  PbState* s = calloc(1, sizeof *s);
  r->st = s;
  size_t max = 0;
  for (int round = 0; round < PB_ROUNDS; round++) {
    const PbPattern* p = &k_pb[round % PB_NPAT];
    size_t total = 0;
    for (int k = 0; k < p->nsend; k++) total += r->sender ? pb_size(round, k) : pb_room(round, k) + PB_SLACK;
    if (total > max) max = total;
  }
  s->cap = max;
  s->buf = role_guarded(r, s->cap, &s->mh);
  return s->buf ? 0 : -1;
}

// Lays out and fills (sender) or clears (receiver) this round's buffers.
static void pb_prepare(Role* r, PbState* s, const PbPattern* p) {
  size_t off = 0;
  if (r->sender) {
    for (int k = 0; k < p->nsend; k++) {
      s->off[k] = off;
      fill(s->buf + off, pb_size(s->round, k), pb_seed(s->round, k));
      off += pb_size(s->round, k);
    }
    return;
  }
  memset(s->buf, GUARD, s->cap);
  int e = 0;
  for (int i = 0; i < p->nrecv; i++)
    for (int j = 0; j < p->n[i]; j++, e++) {
      int k = pb_expect(p, i, j);
      s->off[e] = off;
      off += (k < 0 ? 0 : pb_room(s->round, k)) + PB_SLACK;
    }
}

// Posts what is left of this round's requests; 0 when all are posted, 1 for a NULL request
// (try again), -1 on an error.
static int pb_post(Role* r, PbState* s, const PbPattern* p) {
  int count = r->sender ? p->nsend : p->nrecv;
  int e = 0;
  for (int i = 0; i < s->posted; i++) e += r->sender ? 1 : p->n[i];
  while (s->posted < count) {
    int i = s->posted;
    tsn_result_t rc;
    if (r->sender) {
      rc = shim_isend(r->net, r->comm, s->buf + s->off[i], pb_size(s->round, i), p->send_tags[i], s->mh, &s->req[i]);
      if (rc != TSN_SUCCESS) return check(0, "round %d: isend #%d (tag %d) returned %d", s->round, i, p->send_tags[i], rc), -1;
    } else {
      void* data[TSN_MAX_RECVS];
      size_t room[TSN_MAX_RECVS];
      int tags[TSN_MAX_RECVS];
      void* mhs[TSN_MAX_RECVS];
      for (int j = 0; j < p->n[i]; j++) {
        int k = pb_expect(p, i, j);
        data[j] = s->buf + s->off[e + j];
        room[j] = k < 0 ? 0 : pb_room(s->round, k);
        tags[j] = p->tags[i][j];
        mhs[j] = s->mh;
      }
      rc = shim_irecv(r->net, r->comm, p->n[i], data, room, tags, mhs, &s->req[i]);
      if (rc != TSN_SUCCESS) return check(0, "round %d: irecv #%d (n=%d) returned %d", s->round, i, p->n[i], rc), -1;
    }
    if (!s->req[i]) {
      s->nulls++;
      return 1;
    }
    e += r->sender ? 1 : p->n[i];
    s->posted++;
  }
  return 0;
}

// Receive i completed: every entry has the message the rule gives it, whole, nothing after it.
static int pb_validate(PbState* s, const PbPattern* p, int i, const int* sizes) {
  int e = 0, ok = 1;
  for (int a = 0; a < i; a++) e += p->n[a];
  for (int j = 0; j < p->n[i]; j++) {
    int k = pb_expect(p, i, j);
    size_t want = pb_size(s->round, k);
    uint8_t* at = s->buf + s->off[e + j];
    long bad = mismatch(at, want, pb_seed(s->round, k));
    long g = guard_broken(at, want, pb_room(s->round, k) + PB_SLACK);
    if (sizes[j] != (int)want || bad >= 0 || g >= 0) {
      ok = 0;
      check(0,
            "%s (%s first), receive #%d buffer %d (tag %d) should hold send #%d (%zu bytes): size %d; data first difference "
            "%ld; guard first change %ld",
            p->name, s->round < PB_NPAT ? "receiver" : "sender", i, j, p->tags[i][j], k, want, sizes[j], bad, g);
    }
  }
  if (sizes[p->n[i]] != -7) ok = 0, check(0, "receive #%d: test wrote sizes beyond n=%d", i, p->n[i]);
  return ok;
}

static int pb_step(Role* r) {
  PbState* s = r->st;
  if (s->round == PB_ROUNDS) return 1;
  const PbPattern* p = &k_pb[s->round % PB_NPAT];
  int recv_first = s->round < PB_NPAT;
  int first = recv_first == !r->sender;  // this role posts first this round
  const char* order = recv_first ? "receiver first" : "sender first";
  int count = r->sender ? p->nsend : p->nrecv;
  if (!s->posting) {
    if (!first) {
      if (!s->marked) {
        Msg m;
        if (!role_take_mark(r, &m)) return 0;
        if (m.arg != s->round) return check(0, "round %d: the peer's mark names round %d", s->round, m.arg), -1;
        s->marked = 1;
        s->post_at = now_s() + (r->sender ? 0 : PB_WAIT_S);
      }
      if (now_s() < s->post_at) return 0;
    }
    pb_prepare(r, s, p);
    s->posting = 1;
  }
  if (s->posted < count) {
    int k = pb_post(r, s, p);
    if (k < 0) return -1;
    if (k > 0) return 0;
    if (first) role_put_mark(r, s->round, NULL, 0);
  }
  int sizes[TSN_MAX_RECVS + 1];
  for (int i = 0; i < s->posted; i++) {
    if (s->done[i]) continue;
    for (int t = 0; t <= TSN_MAX_RECVS; t++) sizes[t] = -7;
    int done = 0;
    tsn_result_t rc = shim_test(r->net, s->req[i], &done, sizes);
    if (rc != TSN_SUCCESS)
      return check(0, "%s (%s): test of %s #%d returned %d", p->name, order, r->sender ? "send" : "receive", i, rc), -1;
    if (!done) continue;
    s->done[i] = 1;
    s->ndone++;
    if (r->sender) {
      if (sizes[0] != (int)pb_size(s->round, i))
        check(0, "%s (%s): send #%d: test reports %d, sent %zu", p->name, order, i, sizes[0], pb_size(s->round, i));
    } else if (!pb_validate(s, p, i, sizes)) {
      return -1;
    }
  }
  if (s->ndone < count) return 0;
  if (r->sender) {
    check(1, "%s (%s): %d sends completed", p->name, order, p->nsend);
  } else {
    int eager = 0, big = 0;
    for (int k = 0; k < p->nsend; k++) pb_size(s->round, k) <= 8192 ? eager++ : big++;
    check(1, "%s (%s): %d receives got each message by the rule (%d eager-size, %d striped), sizes in buffer order, guards intact",
          p->name, order, p->nrecv, eager, big);
  }
  s->round++;
  s->posting = s->posted = s->ndone = s->marked = 0;
  memset(s->req, 0, sizeof s->req);
  memset(s->done, 0, sizeof s->done);
  if (s->round == PB_ROUNDS && s->nulls) note("%ld NULL requests retried", s->nulls);
  return s->round == PB_ROUNDS;
}

static const PairScenario PUSHBACK = {"pushback", {pb_setup, pb_step}, {pb_setup, pb_step}};

// ---------------------------------------------------------------- teardown

// Tearing a pair down under load, then reconnecting, TD_CYCLES times. Each cycle the receiver
// posts TD_RECVS receives of 1 MiB and the sender streams 1 MiB sends into them (16, or 96 when
// it tears down itself: more than the receives take); one side (the receiver once TD_SEEN
// messages have landed, param TD_BY_RECV; or the sender once a send has completed, TD_BY_SEND)
// deregisters its memory and closes its comm (the receiver its listener
// too) with requests in flight. Every call must return 0, no request on the memory may stay in
// flight, and test() on a request of the closed comm must return an error (a closed comm's
// memory stays readable for that: native/core.cc, retireComm). A mark tells the other side,
// which does the same. The receiver listens again and passes the new handle in a mark; the pair
// reconnects and carries 1 B, 65537 B and 1 MiB + 3, validated. In its own process a role
// checks that its open descriptors (/proc/self/fd, counted after each cycle) do not grow: by at
// most TD_FD_SLACK in all (a protocol thread's first use), by at most 1 over the last two cycles.
#define TD_CYCLES 5
#define TD_RECVS 32
#define TD_MSG ((size_t)1 << 20)
#define TD_SLACK 256
#define TD_SENDS_BY_RECV 16  // the receiver tears down: at least 16 of its receives are unmatched
#define TD_SENDS_BY_SEND 96  // the sender tears down: 64 more than the receives can take stay in flight
#define TD_SEEN 4
#define TD_FD_SLACK 4
#define TD_TAG 1
#define TD_XTAG 10
enum { TD_BY_RECV = 0, TD_BY_SEND = 1 };
enum { TD_MARK_TORN = 1, TD_MARK_HANDLE = 2, TD_MARK_READY = 3 };
enum { TD_LOAD, TD_RUN, TD_DOWN, TD_WAIT_HANDLE, TD_CONNECT, TD_XFER };

static const size_t k_td_xfer[] = {1, 65537, (1 << 20) + 3};
#define TD_NX COUNT_OF(k_td_xfer)

typedef struct TdState {
  int cycle, state, prepared;
  int count;  // load requests this cycle
  void* req[TD_SENDS_BY_SEND];
  int done[TD_SENDS_BY_SEND];
  int posted, ndone, landed;
  void* xreq[TD_NX];
  int xdone[TD_NX];
  int xposted, xndone;
  uint8_t* buf;  // receiver: TD_RECVS slots; sender: the one message every send carries
  size_t cap;
  uint8_t* xbuf;
  size_t xcap, xoff[TD_NX];
  void* mh;
  void* xmh;
  uint8_t handle[TSN_HANDLE_SIZE];
  int have_handle;
  int fds[TD_CYCLES];
  int inflight, cancelled, failed_after, stale_tests;
  long nulls;
} TdState;

// Open descriptors of this process (the directory's own excluded).
static int count_fds_now(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1;
}

// The same once it holds still (three equal counts 10 ms apart, at most 300 ms): a closed
// comm's sockets may close a moment after closeSend/closeRecv returned.
static int count_fds(void) {
  int last = count_fds_now(), same = 1;
  for (int i = 0; i < 30 && same < 3; i++) {
    usleep(10000);
    int n = count_fds_now();
    same = n == last ? same + 1 : 1;
    last = n;
  }
  return last;
}

static const char* td_side(int sender) { return sender ? "sender" : "receiver"; }
static uint32_t td_seed(int cycle) { return seed_of(TD_MSG, 0, 300 + cycle); }

static int td_reg(Role* r, TdState* s) {
  s->mh = role_reg(r, s->buf, s->cap);
  s->xmh = role_reg(r, s->xbuf, s->xcap);
  return s->mh && s->xmh ? 0 : -1;
}

static int td_setup(Role* r) {
  TdState* s = calloc(1, sizeof *s);
  r->st = s;
  s->cap = r->sender ? TD_MSG : TD_RECVS * (TD_MSG + TD_SLACK);
  s->buf = role_alloc(r, s->cap);
  for (int i = 0; i < TD_NX; i++) {
    s->xoff[i] = s->xcap;
    s->xcap += k_td_xfer[i] + TD_SLACK;
  }
  s->xbuf = role_alloc(r, s->xcap);
  if (!s->buf || !s->xbuf) return -1;
  memset(s->buf, GUARD, s->cap);
  memset(s->xbuf, GUARD, s->xcap);
  if (!r->sender) {
    const char* pt = getenv("TSNET_PROTOCOL_THREADS");
    note("teardown by the %s; TSNET_PROTOCOL_THREADS=%s", td_side(r->param == TD_BY_SEND), pt ? pt : "(unset)");
  }
  return td_reg(r, s);
}

// A load receive that completed: its size, data and guard.
static int td_check_load(TdState* s, int i, int got) {
  uint8_t* at = s->buf + (size_t)i * (TD_MSG + TD_SLACK);
  long bad = mismatch(at, TD_MSG, td_seed(s->cycle));
  long g = guard_broken(at, TD_MSG, TD_MSG + TD_SLACK);
  if (got == (int)TD_MSG && bad < 0 && g < 0) return 1;
  return check(0, "cycle %d: load receive #%d: size %d (want %zu), data first difference %ld, guard first change %ld",
               s->cycle, i, got, TD_MSG, bad, g);
}

// The peer's next mark, which must be `want` (the sender's: TD_MARK_TORN; the receiver's:
// TD_MARK_READY, then TD_MARK_HANDLE, each cycle). 1 once it came, 0 before, -1 if another.
static int td_mark(Role* r, TdState* s, int want) {
  Msg m;
  if (!role_take_mark(r, &m)) return 0;
  if (m.arg != want) return check(0, "cycle %d: the %s's mark is %d, expected %d", s->cycle, td_side(!r->sender), m.arg, want), -1;
  if (want == TD_MARK_HANDLE) {
    if (m.len != TSN_HANDLE_SIZE) return check(0, "cycle %d: the mark carries %d bytes, not a handle", s->cycle, m.len), -1;
    memcpy(s->handle, m.data, TSN_HANDLE_SIZE);
    s->have_handle = 1;
  }
  return 1;
}

// Posts what is left of the load; 1 when all are posted.
static int td_post_load(Role* r, TdState* s) {
  if (!s->prepared && r->sender) {
    // The receiver's receives are posted and the last cycle's transfer is in: a send completes
    // when handed over, and a teardown may drop what it handed over before.
    int k = td_mark(r, s, TD_MARK_READY);
    if (k <= 0) return k;
  }
  if (!s->prepared) {
    s->count = r->sender ? (r->param == TD_BY_RECV ? TD_SENDS_BY_RECV : TD_SENDS_BY_SEND) : TD_RECVS;
    if (r->sender) fill(s->buf, TD_MSG, td_seed(s->cycle));
    else memset(s->buf, GUARD, s->cap);
    s->prepared = 1;
  }
  while (s->posted < s->count) {
    int i = s->posted;
    tsn_result_t rc;
    if (r->sender) {
      rc = shim_isend(r->net, r->comm, s->buf, TD_MSG, TD_TAG, s->mh, &s->req[i]);
    } else {
      void* d = s->buf + (size_t)i * (TD_MSG + TD_SLACK);
      size_t room = TD_MSG;
      int tag = TD_TAG;
      rc = shim_irecv(r->net, r->comm, 1, &d, &room, &tag, &s->mh, &s->req[i]);
    }
    if (rc != TSN_SUCCESS) return check(0, "cycle %d: load %s #%d returned %d", s->cycle, r->sender ? "isend" : "irecv", i, rc), -1;
    if (!s->req[i]) {
      s->nulls++;
      return 0;
    }
    s->posted++;
  }
  if (!r->sender) role_put_mark(r, TD_MARK_READY, NULL, 0);
  return 1;
}

// Tests the load requests once each. Before its own teardown the tearing side needs every
// one to succeed; the other side's may fail once the peer has closed.
static int td_test_load(Role* r, TdState* s, int tearer) {
  for (int i = 0; i < s->posted; i++) {
    if (s->done[i]) continue;
    int done = 0, got = -1;
    tsn_result_t rc = shim_test(r->net, s->req[i], &done, &got);
    if (rc != TSN_SUCCESS) {
      if (tearer) return check(0, "cycle %d: load %s #%d failed (rc %d) before the teardown", s->cycle, r->sender ? "send" : "receive", i, rc), -1;
      s->done[i] = 1;
      s->ndone++;
      s->failed_after++;
      continue;
    }
    if (!done) continue;
    s->done[i] = 1;
    s->ndone++;
    s->landed++;
    if (r->sender && got != (int)TD_MSG) return check(0, "cycle %d: load send #%d: test reports %d", s->cycle, i, got), -1;
    if (!r->sender && !td_check_load(s, i, got)) return -1;
  }
  return 0;
}

// Deregisters, tests what was in flight, closes; the receiver listens again and sends its handle.
static int td_down(Role* r, TdState* s, int tearer) {
  const char* what = r->sender ? "send(s)" : "receive(s)";
  int inflight = s->posted - s->ndone;
  int stale = -1;  // left untested until after the close
  for (int i = s->posted - 1; i >= 0 && stale < 0; i--)
    if (!s->done[i]) stale = i;
  if (tearer) {
    s->inflight += inflight;
    check(inflight > 0, "cycle %d: the %s tears down with %d load %s in flight (%d landed)", s->cycle, td_side(r->sender),
          inflight, what, s->landed);
  }
  tsn_result_t a = shim_dereg_mr(r->net, r->comm, s->mh);
  tsn_result_t b = shim_dereg_mr(r->net, r->comm, s->xmh);
  r->nmr = 0;
  if (!check(a == TSN_SUCCESS && b == TSN_SUCCESS, "cycle %d: deregMr with %d %s in flight returns 0 (rc %d, %d)", s->cycle,
             inflight, what, a, b))
    return -1;
  int still = 0, cancelled = 0, tested = 0;
  for (int i = 0; i < s->posted; i++) {
    if (s->done[i] || i == stale) continue;
    int done = 0, got = -1;
    tsn_result_t rc = shim_test(r->net, s->req[i], &done, &got);
    tested++;
    if (!done && rc == TSN_SUCCESS) still++;
    else if (rc != TSN_SUCCESS) cancelled++;
    else if (!r->sender && !td_check_load(s, i, got)) return -1;
    s->done[i] = 1;
  }
  s->cancelled += cancelled;
  if (!check(still == 0, "cycle %d: after deregMr none of the %d %s tested is still in flight (%d cancelled)", s->cycle, tested,
             what, cancelled))
    return -1;
  tsn_result_t rc = r->sender ? shim_close_send(r->net, r->comm) : shim_close_recv(r->net, r->comm);
  r->comm = NULL;
  if (!check(rc == TSN_SUCCESS, "cycle %d: %s returns 0 (rc %d)", s->cycle, r->sender ? "closeSend" : "closeRecv", rc)) return -1;
  if (!r->sender) {
    rc = shim_close_listen(r->net, r->lc);
    r->lc = NULL;
    if (!check(rc == TSN_SUCCESS, "cycle %d: closeListen returns 0 (rc %d)", s->cycle, rc)) return -1;
  }
  // A request of the closed comm: one left in flight, else the last one posted.
  int k = stale >= 0 ? stale : s->posted - 1;
  if (k >= 0) {
    int done = 0, got = -1;
    rc = shim_test(r->net, s->req[k], &done, &got);
    s->stale_tests++;
    if (!check(rc != TSN_SUCCESS, "cycle %d: test() on %s #%d of the closed comm returns an error (rc %d)", s->cycle,
               r->sender ? "send" : "receive", k, rc))
      return -1;
  }
  if (r->sender) {
    if (tearer) role_put_mark(r, TD_MARK_TORN, NULL, 0);
    return 0;
  }
  uint8_t h[TSN_HANDLE_SIZE];
  memset(h, 0, sizeof h);
  rc = shim_listen(r->net, r->ctx, r->dev, h, &r->lc);
  if (!check(rc == TSN_SUCCESS && r->lc, "cycle %d: listen again (rc %d)", s->cycle, rc)) return -1;
  role_put_mark(r, TD_MARK_HANDLE, h, TSN_HANDLE_SIZE);
  return 0;
}


// The validated transfer on the new pair; 1 once it is done.
static int td_xfer(Role* r, TdState* s) {
  if (s->xposted == 0 && s->xndone == 0 && !s->xreq[0]) {
    if (r->sender)
      for (int i = 0; i < TD_NX; i++) fill(s->xbuf + s->xoff[i], k_td_xfer[i], seed_of(k_td_xfer[i], i, 400 + s->cycle));
    else memset(s->xbuf, GUARD, s->xcap);
  }
  while (s->xposted < TD_NX) {
    int i = s->xposted;
    tsn_result_t rc;
    if (r->sender) {
      rc = shim_isend(r->net, r->comm, s->xbuf + s->xoff[i], k_td_xfer[i], TD_XTAG + i, s->xmh, &s->xreq[i]);
    } else {
      void* d = s->xbuf + s->xoff[i];
      size_t room = k_td_xfer[i];
      int tag = TD_XTAG + i;
      rc = shim_irecv(r->net, r->comm, 1, &d, &room, &tag, &s->xmh, &s->xreq[i]);
    }
    if (rc != TSN_SUCCESS) return check(0, "cycle %d: transfer %s #%d returned %d", s->cycle, r->sender ? "isend" : "irecv", i, rc), -1;
    if (!s->xreq[i]) {
      s->nulls++;
      return 0;
    }
    s->xposted++;
  }
  for (int i = 0; i < TD_NX; i++) {
    if (s->xdone[i]) continue;
    int done = 0, got = -1;
    tsn_result_t rc = shim_test(r->net, s->xreq[i], &done, &got);
    if (rc != TSN_SUCCESS) return check(0, "cycle %d: test of transfer #%d after reconnecting returned %d", s->cycle, i, rc), -1;
    if (!done) continue;
    s->xdone[i] = 1;
    s->xndone++;
    long bad = -1, g = -1;
    if (!r->sender) {
      bad = mismatch(s->xbuf + s->xoff[i], k_td_xfer[i], seed_of(k_td_xfer[i], i, 400 + s->cycle));
      g = guard_broken(s->xbuf + s->xoff[i], k_td_xfer[i], k_td_xfer[i] + TD_SLACK);
    }
    if (got != (int)k_td_xfer[i] || bad >= 0 || g >= 0)
      return check(0, "cycle %d: after reconnecting, %zu bytes: size %d, data first difference %ld, guard first change %ld",
                   s->cycle, k_td_xfer[i], got, bad, g), -1;
  }
  if (s->xndone < TD_NX) return 0;
  check(1, "cycle %d: reconnected; 1 B, 65537 B and 1 MiB + 3 %s", s->cycle, r->sender ? "sent" : "received, validated");
  return 1;
}

static int td_step(Role* r) {
  TdState* s = r->st;
  int tearer = (r->param == TD_BY_SEND) == r->sender;
  switch (s->state) {
    case TD_LOAD: {
      int k = td_post_load(r, s);
      if (k <= 0) return k;
      s->state = TD_RUN;
    }
    /* fallthrough */
    case TD_RUN: {
      if (td_test_load(r, s, tearer)) return -1;
      if (tearer) {
        if (s->landed < (r->sender ? 1 : TD_SEEN)) return 0;
      } else {
        int k = td_mark(r, s, r->sender ? TD_MARK_HANDLE : TD_MARK_TORN);
        if (k <= 0) return k;
      }
      s->state = TD_DOWN;
    }
    /* fallthrough */
    case TD_DOWN:
      if (td_down(r, s, tearer)) return -1;
      s->state = r->sender && !s->have_handle ? TD_WAIT_HANDLE : TD_CONNECT;
      return 0;
    case TD_WAIT_HANDLE: {
      int k = td_mark(r, s, TD_MARK_HANDLE);
      if (k <= 0) return k;
      s->state = TD_CONNECT;
    }
    /* fallthrough */
    case TD_CONNECT: {
      void* c = NULL;
      tsn_result_t rc = r->sender ? shim_connect(r->net, r->ctx, r->dev, s->handle, &c) : shim_accept(r->net, r->lc, &c);
      if (rc != TSN_SUCCESS) return check(0, "cycle %d: %s again returned %d", s->cycle, r->sender ? "connect" : "accept", rc), -1;
      if (!c) return 0;
      r->comm = c;
      s->have_handle = 0;
      if (td_reg(r, s)) return -1;
      memset(s->xreq, 0, sizeof s->xreq);
      memset(s->xdone, 0, sizeof s->xdone);
      s->xposted = s->xndone = 0;
      s->state = TD_XFER;
    }
    /* fallthrough */
    case TD_XFER: {
      int k = td_xfer(r, s);
      if (k <= 0) return k;
      s->fds[s->cycle] = g_procs == 2 || g_role != ROLE_BOTH ? count_fds() : count_fds_now();  // checked in its own process only
      s->cycle++;
      r->deadline = now_s() + g_timeout;  // each cycle has the whole timeout
      s->state = TD_LOAD;
      s->prepared = s->posted = s->ndone = s->landed = 0;
      memset(s->req, 0, sizeof s->req);
      memset(s->done, 0, sizeof s->done);
      if (s->cycle < TD_CYCLES) return 0;
    }
  }
  // Every cycle is done.
  char fds[96];
  int n = 0, grow = 0;
  for (int c = 0; c < TD_CYCLES; c++) {
    n += snprintf(fds + n, sizeof fds - (size_t)n, "%s%d", c ? " " : "", s->fds[c]);
    if (s->fds[c] - s->fds[0] > grow) grow = s->fds[c] - s->fds[0];
  }
  if (r->sender == (r->param == TD_BY_SEND))
    check(1, "%d cycles: torn down by the %s with %d load requests in flight (%d tested after deregMr: an error), reconnected, validated",
          TD_CYCLES, td_side(r->sender), s->inflight, s->cancelled);
  else
    check(1, "%d cycles: followed the %s's teardown (%d requests failed once it had closed, %d tested after deregMr: an error), "
          "reconnected, validated", TD_CYCLES, td_side(!r->sender), s->failed_after, s->cancelled);
  // Some growth once (a protocol thread's first connection); a leak grows every cycle.
  int late = s->fds[TD_CYCLES - 1] - s->fds[TD_CYCLES - 3];
  if (g_procs == 2 || g_role != ROLE_BOTH)
    check(grow <= TD_FD_SLACK && late <= 1, "open descriptors after each cycle: %s (grew by %d, at most %d; by %d over the last two cycles, at most 1)",
          fds, grow, TD_FD_SLACK, late);
  else
    note("open descriptors after each cycle: %s (both roles share this process: not checked)", fds);
  if (s->nulls) note("%ld NULL requests retried", s->nulls);
  return 1;
}

static const PairScenario TEARDOWN = {"teardown", {td_setup, td_step}, {td_setup, td_step}};

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
  // Hints as NCCL gives them, the same ones again and again: two distinct ones, four calls
  // (the plugin hears each distinct one once; TSNET_STATS counts the calls it ran).
  if (shim_has_ctx(n->version)) {
    tsn_net_attr_t a[2] = {{{4, 1, 2, 1}, {4, 1, 2, 1}, 1u << 4, 1u << 1, 1u << 2}, {{8, 1, 1, 1}, {8, 1, 1, 1}, 1u << 6, 0, 1u << 2}};
    for (int i = 0; i < 4; i++) {
      rc = shim_set_net_attr(n, *ctx, &a[i / 3]);
      if (!check(rc == TSN_SUCCESS, "setNetAttr (rc %d)", rc)) return -1;
    }
  }
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

// open_net, then init_ctx; on failure the library is closed again. Returns 0 on success.
static int open_with_ctx(Net* n, int version, void** ctx) {
  if (open_net(n, version)) return -1;
  if (init_ctx(n, ctx, COMM_ID) == 0) return 0;
  shim_close(n);
  return -1;
}

static const char* g_rdv;       // --rendezvous DIR: where the roles leave their messages
static int g_pair_seq;          // pairs run so far in this scenario (names the rendezvous files)

static int is_loopback(void) {
  const char* t = getenv("TSNET_TRANSPORT");
  return t && !strcasecmp(t, "loopback");
}

static int is_ofi(void) {
  const char* t = getenv("TSNET_TRANSPORT");
  return t && !strcasecmp(t, "ofi");
}

// libfabric's shm provider names each endpoint's shared-memory region after the process
// ("<pid>:<n>:<n>" in /dev/shm). After the last finalize none of this process's may be left:
// a process that ends with _exit (as these roles do) would leak it, and a later process given
// the same pid could not enable its endpoint.
// Regions an earlier process with this pid left (test/driver/shim.h) are not this one's.
static ShimStale g_stale;
static void note_stale_regions(void) { shim_stale_note(&g_stale); }

static void first_region(const char* path, void* arg) {
  char* first = arg;
  if (!first[0] && !shim_stale_has(&g_stale, path)) snprintf(first, 256, "%s", path + strlen("/dev/shm/"));
}

// Removes the regions an earlier process with this pid left, still untouched, with a note each.
static void forget_stale_regions(void) {
  for (int i = 0; i < g_stale.n; i++)
    if (shim_stale_has(&g_stale, g_stale.r[i].path) && unlink(g_stale.r[i].path) == 0)
      note("removed %s: there before this process loaded the library (an earlier process with pid %d left it)",
           g_stale.r[i].path, (int)getpid());
  g_stale.n = 0;
}

// This process's doorbells (native/ofi/ofi_bell.cc): pages /dev/shm/tsnet-bell-<hash> whose
// third word is their owner's pid, each with its socket <page>.s beside it.
static int bells_of(pid_t pid) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  struct dirent* e;
  while ((e = readdir(d))) {
    const char* nm = e->d_name;
    size_t len = strlen(nm);
    if (strncmp(nm, "tsnet-bell-", 11) || (len > 2 && !strcmp(nm + len - 2, ".s"))) continue;
    char path[300], sock[310];
    snprintf(path, sizeof path, "/dev/shm/%s", nm);
    snprintf(sock, sizeof sock, "%s.s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    int32_t owner = 0;
    ssize_t r = pread(fd, &owner, sizeof owner, 8);
    close(fd);
    if (r == (ssize_t)sizeof owner && owner == (int32_t)pid && access(sock, F_OK) == 0) n++;
  }
  closedir(d);
  return n;
}

static void check_no_shm_regions(void) {
  const char* p = getenv("FI_PROVIDER");
  if (!is_ofi() || !p || strcmp(p, "shm")) return;
  char left[256] = "";
  shim_shm_regions((int)getpid(), 0, first_region, left);
  check(!left[0], "after finalize no libfabric shm region of this process is left in /dev/shm%s%s", left[0] ? ": " : "",
        left);
  int bells = bells_of(getpid());
  check(bells == 0, "after finalize no doorbell of this process is left in /dev/shm (%d)", bells);
  forget_stale_regions();
}

// One role in this process: it loads the library itself.
static void role_run(int version, const PairScenario* sc, int param, int sender, Chan ch) {
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
      if (shim_has_ctx(version)) check_no_shm_regions();
    } else {
      chan_put(&ch, MSG_ABORT, NULL, 0);
    }
    shim_close(&n);
  } else {
    chan_put(&ch, MSG_ABORT, NULL, 0);
  }
}

// One role in a forked process; reports its counts on resfd.
// A role that dies of a fault says where on stderr (the thread's name and the native
// stack), then dies of the same signal: the parent still reports "died of signal N".
static void crash_report(int sig, siginfo_t* si, void* uc) {
  (void)uc;
  char head[160], thread[17] = {0};
  prctl(PR_GET_NAME, thread, 0, 0, 0);
  int n = snprintf(head, sizeof head, "CRASH: pid %d thread %s: signal %d at address %p; native stack:\n", (int)getpid(),
                   thread, sig, si ? si->si_addr : NULL);
  ssize_t w = write(2, head, (size_t)n);
  (void)w;
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  // SA_RESETHAND restored the default action: returning faults again and ends the process.
}

static void install_crash_report(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = crash_report;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE};
  for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++) sigaction(sigs[k], &sa, NULL);
}

// A forked child that does not end in time is sent SIGQUIT before SIGKILL: it prints its stack
// (it has one thread) and exits 99, so the failure says where it was stuck.
static void stuck_report(int sig, siginfo_t* si, void* uc) {
  crash_report(sig, si, uc);
  _exit(99);
}

static void install_stuck_report(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = stuck_report;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGQUIT, &sa, NULL);
}

static void __attribute__((noreturn)) role_process(int version, const PairScenario* sc, int param, int sender, Chan ch,
                                                   int resfd) {
  g_pass = g_fail = 0;
  install_crash_report();
  role_run(version, sc, param, sender, ch);
  int counts[2] = {g_pass, g_fail};
  ssize_t w = write(resfd, counts, sizeof counts);
  (void)w;
  fflush(stdout);
  _exit(g_fail ? 1 : 0);
}

// libfabric's shm regions of a process this driver reaped: one that was killed (killpeer, a
// timeout) cannot remove its own, and a later process given the same pid would fail to
// enable its endpoint. A role that ends normally has none left (check_no_shm_regions).
static void forget_shm(pid_t pid) { shim_shm_regions((int)pid, 1, NULL, NULL); }

// Waits (at most until `end`) for a role process and folds its results in.
// Waits for child pid until end (now_s() time); SIGKILLs it then. Returns pid when it ended by
// itself, 0 when it had to be killed; *status is its wait status either way.
static pid_t waitpid_until(pid_t pid, int* status, double end) {
  pid_t w;
  while ((w = waitpid(pid, status, WNOHANG)) == 0 && now_s() < end) usleep(1000);
  return w;
}

static pid_t wait_until(pid_t pid, int* status, double end) {
  pid_t w = waitpid_until(pid, status, end);
  if (w != 0) return w;
  kill(pid, SIGKILL);
  waitpid(pid, status, 0);
  return 0;
}

static void reap_role(pid_t pid, int resfd, const char* what, double end) {
  int status = 0;
  if (wait_until(pid, &status, end) == 0) {
    check(0, "the %s process (pid %d) did not exit in time: killed", what, (int)pid);
  }
  forget_shm(pid);
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
  if (g_role != ROLE_BOTH) {
    Chan ch;
    memset(&ch, 0, sizeof ch);
    ch.rfd = ch.wfd = -1;
    ch.dir = g_rdv;
    ch.sender = g_role == ROLE_SEND;
    snprintf(ch.key, sizeof ch.key, "v%d-%s-%d", version, sc->name, g_pair_seq++);
    role_run(version, sc, param, ch.sender, ch);
    return;
  }
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

// A receive of one buffer [buf, buf+size) with registration mh and tag on rc; its rc, *req the request.
static tsn_result_t recv_one(const Net* n, void* rc, void* buf, size_t size, int tag, void* mh, void** req) {
  void* d = buf;
  *req = NULL;
  return shim_irecv(n, rc, 1, &d, &size, &tag, &mh, req);
}

// An isend of [buf, buf+size) with registration mh and tag on sc, posted again while the comm
// answers with a NULL request (every slot in flight), until g_timeout: its last rc, *req the
// request (NULL if none came).
static tsn_result_t send_one(const Net* n, void* sc, void* buf, size_t size, int tag, void* mh, void** req) {
  tsn_result_t r = TSN_SUCCESS;
  *req = NULL;
  for (double end = now_s() + g_timeout; !*req && r == TSN_SUCCESS && now_s() < end;) r = shim_isend(n, sc, buf, size, tag, mh, req);
  return r;
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
  uint64_t guids[MAXDEV];
  int nguids = 0;
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
    note("dev %d: %s guid 0x%016llx", d, p.name ? p.name : "(null)", (unsigned long long)p.guid);
    guids[nguids++] = p.guid;
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
  // NCCL takes devices with one guid (and port) for ports of one NIC: each device needs its own.
  int same = 0;
  for (int i = 0; i < nguids; i++)
    for (int k = i + 1; k < nguids; k++) same += guids[i] == guids[k];
  check(nguids > 0 && same == 0, "the %d devices' guids are distinct (%d equal pairs)", nguids, same);
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
  if (g_procs == 2 || g_role != ROLE_BOTH) {  // across processes: the oversize send
    run_pair(version, &OVERSIZE, 0);
    return;
  }
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  if (shim_has_ctx(version)) {  // v11+: init returns the context through ctx, so NULL cannot be served
    tsn_result_t r0 = shim_init(&n, NULL, COMM_ID, logger);
    check(r0 == TSN_INVALID_ARGUMENT, "init with a NULL ctx fails with ncclInvalidArgument (rc %d)", r0);
  }
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
    // Host regions larger than tsnet takes (a JavaScript view is at most 4 GiB; a v6/v7 int size
    // of -1 arrives as SIZE_MAX), and NULL data: refused with ncclInvalidArgument, touching nothing.
    {
      size_t sizes[] = {((size_t)5) << 30, (size_t)-1};
      for (int i = 0; i < 2 && version >= 8; i++) {  // v6/v7 take an int size
        void* mh = NULL;
        rc = shim_reg_mr(&n, sc, sbuf, sizes[i], TSN_PTR_HOST, &mh);
        check(rc == TSN_INVALID_ARGUMENT && !mh, "regMr of %zu host bytes fails with ncclInvalidArgument (rc %d)", sizes[i], rc);
      }
      void* mh = NULL;
      rc = shim_reg_mr(&n, sc, NULL, 0, TSN_PTR_HOST, &mh);
      check(rc == TSN_INVALID_ARGUMENT && !mh, "regMr of NULL data fails with ncclInvalidArgument (rc %d)", rc);
    }
    // regMrDmaBuf: in every table, and refused where the device offers no DMA-BUF (here, where
    // no GPU exports them), and for an fd that is none, with a WARN and no handle.
    {
      int fd = memfd_create("tsnet-driver-dmabuf", 0);
      void* mh = (void*)1;
      rc = shim_reg_mr_dma_buf(&n, sc, sbuf, 4096, TSN_PTR_CUDA, 0, fd, &mh);
      if (props.ptrSupport & TSN_PTR_DMABUF) {
        check(rc != TSN_SUCCESS, "regMrDmaBuf of host memory as GPU memory fails (rc %d)", rc);
      } else {
        check(rc != TSN_SUCCESS && rc != -1, "regMrDmaBuf is in the table and fails without DMA-BUF in ptrSupport 0x%x (rc %d)",
              props.ptrSupport, rc);
      }
      if (rc == TSN_SUCCESS && mh) shim_dereg_mr(&n, sc, mh);
      mh = NULL;
      rc = shim_reg_mr_dma_buf(&n, sc, sbuf, 4096, TSN_PTR_CUDA, 0, -1, &mh);
      check(rc == TSN_INVALID_ARGUMENT && mh == NULL, "regMrDmaBuf with fd -1 fails with ncclInvalidArgument (rc %d)", rc);
      rc = shim_reg_mr_dma_buf(&n, sc, sbuf, 4096, TSN_PTR_CUDA, (uint64_t)(uintptr_t)sbuf + 1, fd, &mh);
      check(rc == TSN_INVALID_ARGUMENT && mh == NULL, "regMrDmaBuf with an offset past the address fails (rc %d)", rc);
      if (fd >= 0) close(fd);
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
    // A 16 KiB send into a 4 KiB receive: the receive ends in an error, nothing is written past
    // 4 KiB, and the sender learns it no later than its next operation on the comm (a send
    // completes when its bytes are handed over: it may complete before the receiver's word).
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
      int sdone = 0, rdone = 0, later = 0;
      double end = now_s() + g_timeout;
      while (!(rdone && sdone && src != TSN_SUCCESS) && now_s() < end) {
        int dn = 0;
        if (!sdone && ((src = shim_test(&n, sreq, &dn, got)) != TSN_SUCCESS || dn)) sdone = 1;
        if (sdone && src == TSN_SUCCESS && later < 1000) {
          // The send completed: a later operation must carry the error.
          void* again = NULL;
          rc = shim_isend(&n, sc, sbuf, 1, 0, whole, &again);
          later++;
          if (rc != TSN_SUCCESS) src = rc;
          else if (again) {
            sreq = again;
            sdone = 0;
          }
        }
        dn = 0;
        if (!rdone && ((rrc = shim_test(&n, rreq, &dn, got)) != TSN_SUCCESS || dn)) rdone = 1;
      }
      check(sdone && src != TSN_SUCCESS,
            "16 KiB send into a 4 KiB receive: the sender's error surfaced (%s, rc %d, on %s)",
            sdone ? "ended" : "timed out", src, later ? "a later send" : "the send itself");
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

// The signal masks of the plugin's threads (tsnet-*, from /proc/self/task/*/status): the
// host's asynchronous signals blocked, faults not (native/guest.h).
static void check_thread_mask(const char* name, const char* dir, void* arg) {
  (void)arg;
  char path[340], line[256];
  snprintf(path, sizeof path, "%s/status", dir);
  FILE* f = fopen(path, "r");
  unsigned long long blk = 0;
  int have = 0;
  while (f && !have && fgets(line, sizeof line, f)) have = sscanf(line, "SigBlk: %llx", &blk) == 1;
  if (f) fclose(f);
  if (!have) return;  // the thread ended meanwhile
  int host[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM, SIGPIPE};
  int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  int ok = 1;
  for (size_t i = 0; i < COUNT_OF(host); i++) ok &= (int)(blk >> (host[i] - 1)) & 1;
  for (size_t i = 0; i < COUNT_OF(faults); i++) ok &= !((blk >> (faults[i] - 1)) & 1);
  check(ok, "thread %s blocks the host's signals and no fault signal (SigBlk %llx)", name, blk);
}

// Checks every tsnet-* thread's mask; returns the threads seen.
static int check_thread_masks(void) { return shim_threads("tsnet", check_thread_mask, NULL); }

static void sc_lifecycle(int version) {
  set_prefix(version, "lifecycle", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
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
    int threads = check_thread_masks();
    check(threads > 0, "the plugin's threads are named tsnet-* (%d seen)", threads);
    int plugin = shim_threads("tsnet-plugin", NULL, NULL), v8 = shim_threads("tsnet-v8", NULL, NULL);
    // A thread a library starts from thread 0 inherits its name too (libfabric tcp's progress thread).
    check(plugin >= 1 && v8 == 3, "thread 0 is tsnet-plugin (%d seen) and Node's 3 platform threads are tsnet-v8 (%d seen)", plugin, v8);
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

// ---------------------------------------------------------------- fork

// Adds the pass and fail counts a child process wrote on fd to this process's; closes fd and
// returns what read() gave (sizeof int[2] when the child reported).
static ssize_t take_counts(int fd) {
  int counts[2] = {0, 0};
  ssize_t got = read(fd, counts, sizeof counts);
  close(fd);
  g_pass += counts[0];
  g_fail += counts[1];
  return got;
}

// A training job forks after NCCL has started (data loader workers, helpers that exit
// normally). The child inherits the plugin's memory but none of its threads: each call it
// makes must fail at once with an error, never wait on a thread that is not there, and its
// exit, through exit() and its libraries' destructors, must leave the parent's comms, a
// receive in flight across the fork, and (libfabric shm) the parent's region working.
#define FORK_TAG 7

// One message of size from sc to rc, validated; rreq is a receive already posted into rbuf
// for it, or NULL to post one now.
static int fork_roundtrip(const Net* n, void* sc, void* rc, void* smh, void* rmh, uint8_t* sbuf, uint8_t* rbuf,
                          size_t size, int salt, void* rreq, const char* what) {
  uint32_t seed = seed_of(size, 0, salt);
  fill(sbuf, size, seed);
  tsn_result_t r;
  if (!rreq) {
    void* d = rbuf;
    size_t room = size;
    int tag = FORK_TAG;
    r = shim_irecv(n, rc, 1, &d, &room, &tag, &rmh, &rreq);
    if (r != TSN_SUCCESS || !rreq) return check(0, "%s: irecv (rc %d)", what, r), -1;
  }
  void* sreq = NULL;
  double end = now_s() + g_timeout;
  while (!sreq && now_s() < end)
    if ((r = shim_isend(n, sc, sbuf, size, FORK_TAG, smh, &sreq)) != TSN_SUCCESS) return check(0, "%s: isend (rc %d)", what, r), -1;
  int ss = -1, rs = -1;
  tsn_result_t a = sreq ? wait_req(n, sreq, &ss, g_timeout) : -1, b = wait_req(n, rreq, &rs, g_timeout);
  long bad = b == TSN_SUCCESS ? mismatch(rbuf, size, seed) : 0;
  return check(a == TSN_SUCCESS && b == TSN_SUCCESS && rs == (int)size && bad < 0,
               "%s: %zu bytes (send rc %d, recv rc %d, received %d, first wrong byte %ld)", what, size, a, b, rs, bad)
             ? 0
             : -1;
}

// The forked child: every call on what it inherited fails at once with ncclInternalError;
// then it exits through exit(), so that every destructor of the process runs (the plugin's,
// Node's, libfabric's).
static void __attribute__((noreturn)) fork_child(const Net* n, void* ctx, void* lc, void* sc, void* rc, void* smh,
                                                 void* rmh, uint8_t* sbuf, uint8_t* rbuf, void* rreq, int resfd) {
  g_pass = g_fail = 0;
  watchdog(g_timeout);  // a pending alarm is not inherited
  install_stuck_report();
  set_prefix(n->version, "fork", "child");
  double t0 = now_s();
  void* req = NULL;
  tsn_result_t r = shim_isend(n, sc, sbuf, 8, FORK_TAG, smh, &req);
  check(r == TSN_INTERNAL_ERROR && !req, "isend on the parent's send comm fails (rc %d, request %p)", r, req);
  void* d = rbuf;
  size_t room = 8;
  int tag = FORK_TAG;
  req = NULL;
  r = shim_irecv(n, rc, 1, &d, &room, &tag, &rmh, &req);
  check(r == TSN_INTERNAL_ERROR && !req, "irecv on the parent's receive comm fails (rc %d, request %p)", r, req);
  int done = 0, size = -1;
  r = shim_test(n, rreq, &done, &size);
  check(r == TSN_INTERNAL_ERROR, "test() of the parent's receive in flight fails instead of never completing (rc %d, done %d)", r,
        done);
  void* mh = NULL;
  r = shim_reg_mr(n, sc, sbuf, 8, TSN_PTR_HOST, &mh);
  check(r == TSN_INTERNAL_ERROR && !mh, "regMr fails (rc %d)", r);
  uint8_t handle[TSN_HANDLE_SIZE];
  void* l = NULL;
  r = shim_listen(n, ctx, g_dev, handle, &l);
  check(r == TSN_INTERNAL_ERROR && !l, "listen fails (rc %d)", r);
  r = shim_close_listen(n, lc);
  check(r == TSN_INTERNAL_ERROR, "closeListen of the parent's listener fails (rc %d)", r);
  if (shim_has_ctx(n->version)) {
    void* c2 = NULL;
    r = shim_init(n, &c2, COMM_ID + 9, logger);
    check(r == TSN_INTERNAL_ERROR, "init fails (rc %d)", r);
  }
  double took = now_s() - t0;
  check(took < 2.0, "each call returned at once (%.3f s for all)", took);
  int counts[2] = {g_pass, g_fail};
  ssize_t w = write(resfd, counts, sizeof counts);
  (void)w;
  exit(g_fail ? 1 : 0);
}

static void sc_fork(int version) {
  set_prefix(version, "fork", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  enum { MB = 1 << 20 };
  uint8_t* sbuf = malloc(MB);
  uint8_t* rbuf = malloc(MB);
  void *lc, *sc, *rc, *smh = NULL, *rmh = NULL;
  if (pair_open(&n, ctx, &lc, &sc, &rc) != 0) goto out;
  tsn_result_t a = shim_reg_mr(&n, sc, sbuf, MB, TSN_PTR_HOST, &smh), b = shim_reg_mr(&n, rc, rbuf, MB, TSN_PTR_HOST, &rmh);
  if (!check(a == TSN_SUCCESS && b == TSN_SUCCESS, "regMr on both comms (rc %d, %d)", a, b)) goto close;
  if (fork_roundtrip(&n, sc, rc, smh, rmh, sbuf, rbuf, 8, 400, NULL, "before the fork") ||
      fork_roundtrip(&n, sc, rc, smh, rmh, sbuf, rbuf, MB, 401, NULL, "before the fork"))
    goto close;
  char region[256] = "";
  shim_shm_regions((int)getpid(), 0, first_region, region);
  int bells = bells_of(getpid());
  // A receive in flight across the fork.
  void* rreq = NULL;
  {
    void* d = rbuf;
    size_t room = MB;
    int tag = FORK_TAG;
    tsn_result_t r = shim_irecv(&n, rc, 1, &d, &room, &tag, &rmh, &rreq);
    if (!check(r == TSN_SUCCESS && rreq, "a receive posted before the fork (rc %d)", r)) goto close;
  }
  int res[2];
  if (pipe(res) != 0) {
    check(0, "pipe: %s", strerror(errno));
    goto close;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(res[0]);
    fork_child(&n, ctx, lc, sc, rc, smh, rmh, sbuf, rbuf, rreq, res[1]);
  }
  close(res[1]);
  if (!check(pid > 0, "fork (%s)", pid < 0 ? strerror(errno) : "a child")) { close(res[0]); goto close; }
  int status = 0;
  pid_t got = waitpid_until(pid, &status, now_s() + g_timeout);
  if (got == 0) {
    kill(pid, SIGQUIT);  // install_stuck_report: its stack on stderr, then exit 99
    got = waitpid_until(pid, &status, now_s() + 5);
    if (got == 0) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    got = 0;
  }
  ssize_t rd = take_counts(res[0]);
  set_prefix(version, "fork", NULL);
  check(got == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && rd == (ssize_t)(2 * sizeof(int)),
        "the forked child returned from every call, reported, and exited through exit() with 0 (%s, status %d, %s)",
        got == 0 ? "still running: killed" : WIFSIGNALED(status) ? "killed by a signal" : "exited", status,
        rd == (ssize_t)(2 * sizeof(int)) ? "it reported" : "no report");
  // The parent goes on: the receive posted before the fork, more messages, a new pair.
  fork_roundtrip(&n, sc, rc, smh, rmh, sbuf, rbuf, MB, 402, rreq, "after the child's exit, into the receive posted before the fork");
  fork_roundtrip(&n, sc, rc, smh, rmh, sbuf, rbuf, 8, 403, NULL, "after the child's exit");
  if (region[0]) {
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", region);
    check(access(path, F_OK) == 0, "the libfabric shm region %s is still in /dev/shm after the child's exit", region);
  }
  // The child ran the library's destructors at its exit(): the bells are the parent's still.
  if (bells) check(bells_of(getpid()) == bells, "the %d doorbell(s) of this process are still in /dev/shm after the child's exit", bells);
  {
    void *lc2, *sc2, *rc2, *smh2 = NULL, *rmh2 = NULL;
    if (pair_open(&n, ctx, &lc2, &sc2, &rc2) == 0) {
      a = shim_reg_mr(&n, sc2, sbuf, MB, TSN_PTR_HOST, &smh2);
      b = shim_reg_mr(&n, rc2, rbuf, MB, TSN_PTR_HOST, &rmh2);
      if (check(a == TSN_SUCCESS && b == TSN_SUCCESS, "regMr on a new pair (rc %d, %d)", a, b))
        fork_roundtrip(&n, sc2, rc2, smh2, rmh2, sbuf, rbuf, MB, 404, NULL, "a new pair after the child's exit");
      if (smh2) shim_dereg_mr(&n, sc2, smh2);
      if (rmh2) shim_dereg_mr(&n, rc2, rmh2);
      pair_close(&n, lc2, sc2, rc2, 1);
    }
  }
close:
  if (smh) shim_dereg_mr(&n, sc, smh);
  if (rmh) shim_dereg_mr(&n, rc, rmh);
  pair_close(&n, lc, sc, rc, 1);
out:
  free(sbuf);
  free(rbuf);
  fini_ctx(&n, ctx);
  if (shim_has_ctx(version)) check_no_shm_regions();
  shim_close(&n);
}

// ---------------------------------------------------------------- stopped

// The plugin's protocol thread stops while comms are open (the plugin called process.exit()):
// run by test/driver/stopped.test.ts with TSNET_JS_ENTRY naming a wrapper of the plugin that
// calls process.exit() once the file TSNET_TEST_EXIT_FILE exists. Every later call must fail at
// once, a receive posted before must end in an error (not "not done" forever), and the closes
// must return.
static void sc_stopped(int version) {
  set_prefix(version, "stopped", NULL);
  const char* file = getenv("TSNET_TEST_EXIT_FILE");
  if (!file) {
    note("skip: TSNET_TEST_EXIT_FILE is not set (test/driver/stopped.test.ts sets it)");
    return;
  }
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  enum { SIZE = 4096 };
  uint8_t* sbuf = malloc(SIZE);
  uint8_t* rbuf = malloc(SIZE);
  void *lc, *sc, *rc, *smh = NULL, *rmh = NULL;
  if (pair_open(&n, ctx, &lc, &sc, &rc) != 0) goto out;
  tsn_result_t a = shim_reg_mr(&n, sc, sbuf, SIZE, TSN_PTR_HOST, &smh), b = shim_reg_mr(&n, rc, rbuf, SIZE, TSN_PTR_HOST, &rmh);
  if (!check(a == TSN_SUCCESS && b == TSN_SUCCESS, "regMr on both comms (rc %d, %d)", a, b)) goto out;
  void* rreq = NULL;
  void* d = rbuf;
  size_t room = SIZE;
  int tag = 1;
  tsn_result_t r = shim_irecv(&n, rc, 1, &d, &room, &tag, &rmh, &rreq);
  if (!check(r == TSN_SUCCESS && rreq, "a receive posted before the stop (rc %d)", r)) goto out;
  int fds = count_fds();
  char region[256] = "";
  shim_shm_regions((int)getpid(), 0, first_region, region);
  FILE* f = fopen(file, "w");
  if (!check(f != NULL, "create %s", file)) goto out;
  fclose(f);
  // The thread is gone once a control call says so.
  int ndev = 0;
  double end = now_s() + g_timeout;
  while ((r = shim_devices(&n, &ndev)) == TSN_SUCCESS && now_s() < end) usleep(5000);
  if (!check(r != TSN_SUCCESS, "devices() fails once the plugin's thread has stopped (rc %d)", r)) goto out;
  // Its lanes are closed with it: nothing may land in buffers NCCL takes back after its closes.
  if (is_ofi()) {
    char left[256];
    double until = now_s() + 2;  // the I/O thread closes an endpoint whose lock it held a moment later
    do {
      left[0] = 0;
      shim_shm_regions((int)getpid(), 0, first_region, left);
      if (!left[0]) break;
      usleep(10000);
    } while (now_s() < until);
    if (region[0]) check(!left[0], "the stopped thread's libfabric shm region %s is gone%s%s", region, left[0] ? "; left: " : "", left);
  } else if (!is_loopback()) {
    int now = count_fds();
    check(now < fds, "the stopped thread's sockets are closed (%d descriptors before, %d after)", fds, now);
  }
  double t0 = now_s();
  void* req = NULL;
  r = shim_isend(&n, sc, sbuf, 8, 1, smh, &req);
  check(r == TSN_INTERNAL_ERROR && !req, "isend fails (rc %d, request %p)", r, req);
  req = NULL;
  r = shim_irecv(&n, rc, 1, &d, &room, &tag, &rmh, &req);
  check(r == TSN_INTERNAL_ERROR && !req, "irecv fails (rc %d, request %p)", r, req);
  int done = 0, size = -1;
  r = shim_test(&n, rreq, &done, &size);
  check(r == TSN_INTERNAL_ERROR, "test() of the receive posted before the stop fails (rc %d, done %d)", r, done);
  r = shim_dereg_mr(&n, sc, smh);
  check(r != TSN_SUCCESS, "deregMr fails (rc %d)", r);
  tsn_result_t c1 = shim_close_send(&n, sc), c2 = shim_close_recv(&n, rc), c3 = shim_close_listen(&n, lc);
  check(1, "closeSend, closeRecv, closeListen returned (rc %d, %d, %d)", c1, c2, c3);
  double took = now_s() - t0;
  check(took < 2.0, "each call returned at once (%.3f s for all)", took);
out:
  free(sbuf);
  free(rbuf);
  shim_close(&n);
}

// ---------------------------------------------------------------- stale

// Handles NCCL gave back, used again: each call must fail with a WARN, never act on a handle
// made since at the same address, never wait for a request that cannot complete.
static void sc_stale(int version) {
  set_prefix(version, "stale", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  enum { SIZE = 4096 };
  uint8_t* buf = malloc(2 * SIZE);
  void *lc, *sc, *rc;
  tsn_result_t r;
  // 1. A deregistered region, then a new one: the old handle is refused, the new one works.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void *m1 = NULL, *m2 = NULL, *rm = NULL;
    r = shim_reg_mr(&n, sc, buf, SIZE, TSN_PTR_HOST, &m1);
    tsn_result_t d = m1 ? shim_dereg_mr(&n, sc, m1) : -1;
    tsn_result_t r2 = shim_reg_mr(&n, sc, buf, SIZE, TSN_PTR_HOST, &m2);
    check(r == 0 && d == 0 && r2 == 0, "regMr, deregMr, regMr again (rc %d, %d, %d)", r, d, r2);
    r = shim_dereg_mr(&n, sc, m1);
    check(r != TSN_SUCCESS, "deregMr of the first region again fails (rc %d)", r);
    shim_reg_mr(&n, rc, buf + SIZE, SIZE, TSN_PTR_HOST, &rm);
    void *rreq = NULL, *sreq = NULL;
    recv_one(&n, rc, buf + SIZE, SIZE, 1, rm, &rreq);
    send_one(&n, sc, buf, 64, 1, m2, &sreq);
    int ss = -1, rs = -1;
    tsn_result_t a = sreq ? wait_req(&n, sreq, &ss, g_timeout) : -1, b = rreq ? wait_req(&n, rreq, &rs, g_timeout) : -1;
    check(a == 0 && b == 0 && rs == 64, "the second region still carries a message (rc %d, %d, %d bytes)", a, b, rs);
    if (m2) shim_dereg_mr(&n, sc, m2);
    if (rm) shim_dereg_mr(&n, rc, rm);
    pair_close(&n, lc, sc, rc, 1);
    r = shim_close_listen(&n, lc);
    check(r != TSN_SUCCESS, "closeListen of the same listener again fails (rc %d)", r);
  }
  // 2. A request of a comm closed 80 comms ago, past the quarantine of the last 64: its memory
  //    still holds a comm (recycled for a newer one, closed too), so test() fails with a WARN.
  //    Under AddressSanitizer it read freed memory before.
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void *rm = NULL, *rreq = NULL;
    shim_reg_mr(&n, rc, buf, SIZE, TSN_PTR_HOST, &rm);
    r = recv_one(&n, rc, buf, SIZE, 3, rm, &rreq);
    check(r == TSN_SUCCESS && rreq, "a receive in flight on a pair about to close (rc %d)", r);
    pair_close(&n, lc, sc, rc, 1);
    int churned = 0;
    for (; churned < 40; churned++) {
      void *l2, *s2, *r2;
      if (pair_open(&n, ctx, &l2, &s2, &r2) != 0) break;
      pair_close(&n, l2, s2, r2, 1);
    }
    int done = 0, size = -1;
    r = rreq ? shim_test(&n, rreq, &done, &size) : TSN_SUCCESS;
    check(churned == 40 && r != TSN_SUCCESS && !done, "test() of a request of a comm closed %d comms ago fails (rc %d, done %d)", 2 * churned,
          r, done);
  }
  if (!shim_has_ctx(version)) {
    note("skip: contexts and finalize exist from v11");
    free(buf);
    shim_close(&n);
    return;
  }
  // 3. finalize with a pair still open and a receive in flight: its handles die with it.
  void* c1 = NULL;
  if (shim_init(&n, &c1, COMM_ID + 3, logger) == TSN_SUCCESS && pair_open(&n, c1, &lc, &sc, &rc) == 0) {
    void *rm = NULL, *rreq = NULL;
    shim_reg_mr(&n, rc, buf, SIZE, TSN_PTR_HOST, &rm);
    r = recv_one(&n, rc, buf, SIZE, 2, rm, &rreq);
    check(r == TSN_SUCCESS && rreq, "a receive in flight (rc %d)", r);
    r = shim_finalize(&n, c1);
    check(r == TSN_SUCCESS, "finalize with a pair still open (rc %d)", r);
    double t0 = now_s();
    int done = 0, size = -1;
    r = rreq ? shim_test(&n, rreq, &done, &size) : -1;
    check(r != TSN_SUCCESS, "test() of the receive posted before finalize fails (rc %d, done %d)", r, done);
    void* req = NULL;
    r = shim_isend(&n, sc, buf, 8, 2, NULL, &req);
    check(r != TSN_SUCCESS && !req, "isend on the finalized context's comm fails (rc %d)", r);
    tsn_result_t x = shim_close_send(&n, sc), y = shim_close_recv(&n, rc), z = shim_close_listen(&n, lc);
    check(x != 0 && y != 0 && z != 0, "its closes fail (rc %d, %d, %d)", x, y, z);
    check(now_s() - t0 < 2.0, "each returned at once (%.3f s)", now_s() - t0);
  }
  // 4. finalize(NULL), as NCCL calls it after an init that failed: nothing to do, no WARN.
  {
    int warns = atomic_load(&g_warn_count);
    r = shim_finalize(&n, NULL);
    check(r == TSN_SUCCESS && atomic_load(&g_warn_count) == warns, "finalize(NULL), as after a failed init, succeeds without a WARN (rc %d, %d WARN)", r,
          atomic_load(&g_warn_count) - warns);
  }
  // 5. A finalized context, then a new one: finalize of the old one is refused, the new one works.
  void* c2 = NULL;
  r = shim_init(&n, &c2, COMM_ID + 4, logger);
  tsn_result_t again = shim_finalize(&n, c1);
  check(r == TSN_SUCCESS && again != TSN_SUCCESS, "finalize of a finalized context fails (rc %d), after a new init (rc %d)", again, r);
  if (c2 && pair_open(&n, c2, &lc, &sc, &rc) == 0) {
    pair_close(&n, lc, sc, rc, 1);
    check(1, "the new context still connects");
  }
  if (c2) check(shim_finalize(&n, c2) == TSN_SUCCESS, "finalize of the new context");
  free(buf);
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- exitbusy

// A process that exits while the plugin is busy with control work: a thread of the
// application connects and closes pairs in a loop, and main calls exit() after a while. exit()
// runs the exit handlers (OpenSSL's cleanup, libnode's static destructors) while tsnet's
// threads may still be inside JavaScript; before tsnet stopped its threads first (embed/host.cc),
// about one exit in seven faulted over TCP. Each attempt is a child process of its own that
// must end with status 0 and no signal, within the time limit; in every other one a call made
// from an exit handler that runs after tsnet's must fail at once.
static Net g_eb_net;
static void* g_eb_ctx;

static void* eb_loop(void* arg) {
  (void)arg;
  for (;;) {
    void *lc, *sc, *rc;
    uint8_t handle[TSN_HANDLE_SIZE];
    lc = sc = rc = NULL;
    if (shim_listen(&g_eb_net, g_eb_ctx, g_dev, handle, &lc) != TSN_SUCCESS) continue;
    for (int k = 0; k < 100000 && (!sc || !rc); k++) {
      if (!sc) shim_connect(&g_eb_net, g_eb_ctx, g_dev, handle, &sc);
      if (!rc) shim_accept(&g_eb_net, lc, &rc);
    }
    if (sc) shim_close_send(&g_eb_net, sc);
    if (rc) shim_close_recv(&g_eb_net, rc);
    shim_close_listen(&g_eb_net, lc);
  }
  return NULL;
}

// Registered before init, so it runs after tsnet's exit handler, as a library's static
// destructor that calls the plugin would: the call must fail at once (tsnet's threads have
// stopped), not wait for good. Ends the process: 0 when it failed, 6 when it succeeded.
static void eb_late(void) {
  int n = 0;
  tsn_result_t r = shim_devices(&g_eb_net, &n);
  _exit(r == TSN_SUCCESS ? 6 : 0);
}

static void sc_exitbusy(int version) {
  set_prefix(version, "exitbusy", NULL);
  enum { ATTEMPTS = 12 };
  int clean = 0;
  for (int i = 0; i < ATTEMPTS; i++) {
    int delay_ms = 20 + (i * 53) % 300;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      char err[256];
      if (i % 2) atexit(eb_late);
      if (shim_open(&g_eb_net, g_lib, version, err, sizeof err) != 0) _exit(3);
      if (shim_init(&g_eb_net, &g_eb_ctx, COMM_ID, logger) != TSN_SUCCESS) _exit(4);
      pthread_t t;
      if (pthread_create(&t, NULL, eb_loop, NULL) != 0) _exit(5);
      usleep((useconds_t)delay_ms * 1000);
      exit(0);  // with the loop running: every exit handler runs
    }
    if (!check(pid > 0, "fork (%s)", pid < 0 ? strerror(errno) : "a child")) return;
    int status = 0;
    if (wait_until(pid, &status, now_s() + g_timeout) == 0) {
      check(0, "attempt %d (exit after %d ms): the process did not end within %.0f s", i, delay_ms, g_timeout);
    } else if (WIFSIGNALED(status)) {
      check(0, "attempt %d (exit after %d ms): the process died of signal %d during exit", i, delay_ms, WTERMSIG(status));
    } else if (WEXITSTATUS(status) != 0) {
      check(0, "attempt %d (exit after %d ms): the process exited with %d", i, delay_ms, WEXITSTATUS(status));
    } else {
      clean++;
    }
    shim_shm_regions((int)pid, 1, NULL, NULL);  // what its endpoints left (it exits without finalize)
  }
  check(clean == ATTEMPTS, "%d of %d processes that exited with a connect loop running ended cleanly", clean, ATTEMPTS);
}

// ---------------------------------------------------------------- killpeer

// A stream of 64 MiB messages, KP_DEPTH in flight each way, between a receiver process and a
// sender process; once the receiver has taken KP_RUNNING messages the coordinator SIGKILLs one
// of them. The survivor keeps its stream going (as NCCL's proxy would) until test() or a post
// returns an error: that must happen within KP_BUDGET seconds of the kill, and then every
// pending request must end; its comm must close, and the process must still work afterwards.
#define KP_SIZE ((size_t)64 << 20)
#define KP_DEPTH 3
#define KP_RUNNING 2
#define KP_BUDGET 10.0

// Blocking read of exactly len bytes with a deadline; 1 on success.
static int read_full(int fd, void* p, size_t len, double end) {
  size_t have = 0;
  while (have < len) {
    int left = (int)((end - now_s()) * 1000);
    if (left <= 0) return 0;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, left) <= 0) continue;
    ssize_t k = read(fd, (uint8_t*)p + have, len - have);
    if (k == 0) return 0;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return 0;
    }
    have += (size_t)k;
  }
  return 1;
}

// One side of killpeer in its own process. hfd: the handle (the receiver writes, the sender
// reads); upfd: the receiver tells the coordinator "P" once the stream runs; downfd: the
// coordinator's "K" (the peer is being killed), -1 for the victim.
static void __attribute__((noreturn)) kp_side(int version, int sender, int hfd, int upfd, int downfd, int resfd) {
  g_pass = g_fail = 0;
  const char* peer = sender ? "receiver" : "sender";
  set_prefix(version, "killpeer", sender ? "send" : "recv");
  Net n;
  void *ctx = NULL, *lc = NULL, *comm = NULL, *mh = NULL;
  uint8_t* buf = NULL;
  tsn_result_t rc = TSN_SUCCESS;
  if (open_net(&n, version)) goto report;
  if (init_ctx(&n, &ctx, COMM_ID)) goto unload;
  double end = now_s() + g_timeout;
  uint8_t h[TSN_HANDLE_SIZE];
  memset(h, 0, sizeof h);
  if (!sender) {
    rc = shim_listen(&n, ctx, g_dev, h, &lc);
    if (!check(rc == TSN_SUCCESS && lc, "listen (rc %d)", rc)) goto fini;
    ssize_t w = write(hfd, h, sizeof h);
    (void)w;
    while (!comm && now_s() < end && (rc = shim_accept(&n, lc, &comm)) == TSN_SUCCESS) {
    }
    if (!check(comm != NULL, "accept gave a comm (rc %d)", rc)) goto fini;
  } else {
    if (!check(read_full(hfd, h, sizeof h, end), "got the receiver's handle")) goto fini;
    while (!comm && now_s() < end && (rc = shim_connect(&n, ctx, g_dev, h, &comm)) == TSN_SUCCESS) {
    }
    if (!check(comm != NULL, "connect gave a comm (rc %d)", rc)) goto fini;
  }
  size_t cap = sender ? KP_SIZE : KP_DEPTH * KP_SIZE;
  buf = malloc(cap);
  if (!check(buf != NULL, "%zu bytes of buffers", cap)) goto fini;
  if (sender) fill(buf, KP_SIZE, seed_of(KP_SIZE, 0, 9));
  else memset(buf, GUARD, cap);
  rc = shim_reg_mr(&n, comm, buf, cap, TSN_PTR_HOST, &mh);
  if (!check(rc == TSN_SUCCESS && mh, "regMr of %zu bytes (rc %d)", cap, rc)) goto fini;

  void* req[KP_DEPTH] = {0};
  int completed = 0, early_errors = 0, errors = 0, pending = 0, validated = 0, reported = 0;
  double killed_at = 0, first_err = 0, stream_end = now_s() + 3 * g_timeout;
  for (;;) {
    char k;
    if (!killed_at && downfd >= 0 && read(downfd, &k, 1) == 1) killed_at = now_s();
    double t = now_s();
    if (killed_at && t > killed_at + KP_BUDGET) break;
    if (!killed_at && t > stream_end) {
      check(0, "no word of the %s's kill within %.0f s of streaming", peer, 3 * g_timeout);
      break;
    }
    pending = 0;
    for (int i = 0; i < KP_DEPTH; i++) {
      if (!req[i] && !errors) {
        if (sender) {
          rc = shim_isend(&n, comm, buf, KP_SIZE, 0, mh, &req[i]);
        } else {
          void* d = buf + (size_t)i * KP_SIZE;
          size_t room = KP_SIZE;
          int tag = 0;
          rc = shim_irecv(&n, comm, 1, &d, &room, &tag, &mh, &req[i]);
        }
        if (rc != TSN_SUCCESS) {
          note("%s returned %d", sender ? "isend" : "irecv", rc);
          errors++;
          if (!killed_at) early_errors++;
          if (!first_err) first_err = now_s();
          req[i] = NULL;
        }
      }
      if (!req[i]) continue;
      int done = 0, sz = -1;
      rc = shim_test(&n, req[i], &done, &sz);
      if (rc != TSN_SUCCESS) {
        errors++;
        if (!killed_at) early_errors++;
        if (!first_err) first_err = now_s();
        req[i] = NULL;
        continue;
      }
      if (!done) {
        pending++;
        continue;
      }
      req[i] = NULL;
      completed++;
      if (!sender && !validated) {
        validated = 1;
        long bad = mismatch(buf + (size_t)i * KP_SIZE, KP_SIZE, seed_of(KP_SIZE, 0, 9));
        check(sz == (int)KP_SIZE && bad < 0, "the first 64 MiB message: size %d, data equal (first difference %ld)", sz, bad);
      }
    }
    if (!sender && !reported && completed >= KP_RUNNING) {
      reported = 1;
      if (upfd >= 0) {
        ssize_t w = write(upfd, "P", 1);
        (void)w;
      }
    }
    // An error with no word of the kill yet: the word may be on its way (it is written just
    // before the kill); wait a moment for it before calling the error early.
    if (errors && !killed_at && downfd >= 0 && read_full(downfd, &k, 1, now_s() + 1.0)) {
      killed_at = now_s();
      early_errors = 0;
    }
    if (killed_at && errors && pending == 0) break;
    if (errors && !killed_at && pending == 0) {
      check(0, "the stream broke before the %s was killed (%d messages completed)", peer, completed);
      break;
    }
  }
  if (killed_at) {
    double after = first_err > killed_at ? first_err - killed_at : 0;
    check(early_errors == 0, "the stream ran: no error before the %s was killed", peer);
    check(pending == 0, "after the %s's SIGKILL every pending request ended within %.0f s (%d still pending)", peer,
          KP_BUDGET, pending);
    check(errors > 0, "after the %s's SIGKILL test() returned an error (%d errors, the first %.2f s after the kill; %d "
                      "messages completed in all)", peer, errors, after, completed);
  }
  if (pending == 0) {
    rc = shim_dereg_mr(&n, comm, mh);
    note("deregMr on the broken comm returned %d", rc);
  }
  rc = sender ? shim_close_send(&n, comm) : shim_close_recv(&n, comm);
  check(1, "%s of the broken comm returned (rc %d)", sender ? "closeSend" : "closeRecv", rc);
  comm = NULL;
  if (lc) {
    rc = shim_close_listen(&n, lc);
    check(rc == TSN_SUCCESS, "closeListen (rc %d)", rc);
    lc = NULL;
  }
  {  // Still healthy: a new listener.
    void* l2 = NULL;
    rc = shim_listen(&n, ctx, g_dev, h, &l2);
    tsn_result_t c2 = l2 ? shim_close_listen(&n, l2) : -1;
    check(rc == TSN_SUCCESS && c2 == TSN_SUCCESS, "the process still works: listen, closeListen (rc %d, %d)", rc, c2);
  }
fini:
  set_prefix(version, "killpeer", sender ? "send" : "recv");
  if (comm && sender) shim_close_send(&n, comm);
  else if (comm) shim_close_recv(&n, comm);
  if (lc) shim_close_listen(&n, lc);
  fini_ctx(&n, ctx);
unload:
  shim_close(&n);
report:
  free(buf);
  {
    int counts[2] = {g_pass, g_fail};
    ssize_t w = write(resfd, counts, sizeof counts);
    (void)w;
  }
  fflush(stdout);
  _exit(g_fail ? 1 : 0);
}

// Forks the two sides, waits for the stream, kills one side (victim_sender: the sender).
static void kp_run(int version, int victim_sender) {
  set_prefix(version, "killpeer", NULL);
  const char* vname = victim_sender ? "sender" : "receiver";
  const char* sname = victim_sender ? "receiver" : "sender";
  int hp[2], up[2], dn[2], rres[2], sres[2];
  if (pipe(hp) || pipe(up) || pipe(dn) || pipe(rres) || pipe(sres)) {
    check(0, "pipe: %s", strerror(errno));
    return;
  }
  fcntl(dn[0], F_SETFL, O_NONBLOCK);
  fflush(stdout);
  fflush(stderr);
  pid_t rpid = fork();
  if (rpid == 0) {
    close(hp[0]), close(up[0]), close(dn[1]), close(rres[0]), close(sres[0]), close(sres[1]);
    kp_side(version, 0, hp[1], up[1], victim_sender ? dn[0] : -1, rres[1]);
  }
  pid_t spid = rpid > 0 ? fork() : -1;
  if (spid == 0) {
    close(hp[1]), close(up[0]), close(up[1]), close(dn[1]), close(rres[0]), close(rres[1]), close(sres[0]);
    kp_side(version, 1, hp[0], -1, victim_sender ? -1 : dn[0], sres[1]);
  }
  close(hp[0]), close(hp[1]), close(up[1]), close(dn[0]), close(rres[1]), close(sres[1]);
  if (rpid < 0 || spid < 0) {
    check(0, "fork: %s", strerror(errno));
    if (rpid > 0) kill(rpid, SIGKILL), waitpid(rpid, NULL, 0);
    close(up[0]), close(dn[1]), close(rres[0]), close(sres[0]);
    return;
  }
  char p = 0;
  int running = read_full(up[0], &p, 1, now_s() + 3 * g_timeout) && p == 'P';
  pid_t victim = victim_sender ? spid : rpid, survivor = victim_sender ? rpid : spid;
  int vres = victim_sender ? sres[0] : rres[0], sres_fd = victim_sender ? rres[0] : sres[0];
  if (!check(running, "the receiver reported %d messages of 64 MiB received (the stream runs)", KP_RUNNING)) {
    kill(rpid, SIGKILL), kill(spid, SIGKILL);
    waitpid(rpid, NULL, 0), waitpid(spid, NULL, 0);
    forget_shm(rpid), forget_shm(spid);
  } else {
    ssize_t w = write(dn[1], "K", 1);  // first the word, then the kill: the survivor's clock starts now
    (void)w;
    kill(victim, SIGKILL);
    int status = 0;
    waitpid(victim, &status, 0);
    forget_shm(victim);
    check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "the %s was killed with SIGKILL mid-stream (%s %d)", vname,
          WIFSIGNALED(status) ? "signal" : "exit status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    reap_role(survivor, sres_fd, sname, now_s() + KP_BUDGET + 2 * g_timeout);
    sres_fd = -1;
  }
  close(up[0]), close(dn[1]), close(vres);
  if (sres_fd >= 0) close(sres_fd);
}

static void sc_killpeer(int version) {
  set_prefix(version, "killpeer", NULL);
  if (is_loopback()) {
    note("skip: the loopback transport has no peer process to kill");
    return;
  }
  kp_run(version, 1);
  kp_run(version, 0);
}

// ---------------------------------------------------------------- stranger

// Raw TCP clients on a listener's port (the address and port from the handle: u32 magic,
// u16 version, u8 rails, u8 0, 8-byte nonce, then per rail u8 family, u8 0, u16 port LE,
// 16-byte address) never become comms nor break the listener.
#define TCP_HANDLE_MAGIC 0x544e5354u
#define TCP_HELLO_MAGIC 0x484e5354u
#define TCP_HELLO_BYTES 48
#define TCP_PROTOCOL_VERSION 2

static uint32_t rd32(const uint8_t* p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void wr32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// A blocking TCP connection to rail 0 of the handle; -1 on failure.
static int raw_connect(const uint8_t* h) {
  int fam = h[16];
  unsigned port = (unsigned)h[18] | (unsigned)h[19] << 8;
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  if (fam == 4) {
    struct sockaddr_in* a = (struct sockaddr_in*)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    memcpy(&a->sin_addr, h + 20, 4);
    len = sizeof *a;
  } else {
    struct sockaddr_in6* a = (struct sockaddr_in6*)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    memcpy(&a->sin6_addr, h + 20, 16);
    len = sizeof *a;
  }
  int fd = socket(fam == 4 ? AF_INET : AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr*)&ss, len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// 1 once the other end has closed fd (EOF or a reset), 0 if it is still open at the deadline.
static int closed_by_peer(int fd, double end) {
  uint8_t junk[4096];
  for (;;) {
    int left = (int)((end - now_s()) * 1000);
    if (left <= 0) return 0;
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, left) <= 0) continue;
    ssize_t k = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
    if (k == 0) return 1;
    if (k < 0 && errno != EAGAIN && errno != EINTR) return 1;
  }
}

// A HELLO as tsnet's TCP transport writes it (plugin/transports/tcp/wire.ts): u32 magic, u16
// protocol version, u8 role, u8 lane, 8-byte nonce, 8-byte connection id, u32 data lanes, u32
// eagerMax, u32 minStripe, u32 status, u8 x3 policy ids, then zeros to TCP_HELLO_BYTES. A
// greeting of another size or version is refused only when the listener's greeting timeout runs
// out, so the scenario checks that the complete ones are refused well before it.
static void hello_bytes(uint8_t* b, int role, const uint8_t* nonce, uint32_t lanes) {
  memset(b, 0, TCP_HELLO_BYTES);
  wr32(b, TCP_HELLO_MAGIC);
  b[4] = TCP_PROTOCOL_VERSION;  // u16 LE
  b[6] = (uint8_t)role;
  memcpy(b + 8, nonce, 8);
  for (int i = 0; i < 8; i++) b[16 + i] = (uint8_t)(0xC0 + i);  // connection id
  wr32(b + 24, lanes);
  wr32(b + 28, 16384);
  wr32(b + 32, 131072);
}

static void sc_stranger(int version) {
  set_prefix(version, "stranger", NULL);
  if (is_loopback() || is_ofi()) {
    note("skip: the %s transport has no TCP port for a stranger", is_ofi() ? "libfabric" : "loopback");
    return;
  }
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  uint8_t h[TSN_HANDLE_SIZE];
  memset(h, 0, sizeof h);
  void* lc = NULL;
  tsn_result_t rc = shim_listen(&n, ctx, g_dev, h, &lc);
  if (!check(rc == TSN_SUCCESS && lc, "listen (rc %d)", rc)) goto out;
  unsigned port = (unsigned)h[18] | (unsigned)h[19] << 8;
  if (!check(rd32(h) == TCP_HANDLE_MAGIC && h[6] >= 1 && (h[16] == 4 || h[16] == 6) && port,
             "the handle is a TCP handle (magic 0x%x, %d rails, rail 0: family %d, port %u)", rd32(h), h[6], h[16], port))
    goto closel;
  {
    enum { GARBAGE, SILENT_CLOSE, ZEROS, WRONG_NONCE, FLOOD, IDLE, HALF, ACK_ROLE, NS };
    static const char* what[NS] = {"sent 64 bytes of garbage",
                                   "connected and closed without a byte",
                                   "sent a greeting's length of zeros",
                                   "sent a well-formed HELLO with a wrong nonce",
                                   "sent 256 KiB of garbage",
                                   "connected and said nothing (kept open)",
                                   "sent a control HELLO with the right nonce, then no data sockets (kept open)",
                                   "sent an ACK HELLO with the right nonce"};
    static const int must_drop[NS] = {1, 0, 1, 1, 1, 0, 0, 1};
    int fd[NS];
    uint8_t msg[TCP_HELLO_BYTES], wrong[8];
    static uint8_t flood[256 << 10];
    fill(flood, sizeof flood, 4242);
    for (int i = 0; i < 8; i++) wrong[i] = (uint8_t)(h[8 + i] ^ 0x5a);
    int connected = 0;
    for (int i = 0; i < NS; i++) {
      fd[i] = raw_connect(h);
      if (fd[i] < 0) continue;
      connected++;
      ssize_t w = 0;
      switch (i) {
        case GARBAGE: w = send(fd[i], flood, 64, MSG_NOSIGNAL); break;
        case SILENT_CLOSE: close(fd[i]), fd[i] = -1; break;
        case ZEROS: memset(msg, 0, sizeof msg), w = send(fd[i], msg, sizeof msg, MSG_NOSIGNAL); break;
        case WRONG_NONCE: hello_bytes(msg, 1, wrong, 4), w = send(fd[i], msg, sizeof msg, MSG_NOSIGNAL); break;
        case FLOOD: w = send(fd[i], flood, sizeof flood, MSG_NOSIGNAL | MSG_DONTWAIT); break;
        case HALF: hello_bytes(msg, 1, h + 8, 4), w = send(fd[i], msg, sizeof msg, MSG_NOSIGNAL); break;
        case ACK_ROLE: hello_bytes(msg, 3, h + 8, 4), w = send(fd[i], msg, sizeof msg, MSG_NOSIGNAL); break;
        default: break;
      }
      (void)w;
    }
    double sent = now_s();
    check(connected == NS, "%d of %d strangers connected to port %u", connected, NS, port);
    // accept keeps answering "not yet" (success, no comm) while they are there.
    int comms = 0, errs = 0, calls = 0;
    double end = now_s() + 1.0;
    while (now_s() < end) {
      void* rcomm = NULL;
      rc = shim_accept(&n, lc, &rcomm);
      calls++;
      if (rc != TSN_SUCCESS) errs++;
      if (rcomm) comms++, shim_close_recv(&n, rcomm);
      usleep(1000);
    }
    check(comms == 0 && errs == 0, "accept over 1 s (%d calls) with strangers on the port: %d comms, %d errors", calls,
          comms, errs);
    // Each of these is refused for what it sent, not by the listener's greeting timeout
    // (TSNET_TIMEOUT_SEC, 10 s by default), which would close them all about as late.
    double greeting = timeout_sec();
    end = now_s() + g_timeout;
    for (int i = 0; i < NS; i++)
      if (must_drop[i] && fd[i] >= 0) {
        int closed = closed_by_peer(fd[i], end);
        double after = now_s() - sent;
        check(closed && after < 0.8 * greeting, "the listener closed the stranger that %s (%s after %.2f s; greeting timeout %.0f s)",
              what[i], closed ? "closed" : "still open", after, greeting);
      }
    // Now a real connection on the same listener, with the idle and half strangers still open.
    void *sc = NULL, *rcm = NULL;
    end = now_s() + g_timeout;
    while ((!sc || !rcm) && now_s() < end) {
      if (!sc && (rc = shim_connect(&n, ctx, g_dev, h, &sc)) != TSN_SUCCESS) break;
      if (!rcm && (rc = shim_accept(&n, lc, &rcm)) != TSN_SUCCESS) break;
    }
    if (check(sc && rcm, "after the strangers, connect and accept on the same listener give a comm pair (rc %d)", rc)) {
      enum { CAP = (1 << 20) + 3 + 4096 };
      static const size_t sizes[] = {1, 65537, (1 << 20) + 3};
      uint8_t* sb = malloc(CAP);
      uint8_t* rb = malloc(CAP);
      void *smh = NULL, *rmh = NULL;
      tsn_result_t a = shim_reg_mr(&n, sc, sb, CAP, TSN_PTR_HOST, &smh);
      tsn_result_t b = shim_reg_mr(&n, rcm, rb, CAP, TSN_PTR_HOST, &rmh);
      if (check(a == TSN_SUCCESS && b == TSN_SUCCESS, "regMr on both comms (rc %d, %d)", a, b)) {
        for (int i = 0; i < 3; i++) {
          size_t size = sizes[i];
          fill(sb, size, seed_of(size, i, 5));
          memset(rb, GUARD, CAP);
          void *sreq = NULL, *rreq = NULL;
          void* d = rb;
          size_t room = CAP;
          int tag = 1, ssz = -1, rsz = -1;
          double e2 = now_s() + g_timeout;
          while (!rreq && now_s() < e2 && (a = shim_irecv(&n, rcm, 1, &d, &room, &tag, &rmh, &rreq)) == TSN_SUCCESS) {
          }
          while (!sreq && now_s() < e2 && (b = shim_isend(&n, sc, sb, size, 1, smh, &sreq)) == TSN_SUCCESS) {
          }
          int sdone = 0, rdone = 0;
          tsn_result_t st = 0, rt = 0;
          while (sreq && rreq && (!sdone || !rdone) && now_s() < e2) {
            if (!sdone && ((st = shim_test(&n, sreq, &sdone, &ssz)) != TSN_SUCCESS)) break;
            if (!rdone && ((rt = shim_test(&n, rreq, &rdone, &rsz)) != TSN_SUCCESS)) break;
          }
          long bad = mismatch(rb, size, seed_of(size, i, 5));
          long g = guard_broken(rb, size, CAP);
          check(sdone && rdone && st == 0 && rt == 0 && rsz == (int)size && bad < 0 && g < 0,
                "transfer of %zu bytes after the strangers (send %s rc %d, recv %s rc %d size %d, first difference %ld, "
                "guard %ld)",
                size, sdone ? "done" : "not done", st, rdone ? "done" : "not done", rt, rsz, bad, g);
        }
        a = shim_dereg_mr(&n, sc, smh);
        b = shim_dereg_mr(&n, rcm, rmh);
        check(a == TSN_SUCCESS && b == TSN_SUCCESS, "deregMr (rc %d, %d)", a, b);
      }
      free(sb);
      free(rb);
    }
    tsn_result_t a = sc ? shim_close_send(&n, sc) : 0, b = rcm ? shim_close_recv(&n, rcm) : 0;
    check(a == TSN_SUCCESS && b == TSN_SUCCESS, "closeSend, closeRecv (rc %d, %d)", a, b);
    for (int i = 0; i < NS; i++)
      if (fd[i] >= 0) close(fd[i]);
  }
closel:
  rc = shim_close_listen(&n, lc);
  check(rc == TSN_SUCCESS, "closeListen with strangers having come and gone (rc %d)", rc);
out:
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- main

static void sc_transfer(int v) { run_pair(v, &TRANSFER, g_procs == 1 && g_role == ROLE_BOTH ? P_TRANSFER : P_BIG); }
static void sc_marker(int v) { run_pair(v, &MARKER, P_MARKER); }
static void sc_bulk(int v) { run_pair(v, &BULK, P_BULK); }
static void sc_gpu(int v) { run_pair(v, &GPU, 0); }
static void sc_inflight(int v) {
  run_pair(v, &INFLIGHT_SC, 8);
  run_pair(v, &INFLIGHT_SC, INFLIGHT);
}
static void sc_pushback(int v) {
  if (g_procs == 1 && g_role == ROLE_BOTH) {  // pattern a posts irecv(n=8)
    Net n;
    void* ctx;
    int mr = 0;
    set_prefix(v, "pushback", NULL);
    if (open_net(&n, v)) return;
    if (init_ctx(&n, &ctx, COMM_ID) == 0) {
      mr = max_recvs(&n);
      fini_ctx(&n, ctx);
    }
    shim_close(&n);
    if (mr < TSN_MAX_RECVS) {
      note("skip: the device's maxRecvs is %d, pattern a needs %d", mr, TSN_MAX_RECVS);
      return;
    }
  }
  run_pair(v, &PUSHBACK, 0);
}
static void sc_teardown(int v) {
  run_pair(v, &TEARDOWN, TD_BY_RECV);
  run_pair(v, &TEARDOWN, TD_BY_SEND);
}
static void sc_grouped(int v) {
  int want[] = {8, 4};
  int mr = 0;
  if (g_procs == 1 && g_role == ROLE_BOTH) {
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

// ---------------------------------------------------------------- peerclose

// The receiver closes its comm while 3 sends of 16 MiB wait for receives it never posts: the
// sends still pending then must all end in an error, and well before TSNET_TIMEOUT_SEC where
// the transport is told (TCP: the connection closes; libfabric: the CLOSE message).
// Over TCP a send completes once its bytes are handed to the sockets, so one may complete
// before the close.
#define PC_SENDS 3
#define PC_SIZE (16 << 20)
enum { PC_POSTED = 1, PC_CLOSED = 2 };

typedef struct PeerCloseState {
  uint8_t* buf;
  void* mh;
  void* req[PC_SENDS];
  int posted, ended, errors, before;  // before: completed before the receiver closed
  double closed_at;  // sender: when the receiver's word came; receiver: 1 once closed
} PeerCloseState;

static int pc_setup(Role* r) {
  PeerCloseState* p = calloc(1, sizeof *p);
  r->st = p;
  r->broken = 1;
  if (!r->sender) return 0;
  if (!(p->buf = role_guarded(r, PC_SIZE, &p->mh))) return -1;
  fill(p->buf, PC_SIZE, 31);
  return 0;
}

static int pc_step(Role* r) {
  PeerCloseState* p = r->st;
  Msg m;
  if (!r->sender) {
    if (!role_take_mark(r, &m)) return 0;
    if (m.arg != PC_POSTED) return check(0, "peerclose: an unexpected word %d from the sender", m.arg), -1;
    usleep(20000);  // the sends are on their way
    tsn_result_t rc = shim_close_recv(r->net, r->comm);
    r->comm = NULL;
    r->nmr = 0;  // closed with the comm
    check(rc == TSN_SUCCESS, "closeRecv with %d sends of the peer waiting for receives (rc %d)", PC_SENDS, rc);
    role_put_mark(r, PC_CLOSED, NULL, 0);
    return 1;
  }
  while (p->posted < PC_SENDS) {
    tsn_result_t rc = shim_isend(r->net, r->comm, p->buf, PC_SIZE, 1 + p->posted, p->mh, &p->req[p->posted]);
    if (rc != TSN_SUCCESS) return check(0, "isend %d of 1 MiB returned %d", p->posted, rc), -1;
    if (!p->req[p->posted]) return 0;  // not now: post again
    if (++p->posted == PC_SENDS) role_put_mark(r, PC_POSTED, NULL, 0);
  }
  if (p->closed_at == 0 && role_take_mark(r, &m)) {
    if (m.arg != PC_CLOSED) return check(0, "peerclose: an unexpected word %d from the receiver", m.arg), -1;
    p->closed_at = now_s();
  }
  for (int i = 0; i < PC_SENDS; i++) {
    if (!p->req[i]) continue;
    int done = 0, size = -1;
    tsn_result_t rc = shim_test(r->net, p->req[i], &done, &size);
    if (rc == TSN_SUCCESS && !done) continue;
    p->req[i] = NULL;
    p->ended++;
    // An error may be seen before the receiver's word that it closed, which follows its close.
    if (rc != TSN_SUCCESS) p->errors++;
    else if (p->closed_at == 0) p->before++, check(size == PC_SIZE, "send %d completed before the receiver closed (size %d): its bytes were handed over", i, size);
    else return check(0, "send %d completed (size %d) after the receiver closed without a receive", i, size), -1;
  }
  if (p->ended < PC_SENDS || p->closed_at == 0) return 0;
  double after = now_s() - p->closed_at, limit = timeout_sec();
  check(p->errors == PC_SENDS - p->before, "the %d sends pending at the receiver's close ended, %d with an error", PC_SENDS - p->before, p->errors);
  if (p->before == PC_SENDS) {
    note("every send completed before the close: nothing was left to be told");
    return 1;
  }
  check(after < 0.6 * limit, "the sends ended %.2f s after the close, before 0.6 of TSNET_TIMEOUT_SEC (%.0f s): the transport told the sender", after, limit);
  return 1;
}

static const PairScenario PEERCLOSE = {"peerclose", {pc_setup, pc_step}, {pc_setup, pc_step}};
static void sc_peerclose(int v) { run_pair(v, &PEERCLOSE, 0); }

// ---------------------------------------------------------------- held

// The last WARN about a held event loop since held_reset(), and how many there were.
static void held_reset(void) {
  pthread_mutex_lock(&g_held_mu);
  g_held_line[0] = 0;
  pthread_mutex_unlock(&g_held_mu);
  atomic_store(&g_held_count, 0);
}
static int held_last(char* out, size_t len) {
  pthread_mutex_lock(&g_held_mu);
  snprintf(out, len, "%s", g_held_line);
  pthread_mutex_unlock(&g_held_mu);
  return atomic_load(&g_held_count);
}

// Stops this whole process for ms (SIGSTOP from a child, then SIGCONT), as when a VM is paused
// or a job preempted; returns when it runs again, or -1 when no child could be made.
static int stop_self(int ms) {
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  if (child == 0) {
    kill(getppid(), SIGSTOP);
    usleep((useconds_t)ms * 1000);
    kill(getppid(), SIGCONT);
    _exit(0);
  }
  if (child < 0) return -1;
  int st = 0;
  waitpid(child, &st, 0);
  return 0;
}

// The protocol thread's event loop held past TSNET_TIMEOUT_SEC (run it with 1 s): first the
// whole process stopped, then a control call whose WARN the application's logger held, then a
// connect begun before a stop. The watchdog's WARN says what the thread did meanwhile; a comm
// whose peer is alive (here: the same process, stopped with it) is not failed for the silence
// that the stop made, and a connect is not failed for the answer the stop delayed.
static void sc_held(int version) {
  set_prefix(version, "held", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  double limit = timeout_sec();
  int hold_ms = (int)(1500 * limit), tick_us = (int)(250000 * limit);
  enum { SIZE = 4096 };
  uint8_t* sbuf = malloc(SIZE);
  uint8_t* rbuf = calloc(1, SIZE);
  char line[1024];
  void *lc, *sc, *rc;
  if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    void *sm = NULL, *rm = NULL, *rreq = NULL, *sreq = NULL;
    shim_reg_mr(&n, sc, sbuf, SIZE, TSN_PTR_HOST, &sm);
    shim_reg_mr(&n, rc, rbuf, SIZE, TSN_PTR_HOST, &rm);
    tsn_result_t r = recv_one(&n, rc, rbuf, SIZE, 5, rm, &rreq);
    check(r == TSN_SUCCESS && rreq, "a receive waits for its message (rc %d)", r);
    usleep(2 * tick_us);  // heartbeats flow before the stop
    held_reset();
    int stopped = stop_self(hold_ms);
    double resumed = now_s();
    usleep(3 * tick_us);  // three watchdog ticks after the stop
    int done = 0, size = -1;
    r = rreq ? shim_test(&n, rreq, &done, &size) : -1;
    check(stopped == 0 && r == TSN_SUCCESS && !done,
          "stopped for %.1f s (TSNET_TIMEOUT_SEC %.0f), the process goes on: the receive still waits, its peer alive (rc %d, done %d)",
          hold_ms / 1000.0, limit, r, done);
    memset(sbuf, 0x5a, SIZE);
    send_one(&n, sc, sbuf, SIZE, 5, sm, &sreq);
    tsn_result_t a = sreq ? wait_req(&n, sreq, NULL, g_timeout) : -1;
    tsn_result_t b = r == TSN_SUCCESS && !done ? wait_req(&n, rreq, &size, g_timeout) : -1;
    check(a == 0 && b == 0 && size == SIZE && rbuf[0] == 0x5a && rbuf[SIZE - 1] == 0x5a,
          "then its message arrives, whole (rc %d, %d, %d bytes, %.2f s after the stop)", a, b, size, now_s() - resumed);
    int count = held_last(line, sizeof line);
    check(count >= 1 && strstr(line, "; meanwhile the thread used ") && strstr(line, " ms of CPU, "),
          "the watchdog said the loop was held, and what the thread did meanwhile (%d WARN): %s", count, line);
    // 2. A control call held: its WARN (a connect with a handle that is not one) is held in the
    //    logger, on the protocol thread, inside the call.
    held_reset();
    uint8_t junk[TSN_HANDLE_SIZE];
    memset(junk, 0xee, sizeof junk);
    g_hold_match = "connect";
    atomic_store(&g_hold_ms, hold_ms);
    void* bad = NULL;
    double t0 = now_s();
    r = shim_connect(&n, ctx, 0, junk, &bad);
    double took = now_s() - t0;
    g_hold_match = NULL;
    usleep(3 * tick_us);
    count = held_last(line, sizeof line);
    check(r != TSN_SUCCESS && !bad && took >= hold_ms / 1000.0 * 0.9, "connect with a handle that is not one fails, its WARN held %.1f s in the logger (rc %d)",
          took, r);
    check(count >= 1 && strstr(line, "it sat in its call connect, "), "the watchdog names the call the thread sat in (%d WARN): %s", count, line);
    // 3. A connect begun, then the process stopped before anything answered it: once it runs
    //    again the connect and the accept complete (before, the deadline that passed during the
    //    stop failed the connect at once: "no answer ... within 1000 ms").
    void *l3 = NULL, *s3 = NULL, *r3 = NULL;
    uint8_t h3[TSN_HANDLE_SIZE];
    memset(h3, 0, sizeof h3);
    r = shim_listen(&n, ctx, g_dev, h3, &l3);
    if (check(r == TSN_SUCCESS && l3, "listen (rc %d)", r)) {
      tsn_result_t a = shim_connect(&n, ctx, g_dev, h3, &s3), b = TSN_SUCCESS;
      stopped = stop_self(hold_ms);
      for (double end = now_s() + g_timeout; (!s3 || !r3) && a == TSN_SUCCESS && b == TSN_SUCCESS && now_s() < end;) {
        if (!s3) a = shim_connect(&n, ctx, g_dev, h3, &s3);
        if (!r3) b = shim_accept(&n, l3, &r3);
      }
      check(stopped == 0 && a == TSN_SUCCESS && b == TSN_SUCCESS && s3 && r3,
            "a connect begun before the process was stopped for %.1f s completes once it runs again (rc %d, %d)", hold_ms / 1000.0, a, b);
      pair_close(&n, l3, s3, r3, 1);
    }
    if (sm) shim_dereg_mr(&n, sc, sm);
    if (rm) shim_dereg_mr(&n, rc, rm);
    pair_close(&n, lc, sc, rc, 1);
  }
  free(sbuf);
  free(rbuf);
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- many

// Many comm pairs of one process open at once (TSNET_TEST_PAIRS, 256 by default): every listen
// first, then connects and accepts in sweeps over all of them, as NCCL's proxy connects a
// communicator's peers; then (TSNET_TEST_REG_MIB) a large region more per comm; then
// (TSNET_TEST_QUIET_MS) a pause; then 3 rounds of one 64 KiB message
// on every pair, all posted before any is tested, each validated; then every close. A job with many peers and channels holds
// hundreds of comms per process; a per-process table, an id space or a queue that fills would
// show here as a failed call, a lost message or a hang.
// This process's resident memory in KiB (VmRSS), -1 when /proc cannot say.
static long resident_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "VmRSS:", 6)) kib = atol(line + 6);
  fclose(f);
  return kib;
}

// One cycle of `many`: P pairs opened, used and closed. Returns 0 when every step passed.
static int many_cycle(Net* np, void* ctx, int P) {
  Net n = *np;
  int failures = g_fail;
  enum { SZ = 64 << 10, ROUNDS = 3 };
  void **lc = calloc((size_t)P, sizeof *lc), **sc = calloc((size_t)P, sizeof *sc), **rc = calloc((size_t)P, sizeof *rc);
  void **smh = calloc((size_t)P, sizeof *smh), **rmh = calloc((size_t)P, sizeof *rmh);
  void **sreq = calloc((size_t)P, sizeof *sreq), **rreq = calloc((size_t)P, sizeof *rreq);
  uint8_t(*handles)[TSN_HANDLE_SIZE] = calloc((size_t)P, TSN_HANDLE_SIZE);
  uint8_t* sbuf = malloc((size_t)P * SZ);
  uint8_t* rbuf = malloc((size_t)P * SZ);
  tsn_result_t r = TSN_SUCCESS;
  int listened = 0, up = 0;
  double t0 = now_s();
  for (; listened < P && (r = shim_listen(&n, ctx, g_dev, handles[listened], &lc[listened])) == TSN_SUCCESS; listened++) {
  }
  if (check(listened == P, "%d listens (rc %d at %d)", P, r, listened)) {
    double end = now_s() + g_timeout;
    while (up < P && r == TSN_SUCCESS && now_s() < end) {
      up = 0;
      for (int i = 0; i < P && r == TSN_SUCCESS; i++) {
        if (!sc[i] && (r = shim_connect(&n, ctx, g_dev, handles[i], &sc[i])) != TSN_SUCCESS) check(0, "connect of pair %d (rc %d)", i, r);
        if (r == TSN_SUCCESS && !rc[i] && (r = shim_accept(&n, lc[i], &rc[i])) != TSN_SUCCESS) check(0, "accept of pair %d (rc %d)", i, r);
        up += sc[i] && rc[i];
      }
    }
    check(up == P, "%d of %d pairs connected and accepted in %.2f s", up, P, now_s() - t0);
  }
  int regs = 0;
  for (int i = 0; i < up && up == P; i++) {
    for (size_t k = 0; k < SZ; k++) sbuf[(size_t)i * SZ + k] = (uint8_t)(i * 7 + k);
    if (shim_reg_mr(&n, sc[i], sbuf + (size_t)i * SZ, SZ, TSN_PTR_HOST, &smh[i]) == TSN_SUCCESS &&
        shim_reg_mr(&n, rc[i], rbuf + (size_t)i * SZ, SZ, TSN_PTR_HOST, &rmh[i]) == TSN_SUCCESS)
      regs++;
  }
  if (up == P) check(regs == P, "regMr on both sides of %d pairs (%d)", P, regs);
  // TSNET_TEST_REG_MIB: each comm also registers a region of that many MiB that nothing reads or
  // writes (mapped, never touched, so it costs no resident memory), as NCCL registers per
  // connection buffers of which small messages touch a few pages; the sweep is timed.
  const char* rmib = getenv("TSNET_TEST_REG_MIB");
  size_t big = rmib && atoi(rmib) > 0 ? (size_t)atoi(rmib) << 20 : 0;
  void** bigmh = big ? calloc((size_t)2 * P, sizeof *bigmh) : NULL;
  uint8_t* bigmem = NULL;
  if (big && regs == P) {
    bigmem = mmap(NULL, big * 2 * (size_t)P, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (check(bigmem != MAP_FAILED, "map %zu MiB for the large regions", (big >> 20) * 2 * (size_t)P)) {
      double t = now_s();
      int bigs = 0;
      for (int i = 0; i < 2 * P; i++)
        bigs += shim_reg_mr(&n, i < P ? sc[i] : rc[i - P], bigmem + (size_t)i * big, big, TSN_PTR_HOST, &bigmh[i]) == TSN_SUCCESS;
      check(bigs == 2 * P, "regMr of %d regions of %zu MiB in %.3f s (%d)", 2 * P, big >> 20, now_s() - t, bigs);
    } else {
      bigmem = NULL;
    }
  }
  // TSNET_TEST_QUIET_MS: every comm quiet that long first, so that each sends its heartbeats,
  // all at the same ticks: a burst of as many messages as there are comms into one endpoint.
  const char* quiet = getenv("TSNET_TEST_QUIET_MS");
  if (quiet && atoi(quiet) > 0 && regs == P) {
    note("every comm quiet for %d ms", atoi(quiet));
    usleep((useconds_t)atoi(quiet) * 1000);
  }
  for (int round = 0; round < ROUNDS && regs == P; round++) {
    double t = now_s(), end = t + g_timeout;
    memset(rbuf, 0, (size_t)P * SZ);
    int posted = 0, wrong = 0, failed = 0, left = 0;
    for (int i = 0; i < P; i++) posted += recv_one(&n, rc[i], rbuf + (size_t)i * SZ, SZ, 1, rmh[i], &rreq[i]) == TSN_SUCCESS && rreq[i];
    for (int i = 0; i < P; i++) {
      send_one(&n, sc[i], sbuf + (size_t)i * SZ, SZ, 1, smh[i], &sreq[i]);
      posted += sreq[i] != NULL;
    }
    if (!check(posted == 2 * P, "round %d: %d receives and %d sends posted (%d)", round, P, P, posted)) break;
    left = 2 * P;
    while (left && now_s() < end) {
      for (int i = 0; i < P; i++) {
        int done = 0, size = 0;
        if (sreq[i]) {
          tsn_result_t tr = shim_test(&n, sreq[i], &done, &size);
          if (tr != TSN_SUCCESS || done) sreq[i] = NULL, left--, failed += tr != TSN_SUCCESS;
        }
        if (rreq[i]) {
          tsn_result_t tr = shim_test(&n, rreq[i], &done, &size);
          if (tr != TSN_SUCCESS || done) {
            rreq[i] = NULL, left--, failed += tr != TSN_SUCCESS;
            wrong += tr == TSN_SUCCESS && (size != SZ || memcmp(rbuf + (size_t)i * SZ, sbuf + (size_t)i * SZ, SZ) != 0);
          }
        }
      }
    }
    if (!check(!left && !failed && !wrong, "round %d: a 64 KiB message on each of %d pairs in %.3f s, all validated (%d not done, %d failed, %d wrong)",
               round, P, now_s() - t, left, failed, wrong))
      break;
  }
  if (regs == P) note("resident with every pair up: %ld KiB", resident_kib());
  int closes = 0;
  if (bigmem) {
    double t = now_s();
    int deregs = 0;
    for (int i = 0; i < 2 * P; i++)
      if (bigmh[i]) deregs += shim_dereg_mr(&n, i < P ? sc[i] : rc[i - P], bigmh[i]) == TSN_SUCCESS;
    note("deregMr of %d large regions in %.3f s", deregs, now_s() - t);
    munmap(bigmem, big * 2 * (size_t)P);
  }
  free(bigmh);
  for (int i = 0; i < P; i++) {
    if (smh[i]) shim_dereg_mr(&n, sc[i], smh[i]);
    if (rmh[i]) shim_dereg_mr(&n, rc[i], rmh[i]);
    closes += (sc[i] ? shim_close_send(&n, sc[i]) : 0) == TSN_SUCCESS;
    closes += (rc[i] ? shim_close_recv(&n, rc[i]) : 0) == TSN_SUCCESS;
    closes += (lc[i] ? shim_close_listen(&n, lc[i]) : 0) == TSN_SUCCESS;
  }
  check(closes == 3 * P, "closeSend, closeRecv and closeListen of %d pairs return 0 (%d of %d)", P, closes, 3 * P);
  free(lc), free(sc), free(rc), free(smh), free(rmh), free(sreq), free(rreq), free(handles), free(sbuf), free(rbuf);
  return g_fail != failures;
}

// TSNET_TEST_CYCLES (1): the pairs are opened, used and closed that many times in one context,
// and the process's resident memory is printed after each cycle's closes (a settled plugin, one
// second later): what comms leave behind once closed should not grow from cycle to cycle.
static void sc_many(int version) {
  set_prefix(version, "many", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  const char* env = getenv("TSNET_TEST_PAIRS");
  int P = env && atoi(env) > 0 ? atoi(env) : 256;
  const char* cenv = getenv("TSNET_TEST_CYCLES");
  int cycles = cenv && atoi(cenv) > 0 ? atoi(cenv) : 1;
  note("resident before the first cycle: %ld KiB", resident_kib());
  for (int c = 1; c <= cycles; c++) {
    char name[32];
    snprintf(name, sizeof name, cycles > 1 ? "many, cycle %d" : "many", c);
    set_prefix(version, name, NULL);
    int bad = many_cycle(&n, ctx, P);
    usleep(1000 * 1000);
    note("resident after %d cycle(s) of %d pairs: %ld KiB", c, P, resident_kib());
    if (bad) break;
  }
  set_prefix(version, "many", NULL);
  fini_ctx(&n, ctx);
  shim_close(&n);
}

// ---------------------------------------------------------------- groups

// A receive of more than one buffer holds one of its comm's TSN_MAX_REQUESTS groups of buffers
// while in flight (NCCL keeps no more requests than that in flight per comm): one more at once
// gets a NULL request (NCCL posts it again later), a receive of one buffer still gets a slot, a
// flush of more than one fails (a NULL flush request would tell NCCL the flush was done), every
// message lands in the entry of its tag, and once tested a group serves the next receive.
static void sc_groups(int version) {
  set_prefix(version, "groups", NULL);
  Net n;
  void* ctx = NULL;
  if (open_with_ctx(&n, version, &ctx)) return;
  int mr = max_recvs(&n);
  enum { G = TSN_MAX_REQUESTS, SZ = 512, MSGS = 2 * G + 1 };
  void *lc, *sc, *rc;
  if (mr < 2) {
    note("skip: the device's maxRecvs is %d", mr);
  } else if (pair_open(&n, ctx, &lc, &sc, &rc) == 0) {
    uint8_t* sbuf = malloc((size_t)(MSGS + 2) * SZ);
    uint8_t* rbuf = calloc((size_t)(MSGS + 2), SZ);
    for (int m = 0; m < MSGS + 2; m++) memset(sbuf + (size_t)m * SZ, 1 + m, SZ);
    void *sm = NULL, *rm = NULL;
    tsn_result_t r = shim_reg_mr(&n, sc, sbuf, (size_t)(MSGS + 2) * SZ, TSN_PTR_HOST, &sm);
    tsn_result_t r2 = shim_reg_mr(&n, rc, rbuf, (size_t)(MSGS + 2) * SZ, TSN_PTR_HOST, &rm);
    void* rreq[G + 2] = {0};
    void* sreq[MSGS + 2] = {0};
    size_t sizes[2] = {SZ, SZ};
    int tags[2] = {1, 2};
    void* mhs[2] = {rm, rm};
    // Receive i takes messages 2i (tag 1) and 2i + 1 (tag 2) in rbuf's same places.
    int posted = 0;
    tsn_result_t last = TSN_SUCCESS;
    for (int i = 0; i <= G && r == 0 && r2 == 0; i++) {
      void* data[2] = {rbuf + (size_t)(2 * i) * SZ, rbuf + (size_t)(2 * i + 1) * SZ};
      last = shim_irecv(&n, rc, 2, data, sizes, tags, mhs, &rreq[i]);
      posted += last == TSN_SUCCESS && rreq[i] != NULL;
    }
    check(posted == G && last == TSN_SUCCESS && !rreq[G], "%d receives of 2 buffers in flight, the next one gets a NULL request (rc %d)", posted, last);
    void* one = NULL;
    r = recv_one(&n, rc, rbuf + (size_t)(2 * G) * SZ, SZ, 3, rm, &one);
    check(r == TSN_SUCCESS && one, "a receive of one buffer still gets a request (rc %d)", r);
    // A NULL flush request would tell NCCL the flush was done: with no group free, iflush fails.
    void* fl = (void*)0x1;
    int fsizes[2] = {SZ, SZ};
    void* fdata[2] = {rbuf, rbuf + SZ};
    r = shim_iflush(&n, rc, 2, fdata, fsizes, mhs, &fl);
    check(r == TSN_INVALID_USAGE && !fl, "an iflush of 2 buffers with every group in flight fails with invalid usage, no request (rc %d)", r);
    int sent = 0;
    for (int m = 0; m < MSGS && sm; m++) {
      int tag = m == 2 * G ? 3 : 1 + (m & 1);
      send_one(&n, sc, sbuf + (size_t)m * SZ, SZ, tag, sm, &sreq[m]);
      sent += sreq[m] != NULL;
    }
    int ok = 0, wrong = 0;
    for (int m = 0; m < MSGS; m++)
      if (sreq[m] && wait_req(&n, sreq[m], NULL, g_timeout) == TSN_SUCCESS) ok++;
    for (int i = 0; i < G; i++) {
      int got[TSN_MAX_RECVS] = {0};
      if (rreq[i] && wait_req(&n, rreq[i], got, g_timeout) == TSN_SUCCESS) ok++;
      wrong += got[0] != SZ || got[1] != SZ;
    }
    int size = -1;
    if (one && wait_req(&n, one, &size, g_timeout) == TSN_SUCCESS) ok++;
    wrong += size != SZ;
    for (int m = 0; m < MSGS; m++) wrong += memcmp(rbuf + (size_t)m * SZ, sbuf + (size_t)m * SZ, SZ) != 0;
    check(sent == MSGS && ok == MSGS + G + 1 && !wrong, "%d messages by tag into the %d receives and the one: every request ends and every byte is in its entry (%d ended, %d wrong)",
          sent, G, ok, wrong);
    // Every group is free again: a receive of 2 takes one, and its two messages land.
    void* again = NULL;
    void* data[2] = {rbuf + (size_t)MSGS * SZ, rbuf + (size_t)(MSGS + 1) * SZ};
    r = shim_irecv(&n, rc, 2, data, sizes, tags, mhs, &again);
    void *s1 = NULL, *s2 = NULL;
    if (sm) send_one(&n, sc, sbuf + (size_t)MSGS * SZ, SZ, 1, sm, &s1);
    if (sm) send_one(&n, sc, sbuf + (size_t)(MSGS + 1) * SZ, SZ, 2, sm, &s2);
    int got[TSN_MAX_RECVS] = {0};
    tsn_result_t a = again ? wait_req(&n, again, got, g_timeout) : -1;
    tsn_result_t b = s1 ? wait_req(&n, s1, NULL, g_timeout) : -1, c = s2 ? wait_req(&n, s2, NULL, g_timeout) : -1;
    check(r == TSN_SUCCESS && again && a == 0 && b == 0 && c == 0 && got[0] == SZ && got[1] == SZ &&
              !memcmp(rbuf + (size_t)MSGS * SZ, sbuf + (size_t)MSGS * SZ, 2 * SZ),
          "after the tests a receive of 2 buffers gets a group again, and its messages land (rc %d, %d, %d, %d)", r, a, b, c);
    if (sm) shim_dereg_mr(&n, sc, sm);
    if (rm) shim_dereg_mr(&n, rc, rm);
    pair_close(&n, lc, sc, rc, 1);
    free(sbuf);
    free(rbuf);
  }
  fini_ctx(&n, ctx);
  shim_close(&n);
}

enum { ONE_PROC = 0, PAIR = 1, OWN_PROCS = 2 };
typedef struct Scenario {
  const char* name;
  void (*run)(int version);
  int kind;    // ONE_PROC: --procs 1 only; PAIR: --procs 1 or 2, --role; OWN_PROCS: the same under any --procs
  int in_all;  // part of `all`
  const char* about;
} Scenario;

static const Scenario SCENARIOS[] = {
    {"tables", sc_tables, ONE_PROC, 1, "symbols, slots, devices, properties"},
    {"transfer", sc_transfer, PAIR, 1, "0 B to 4 MiB validated (--procs 2 / --role: to 64 MiB)"},
    {"inflight", sc_inflight, PAIR, 1, "8, then 32 sends and receives posted before any test"},
    {"grouped", sc_grouped, PAIR, 1, "irecv n = 8 and 4, tags sent shuffled, 20 rounds"},
    {"pushback", sc_pushback, PAIR, 1, "messages pushed back to later receives by their tags, eager and striped mixed"},
    {"teardown", sc_teardown, PAIR, 1, "deregMr and close under load by either side, reconnect; 5 cycles, descriptors"},
    {"marker", sc_marker, PAIR, 1, "*request = 0x1 before irecv"},
    {"peerclose", sc_peerclose, PAIR, 1, "the receiver closes with 3 sends waiting: they fail, promptly where the transport is told"},
    {"badinput", sc_badinput, PAIR, 1, "bad calls, then a transfer (--procs 2 / --role: a 16 KiB send into 4 KiB)"},
    {"lifecycle", sc_lifecycle, ONE_PROC, 1, "closing with requests in flight, contexts, dlclose"},
    {"fork", sc_fork, ONE_PROC, 1, "a child forked with comms open: its calls fail at once, it exits, the parent goes on"},
    {"stale", sc_stale, ONE_PROC, 1, "handles given back, used again: refused with a WARN, never acting on a newer handle"},
    {"groups", sc_groups, ONE_PROC, 1, "33 receives of 2 buffers: the last gets a NULL request, one of 1 still a slot, a flush of 2 fails; all land, then a group is free again"},
    {"exitbusy", sc_exitbusy, OWN_PROCS, 0, "processes exit() while a thread connects and closes pairs: no fault (not in all)"},
    {"held", sc_held, ONE_PROC, 0, "the process stopped, then a call held, past TSNET_TIMEOUT_SEC: comms live on, the WARN says why (not in all: run with TSNET_TIMEOUT_SEC=1)"},
    {"stopped", sc_stopped, ONE_PROC, 0, "the plugin's thread stops with comms open: later calls fail at once (not in all: needs TSNET_TEST_EXIT_FILE)"},
    {"killpeer", sc_killpeer, OWN_PROCS, 1, "SIGKILL of the sender, then of the receiver, mid-stream (TCP)"},
    {"stranger", sc_stranger, OWN_PROCS, 1, "raw TCP clients on a listener's port, then a real connection (TCP)"},
    {"many", sc_many, ONE_PROC, 0, "TSNET_TEST_PAIRS (256) comm pairs open at once, 3 rounds of a 64 KiB message on each (not in all)"},
    {"bulk", sc_bulk, PAIR, 0, "8 messages of 64 MiB, validated (not in all)"},
    {"gpu", sc_gpu, PAIR, 0, "0 B to 64 MiB from and into CUDA memory with iflush (not in all: needs a GPU)"},
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
  ssize_t got = take_counts(res[0]);
  set_prefix(version, s->name, NULL);
  if (WIFSIGNALED(status)) check(0, "the scenario's process died of signal %d", WTERMSIG(status));
  else if (got != (ssize_t)(2 * sizeof(int))) check(0, "the scenario's process exited (status %d) without reporting", WEXITSTATUS(status));
}

static void usage(void) {
  fprintf(stderr,
          "usage: driver <scenario[,scenario...]|all|list> [--version N] [--lib PATH] [--procs 1|2] [--dev D] [--timeout S] "
          "[--verbose] [--role send|recv --rendezvous DIR]\n"
          "  scenarios: tables transfer inflight grouped pushback teardown marker peerclose badinput lifecycle fork stale stopped exitbusy killpeer stranger bulk gpu\n"
          "  --version N   table version 6..12, or all (default: 12; the scenario 'all' runs 6..12 unless given)\n"
          "  --lib PATH    plugin library (default: $TSNET_DRIVER_LIB or build/libnccl-net-tsnet.so)\n"
          "  --procs 2     receiver and sender in two forked processes (pair scenarios)\n"
          "  --role R      run only the send or the recv role of each pair; the other role is another\n"
          "                invocation that shares --rendezvous DIR (a fresh directory) with this one\n"
          "  --timeout S   seconds any wait may take before it fails (default 20)\n");
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  pthread_atfork(prefix_lock, prefix_unlock, prefix_reset);
  note_stale_regions();
  if (argc < 2) return usage(), 2;
  const char* what = argv[1];
  int version = 0;
  if (getenv("TSNET_DRIVER_LIB")) g_lib = getenv("TSNET_DRIVER_LIB");
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--verbose")) g_verbose = 1;
    else if (v && !strcmp(a, "--version")) version = strcmp(v, "all") ? atoi(v) : -1, i++;
    else if (v && !strcmp(a, "--lib")) g_lib = v, i++;
    else if (v && !strcmp(a, "--procs")) g_procs = atoi(v), i++;
    else if (v && !strcmp(a, "--dev")) g_dev = atoi(v), i++;
    else if (v && !strcmp(a, "--timeout")) g_timeout = atof(v), i++;
    else if (v && !strcmp(a, "--rendezvous")) g_rdv = v, i++;
    else if (v && !strcmp(a, "--role") && (!strcmp(v, "send") || !strcmp(v, "recv")))
      g_role = strcmp(v, "send") ? ROLE_RECV : ROLE_SEND, i++;
    else return fprintf(stderr, "unknown or incomplete option %s\n", a), usage(), 2;
  }
  if (!strcmp(what, "list")) {
    static const char* kinds[] = {"one process", "pair: --procs 1|2, --role", "its own processes"};
    for (int i = 0; i < NSCENARIOS; i++)
      printf("%-10s %s; %s\n", SCENARIOS[i].name, SCENARIOS[i].about, kinds[SCENARIOS[i].kind]);
    return 0;
  }
  if (g_procs != 1 && g_procs != 2) return fprintf(stderr, "--procs must be 1 or 2\n"), 2;
  if ((g_role != ROLE_BOTH) != (g_rdv != NULL)) return fprintf(stderr, "--role and --rendezvous go together\n"), 2;
  if (version > 0 && (version < SHIM_MIN_VERSION || version > SHIM_MAX_VERSION))
    return fprintf(stderr, "--version must be %d..%d\n", SHIM_MIN_VERSION, SHIM_MAX_VERSION), 2;
  int lo = version > 0 ? version : (strcmp(what, "all") && !version ? SHIM_MAX_VERSION : SHIM_MIN_VERSION);
  int hi = version > 0 ? version : SHIM_MAX_VERSION;
  int ran = 0;
  for (int v = lo; v <= hi; v++)
    for (int i = 0; i < NSCENARIOS; i++) {
      const Scenario* s = &SCENARIOS[i];
      int all = !strcmp(what, "all"), listed = 0;
      for (const char* p = what; !all && *p;) {  // a name, or several separated by commas
        size_t len = strcspn(p, ",");
        if (len == strlen(s->name) && !strncmp(p, s->name, len)) listed = 1;
        p += len + (p[len] == ',');
      }
      if (all ? !s->in_all : !listed) continue;
      ran++;
      if ((g_procs == 2 && s->kind == ONE_PROC) || (g_role != ROLE_BOTH && s->kind != PAIR)) {
        if (!all && !strchr(what, ',')) return fprintf(stderr, "%s does not run with %s\n", s->name, g_role ? "--role" : "--procs 2"), 2;
        continue;
      }
      run_isolated(s, v);
    }
  if (!ran) return fprintf(stderr, "unknown scenario %s\n", what), usage(), 2;
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
