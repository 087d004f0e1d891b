// The native socket I/O engine (docs/io-threads.md). The plugin thread posts gather writes
// and exact reads of memory views on lanes (adopted TCP sockets); I/O threads, one epoll each,
// move the bytes with sendmsg/recvmsg straight from and into the views and queue completions
// back, lock-free, to the plugin thread, which hands them to JS in batches.
//
// Who touches what:
//   Op       plugin thread: free list, filling at post. Then the owning I/O thread's inbox,
//            then its lane's queue (under the lane lock), then the completion stack, then the
//            plugin thread again, which writes its record and puts it back on the free list.
//   Lane     queues, closed flag and fd under Lane::mu. The I/O thread holds mu across every
//            syscall on the fd, so ioClose (which takes mu) never races a syscall. The Lane
//            object is freed by its I/O thread after ioClose sends it the retire message.
#include "io.h"
#include "binding.h"
#include "waker.h"

#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#include <errno.h>
#include <fcntl.h>
#include <napi.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "internal.h"

namespace tsn {
namespace {

constexpr int kInlineIov = 4;            // views an op holds without a heap array
constexpr int kMaxIov = 64;              // iovecs in one syscall, gathered across queued ops
constexpr int kBudget = 16;              // syscalls per lane and direction before others get a turn
constexpr int kCompletionRecords = 4096; // records in the shared completions array
constexpr int kMaxThreads = 64;
constexpr int kEvents = 64;

enum Kind : uint8_t { kWrite = 0, kRead = 1, kRetire = 2 };

struct Lane;

struct Op {
  Op* next = nullptr;  // inbox, lane queue, completion stack or free list: one at a time
  Lane* lane = nullptr;
  double id = 0;       // the caller's opId
  int status = 0;
  Kind kind = kWrite;
  int niov = 0;
  int cur = 0;         // first iovec not fully moved; iov[cur] is advanced in place
  size_t left = 0;     // bytes still to move
  iovec* iov = nullptr;
  iovec inl[kInlineIov];
  iovec* heap = nullptr;  // kept across reuse for ops with many views
  int heapCap = 0;
};

struct IoThread;

struct Lane {
  uint32_t id;
  int fd;
  IoThread* t;
  std::mutex mu;
  // Under mu:
  bool closed = false;
  int err = 0;       // the lane failed: every op completes with this status
  bool eof = false;  // the peer ended the stream: reads complete with kIoStatusEof
  Op* head[2] = {nullptr, nullptr};  // per Kind (write, read): FIFO
  Op* tail[2] = {nullptr, nullptr};
  // I/O thread only:
  bool listed = false;  // in the thread's run list
  bool hup = false;     // epoll reported the peer's end or an error: read until EAGAIN or 0
  Op retire;            // the message ioClose sends; never on the free list
};

// Completions gathered by one thread before being published in one push.
struct DoneList {
  Op* newest = nullptr;
  Op* oldest = nullptr;
  void add(Op* op, int status) {
    op->status = status;
    op->next = newest;
    newest = op;
    if (!oldest) oldest = op;
  }
};

struct IoThread {
  int index = 0;
  int ep = -1;
  int ev = -1;
  std::atomic<Op*> inbox{nullptr};  // MPSC stack, newest first
  std::atomic<bool> sleeping{false};
  std::vector<Lane*> run;        // lanes with work (I/O thread only)
  std::vector<Lane*> graveyard;  // retired lanes, freed before the next epoll_wait
  DoneList done;
  uint64_t spinNs = 0;  // after work, poll this long before sleeping (TSNET_SPIN_US)
};

struct Engine {
  napi_env env = nullptr;
  napi_ref onDone = nullptr;
  napi_ref completionsRef = nullptr;
  double* completions = nullptr;
  napi_async_context async = nullptr;
  Waker waker;
  std::atomic<Op*> done{nullptr};  // MPSC completion stack, newest first
  std::vector<IoThread*> threads;
  // Plugin thread only:
  std::unordered_map<uint32_t, Lane*> lanes;
  uint32_t nextLane = 1;
  uint32_t rr = 0;
  Op* freeOps = nullptr;
};
Engine* E = nullptr;

// --- completions: I/O threads (and ioClose) push, the plugin thread drains ---

void publish(DoneList& d) {
  if (!d.newest) return;
  Op* head = E->done.load(std::memory_order_relaxed);
  do d.oldest->next = head;
  while (!E->done.compare_exchange_weak(head, d.newest, std::memory_order_seq_cst, std::memory_order_relaxed));
  // Only the push that finds the stack empty wakes the plugin thread (unless it is polling
  // anyway, see markActivity); the drain takes all.
  if (!head && !pluginPolling()) E->waker.wake();
  d.newest = d.oldest = nullptr;
}

Op* allocOp() {
  Op* op = E->freeOps;
  if (op) {
    E->freeOps = op->next;
    return op;
  }
  constexpr int kChunk = 256;  // never freed: the engine lives as long as the process
  Op* chunk = new Op[kChunk];
  for (int i = 1; i < kChunk - 1; i++) chunk[i].next = &chunk[i + 1];
  chunk[kChunk - 1].next = nullptr;
  E->freeOps = &chunk[1];
  return &chunk[0];
}

void freeOp(Op* op) {
  op->next = E->freeOps;
  E->freeOps = op;
}

void callOnDone(int count) {
  napi_env env = E->env;
  napi_value fn, arg, res;
  napi_get_reference_value(env, E->onDone, &fn);
  napi_create_int32(env, count, &arg);
  callPlugin(env, E->async, fn, "the I/O completion handler", 1, &arg, &res);
}

// Plugin thread, woken or polling: hands every queued completion to JS.
void onWake() {
  if (!E->done.load(std::memory_order_seq_cst)) return;
  markActivity();
  napi_handle_scope scope;
  napi_open_handle_scope(E->env, &scope);
  for (;;) {
    Op* list = E->done.exchange(nullptr, std::memory_order_acquire);
    if (!list) break;
    Op* fifo = nullptr;
    while (list) {
      Op* next = list->next;
      list->next = fifo;
      fifo = list;
      list = next;
    }
    while (fifo) {
      int n = 0;
      for (; fifo && n < kCompletionRecords; n++) {
        E->completions[2 * n] = fifo->id;
        E->completions[2 * n + 1] = fifo->status;
        Op* next = fifo->next;
        freeOp(fifo);
        fifo = next;
      }
      callOnDone(n);
    }
  }
  napi_close_handle_scope(E->env, scope);
}

// --- the I/O thread ---

void enqueue(Lane* l, Op* op) {
  op->next = nullptr;
  int k = op->kind;
  if (l->tail[k]) l->tail[k]->next = op;
  else l->head[k] = op;
  l->tail[k] = op;
}

// Completes every op of queue k with status (lane lock held).
void failQueue(DoneList& d, Lane* l, int k, int status) {
  for (Op* op = l->head[k]; op;) {
    Op* next = op->next;
    d.add(op, status);
    op = next;
  }
  l->head[k] = l->tail[k] = nullptr;
}

void listLane(IoThread* t, Lane* l) {
  if (l->listed) return;
  l->listed = true;
  t->run.push_back(l);
}

// Moves bytes of queue k until it is empty, the socket would block or the budget is spent.
// Returns true when the budget ran out with work left (lane lock held).
bool move(IoThread* t, Lane* l, int k) {
  for (int round = 0;; round++) {
    while (l->head[k] && l->head[k]->left == 0) {
      Op* op = l->head[k];
      l->head[k] = op->next;
      if (!l->head[k]) l->tail[k] = nullptr;
      t->done.add(op, 0);
    }
    if (!l->head[k]) return false;
    if (round == kBudget) return true;
    iovec v[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (Op* op = l->head[k]; op && n < kMaxIov; op = op->next)
      for (int i = op->cur; i < op->niov && n < kMaxIov; i++)
        if (op->iov[i].iov_len) {
          v[n++] = op->iov[i];
          want += op->iov[i].iov_len;
        }
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    ssize_t r = k == kWrite ? sendmsg(l->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(l->fd, &m, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;  // the next edge brings us back
      l->err = -errno;
      failQueue(t->done, l, kWrite, l->err);
      failQueue(t->done, l, kRead, l->err);
      return false;
    }
    if (r == 0 && k == kRead) {
      l->eof = true;
      failQueue(t->done, l, kRead, kIoStatusEof);
      return false;
    }
    size_t got = static_cast<size_t>(r);
    for (Op* op = l->head[k]; got > 0; op = op->next) {
      while (got > 0 && op->cur < op->niov) {
        iovec& e = op->iov[op->cur];
        size_t c = std::min(got, e.iov_len);
        e.iov_base = static_cast<char*>(e.iov_base) + c;
        e.iov_len -= c;
        op->left -= c;
        got -= c;
        if (e.iov_len == 0) op->cur++;
      }
    }
    // A short transfer means the socket buffer is full (or empty): edge-triggered epoll tells
    // us when that changes, so skip the syscall that would only say EAGAIN. Not once the peer's
    // FIN or an error is known: a short read may have eaten the FIN whose event we already
    // took, and only the next recvmsg (0 or the error) tells.
    if (static_cast<size_t>(r) < want && (k == kWrite || !l->hup)) {
      while (l->head[k] && l->head[k]->left == 0) {
        Op* op = l->head[k];
        l->head[k] = op->next;
        if (!l->head[k]) l->tail[k] = nullptr;
        t->done.add(op, 0);
      }
      return false;
    }
  }
}

// Returns true when the lane should run again before the thread sleeps.
bool progress(IoThread* t, Lane* l) {
  std::lock_guard<std::mutex> g(l->mu);
  if (l->closed || l->err) return false;
  bool again = move(t, l, kWrite);
  if (!l->err) again = move(t, l, kRead) || again;
  return again && !l->err;
}

void drainInbox(IoThread* t) {
  Op* list = t->inbox.exchange(nullptr, std::memory_order_acquire);
  Op* fifo = nullptr;
  while (list) {
    Op* next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo) {
    Op* op = fifo;
    fifo = op->next;
    Lane* l = op->lane;
    if (op->kind == kRetire) {
      t->graveyard.push_back(l);
      continue;
    }
    std::lock_guard<std::mutex> g(l->mu);
    if (l->closed) t->done.add(op, -ECANCELED);
    else if (l->err) t->done.add(op, l->err);
    else if (op->kind == kRead && l->eof) t->done.add(op, kIoStatusEof);
    else {
      enqueue(l, op);
      listLane(t, l);
    }
  }
}

void threadMain(IoThread* t) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);  // a guest: the host's signals go to its own threads
  char name[16];
  snprintf(name, sizeof name, "tsnet-io%d", t->index);
  pthread_setname_np(pthread_self(), name);
  epoll_event evs[kEvents];
  std::vector<Lane*> run;
  uint64_t lastWork = 0;
  for (;;) {
    if (t->inbox.load(std::memory_order_relaxed) || !t->run.empty()) lastWork = uv_hrtime();
    drainInbox(t);
    run.swap(t->run);
    for (Lane* l : run) {
      l->listed = false;
      if (progress(t, l)) listLane(t, l);
    }
    run.clear();
    publish(t->done);
    for (Lane* l : t->graveyard) delete l;  // closed, out of epoll, in no list
    t->graveyard.clear();
    int timeout = 0;
    // Nothing to do: poll on (posters need not wake us) while the spin window lasts, then sleep.
    if (t->run.empty() && (t->spinNs == 0 || uv_hrtime() - lastWork >= t->spinNs)) {
      t->sleeping.store(true, std::memory_order_seq_cst);
      if (!t->inbox.load(std::memory_order_seq_cst)) timeout = -1;
    }
    int n = epoll_wait(t->ep, evs, kEvents, timeout);
    t->sleeping.store(false, std::memory_order_relaxed);
    if (n > 0) lastWork = uv_hrtime();
    for (int i = 0; i < n; i++) {
      if (!evs[i].data.ptr) {
        uint64_t v;
        ssize_t rr = read(t->ev, &v, sizeof v);
        (void)rr;
        continue;
      }
      Lane* l = static_cast<Lane*>(evs[i].data.ptr);
      if (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) l->hup = true;
      listLane(t, l);
    }
  }
}

void post(IoThread* t, Op* op) {
  Op* head = t->inbox.load(std::memory_order_relaxed);
  do op->next = head;
  while (!t->inbox.compare_exchange_weak(head, op, std::memory_order_seq_cst, std::memory_order_relaxed));
  // One eventfd write per burst: only when the thread said it may sleep.
  if (t->sleeping.load(std::memory_order_seq_cst) && t->sleeping.exchange(false, std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t w = write(t->ev, &one, sizeof one);
    (void)w;
  }
}

// --- functions JS calls (plugin thread) ---

Napi::Value fail(Napi::Env env, const std::string& msg, bool range = false) {
  if (range) Napi::RangeError::New(env, msg).ThrowAsJavaScriptException();
  else Napi::TypeError::New(env, msg).ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value sysFail(Napi::Env env, const char* what, int err) {
  Napi::Error e = Napi::Error::New(env, std::string(what) + ": " + strerror(err));
  e.Set("errno", Napi::Number::New(env, -err));
  e.ThrowAsJavaScriptException();
  return env.Undefined();
}

Napi::Value IoStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (E) return fail(env, "ioStart: the I/O engine is already started");
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsFunction())
    return fail(env, "ioStart(threads, onDone) needs a thread count and a function");
  int n = info[0].As<Napi::Number>().Int32Value();
  double spinUs = info.Length() > 2 && info[2].IsNumber() ? info[2].As<Napi::Number>().DoubleValue() : 0;
  if (n < 1 || n > kMaxThreads) return fail(env, "ioStart: threads must be 1.." + std::to_string(kMaxThreads), true);
  Engine* e = new Engine();
  std::vector<IoThread*> threads;
  for (int i = 0; i < n; i++) {
    IoThread* t = new IoThread();
    t->index = i;
    t->ep = epoll_create1(EPOLL_CLOEXEC);
    t->ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (t->ep < 0 || t->ev < 0 || epoll_ctl(t->ep, EPOLL_CTL_ADD, t->ev, &ev) < 0) {
      int err = errno;
      for (IoThread* x : threads) { close(x->ep); close(x->ev); delete x; }
      if (t->ep >= 0) close(t->ep);
      if (t->ev >= 0) close(t->ev);
      delete t;
      delete e;
      return sysFail(env, "ioStart: epoll/eventfd", err);
    }
    t->spinNs = spinUs > 0 ? static_cast<uint64_t>(spinUs * 1000) : 0;
    threads.push_back(t);
  }
  e->env = env;
  e->threads = threads;
  napi_create_reference(env, info[1], 1, &e->onDone);
  Napi::ArrayBuffer buf = Napi::ArrayBuffer::New(env, 2 * kCompletionRecords * sizeof(double));
  Napi::Float64Array completions = Napi::Float64Array::New(env, 2 * kCompletionRecords, buf, 0);
  napi_create_reference(env, completions, 1, &e->completionsRef);
  e->completions = static_cast<double*>(buf.Data());
  napi_async_init(env, nullptr, Napi::String::New(env, "tsnet-io"), &e->async);
  uv_loop_s* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  if (!e->waker.init(loop, onWake)) {
    int err = errno;
    delete e;
    return sysFail(env, "ioStart: eventfd", err);
  }
  E = e;
  for (IoThread* t : threads) std::thread(threadMain, t).detach();  // live as long as the process
  log(kLogInfo, "io: started %d I/O thread%s", n, n == 1 ? "" : "s");
  Napi::Object out = Napi::Object::New(env);
  out.Set("completions", completions);
  out.Set("records", kCompletionRecords);
  out.Set("threads", n);
  return out;
}

Napi::Value IoAdopt(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!E) return fail(env, "ioAdopt: call ioStart first");
  if (info.Length() < 1 || !info[0].IsNumber()) return fail(env, "ioAdopt(fd, thread?) needs an fd");
  int fd = info[0].As<Napi::Number>().Int32Value();
  int ti;
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    if (!info[1].IsNumber()) return fail(env, "ioAdopt: thread must be a number");
    ti = info[1].As<Napi::Number>().Int32Value();
    if (ti < 0 || ti >= static_cast<int>(E->threads.size())) return fail(env, "ioAdopt: no such I/O thread", true);
  } else {
    ti = static_cast<int>(E->rr++ % E->threads.size());
  }
  int type = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0) return sysFail(env, "ioAdopt: not a socket", errno);
  if (type != SOCK_STREAM) return fail(env, "ioAdopt: not a stream socket");
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mine < 0) return sysFail(env, "ioAdopt: dup", errno);
  int fl = fcntl(mine, F_GETFL);
  if (fl < 0 || fcntl(mine, F_SETFL, fl | O_NONBLOCK) < 0) {
    int err = errno;
    close(mine);
    return sysFail(env, "ioAdopt: O_NONBLOCK", err);
  }
  int one = 1;
  setsockopt(mine, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // fails harmlessly on a Unix socket
  Lane* l = new Lane();
  l->id = E->nextLane++;
  l->fd = mine;
  l->t = E->threads[ti];
  l->retire.kind = kRetire;
  l->retire.lane = l;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = l;
  if (epoll_ctl(l->t->ep, EPOLL_CTL_ADD, mine, &ev) < 0) {
    int err = errno;
    close(mine);
    delete l;
    return sysFail(env, "ioAdopt: epoll_ctl", err);
  }
  E->lanes[l->id] = l;
  return Napi::Number::New(env, l->id);
}

Lane* laneArg(const Napi::CallbackInfo& info, const char* fn) {
  Napi::Env env = info.Env();
  if (!E) {
    fail(env, std::string(fn) + ": call ioStart first");
    return nullptr;
  }
  if (info.Length() < 1 || !info[0].IsNumber()) {
    fail(env, std::string(fn) + ": the first argument must be a lane id");
    return nullptr;
  }
  auto it = E->lanes.find(info[0].As<Napi::Number>().Uint32Value());
  if (it == E->lanes.end()) {
    fail(env, std::string(fn) + ": no such lane (closed?)", true);
    return nullptr;
  }
  return it->second;
}

// The bytes of a Uint8Array (or Buffer), without a copy.
bool viewOf(napi_env env, napi_value v, iovec* out) {
  bool is = false;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is) return false;
  napi_typedarray_type type;
  size_t length;
  void* data;
  if (napi_get_typedarray_info(env, v, &type, &length, &data, nullptr, nullptr) != napi_ok) return false;
  if (type != napi_uint8_array) return false;
  out->iov_base = data;
  out->iov_len = data ? length : 0;
  return true;
}

// Fills in an op whose iovecs are set and hands it to its lane's I/O thread.
void start(Lane* l, Op* op, Kind kind, int niov, size_t left, Napi::Value id) {
  op->lane = l;
  op->id = id.As<Napi::Number>().DoubleValue();
  op->kind = kind;
  op->niov = niov;
  op->cur = 0;
  op->left = left;
  op->status = 0;
  post(l->t, op);
}

Napi::Value IoWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = laneArg(info, "ioWrite");
  if (!l) return env.Undefined();
  if (info.Length() < 3 || !info[1].IsArray() || !info[2].IsNumber())
    return fail(env, "ioWrite(lane, views, opId) needs an array of Uint8Array and a number");
  napi_value arr = info[1];
  uint32_t n = 0;
  napi_get_array_length(env, arr, &n);
  Op* op = allocOp();
  if (n <= static_cast<uint32_t>(kInlineIov)) {
    op->iov = op->inl;
  } else {
    if (op->heapCap < static_cast<int>(n)) {
      delete[] op->heap;
      op->heap = new iovec[n];
      op->heapCap = static_cast<int>(n);
    }
    op->iov = op->heap;
  }
  size_t total = 0;
  for (uint32_t i = 0; i < n; i++) {
    napi_value v;
    napi_get_element(env, arr, i, &v);
    if (!viewOf(env, v, &op->iov[i])) {
      freeOp(op);
      return fail(env, "ioWrite: every view must be a Uint8Array");
    }
    total += op->iov[i].iov_len;
  }
  start(l, op, kWrite, static_cast<int>(n), total, info[2]);
  return env.Undefined();
}

Napi::Value IoRead(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = laneArg(info, "ioRead");
  if (!l) return env.Undefined();
  if (info.Length() < 3 || !info[2].IsNumber()) return fail(env, "ioRead(lane, view, opId) needs a Uint8Array and a number");
  Op* op = allocOp();
  op->iov = op->inl;
  if (!viewOf(env, info[1], &op->iov[0])) {
    freeOp(op);
    return fail(env, "ioRead: the view must be a Uint8Array");
  }
  start(l, op, kRead, 1, op->iov[0].iov_len, info[2]);
  return env.Undefined();
}

Napi::Value IoClose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Lane* l = laneArg(info, "ioClose");
  if (!l) return env.Undefined();
  E->lanes.erase(l->id);
  DoneList d;
  {
    // Waits for a syscall the I/O thread may be making on this lane; after this block the
    // thread never touches the lane's views or fd again (it checks closed under mu).
    std::lock_guard<std::mutex> g(l->mu);
    l->closed = true;
    failQueue(d, l, kWrite, -ECANCELED);
    failQueue(d, l, kRead, -ECANCELED);
    shutdown(l->fd, SHUT_RDWR);  // the peer sees the end now, even if a forked child holds a dup
    epoll_ctl(l->t->ep, EPOLL_CTL_DEL, l->fd, nullptr);  // before close: no event names the lane again
    close(l->fd);
    l->fd = -1;
  }
  publish(d);
  post(l->t, &l->retire);  // after every op of this lane already posted: the thread frees it
  return env.Undefined();
}

}  // namespace

void ioPoll() {
  if (E) onWake();
}

void ioRegister(napi_env env, napi_value exports) {
  Napi::Env e(env);
  Napi::Object o(env, exports);
  o.Set("ioStart", Napi::Function::New(e, IoStart, "ioStart"));
  o.Set("ioAdopt", Napi::Function::New(e, IoAdopt, "ioAdopt"));
  o.Set("ioWrite", Napi::Function::New(e, IoWrite, "ioWrite"));
  o.Set("ioRead", Napi::Function::New(e, IoRead, "ioRead"));
  o.Set("ioClose", Napi::Function::New(e, IoClose, "ioClose"));
  Napi::Object s = Napi::Object::New(e);
  s.Set("OK", 0);
  s.Set("EOF", kIoStatusEof);
  s.Set("CANCELLED", -ECANCELED);
  o.Set("ioStatus", s);
}

}  // namespace tsn
