// The native I/O engine (docs/io-threads.md). I/O threads own every socket of every link: one
// epoll each, non-blocking sockets, edge-triggered. Protocol threads drive them through
// shared-memory rings (records.h): each protocol thread has a submission ring to every I/O
// thread and a completion ring back from it. An I/O thread turns submissions into operations on
// its lanes' queues, moves bytes with sendmsg/recvmsg straight from and into the memory named in
// them, fills the receive rings of control lanes, and reports completions in batches. A side is
// woken only when it sleeps.
//
// Who touches what:
//   Op    owned by its I/O thread (free list, lane queues); ioClose moves cancelled ops to the
//         lane's dead list under the lane lock and the I/O thread recycles them.
//   Lane  queues, state flags and fd under Lane::mu; the I/O thread holds mu across every
//         syscall on the fd, so ioClose/ioCancel (which take mu) never race a syscall. The Lane
//         is freed by its I/O thread: after a graceful close finished, or after the retire
//         message of a hard close.
//   Rings submission: protocol thread produces, I/O thread consumes; completion: the reverse.
#include "engine.h"
#include "../guest.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "../binding.h"
#include "../internal.h"
#include "../ofi/ofi.h"
#include "engine_internal.h"

namespace tsn {

Engine* E = nullptr;

namespace {

constexpr int kMaxIov = 64;   // iovecs in one syscall, gathered across queued ops
constexpr int kBudget = 16;   // syscalls per lane and direction before other lanes get a turn
constexpr int kEvents = 64;

}  // namespace

uint64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void* pagesAlloc(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void pagesFree(void* p, size_t bytes) {
  if (p) munmap(p, bytes);
}

void rxRelease(RxMem* m) {
  if (m->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    pagesFree(m->mem, m->bytes);
    delete m;
  }
}

// --- operations ---

Op* allocOp(IoThread* t) {
  Op* op = t->freeOps;
  if (op) {
    t->freeOps = op->next;
    return op;
  }
  constexpr int kChunk = 256;  // never freed: the engine lives as long as the process
  Op* chunk = new Op[kChunk];
  for (int i = 1; i < kChunk - 1; i++) chunk[i].next = &chunk[i + 1];
  chunk[kChunk - 1].next = nullptr;
  t->freeOps = &chunk[1];
  return &chunk[0];
}

void freeOp(IoThread* t, Op* op) {
  op->next = t->freeOps;
  t->freeOps = op;
}

void emit(IoThread* t, int port, uint32_t link, uint32_t op, int status, double value, uint64_t imm, uint32_t flags, uint32_t src) {
  tsn_cqe_t c;
  c.link = link;
  c.op = op;
  c.status = status;
  c.imm = static_cast<uint32_t>(imm);
  c.immHi = static_cast<uint32_t>(imm >> 32);
  c.value = value;
  c.flags = flags;
  c.time = E->trace.load(std::memory_order_relaxed) ? static_cast<double>(nowNs()) / 1000.0 : 0;
  c.src = src;
  c.pad = 0;
  t->out[port].push_back(c);
}

void listLane(IoThread* t, Lane* l) {
  if (l->listed) return;
  l->listed = true;
  t->run.push_back(l);
}

void retireNow(IoThread* t, Lane* l) {
  t->run.erase(std::remove(t->run.begin(), t->run.end(), l), t->run.end());
  t->lingering.erase(std::remove(t->lingering.begin(), t->lingering.end(), l), t->lingering.end());
  if (std::find(t->ofi.begin(), t->ofi.end(), l) != t->ofi.end()) {
    t->ofi.erase(std::remove(t->ofi.begin(), t->ofi.end(), l), t->ofi.end());
    if (l->ofiNoWait) t->ofiNoWait--;
    if (l->ofiBell) t->ofiBells--;
  }
  l->listed = false;
  t->graveyard.push_back(l);
}

namespace {

// An op left its lane's queue: report it with the bytes it moved (unless the protocol closed
// the lane) and recycle it.
void finish(IoThread* t, Lane* l, Op* op, int status) {
  if (!l->quiet && !(op->flags & TSN_SUB_F_NOCQE)) emit(t, l->port, op->link, op->op, status, static_cast<double>(op->total - op->left));
  freeOp(t, op);
}

void enqueue(Lane* l, int dir, Op* op) {
  op->next = nullptr;
  if (l->tail[dir]) l->tail[dir]->next = op;
  else l->head[dir] = op;
  l->tail[dir] = op;
}

void failQueue(IoThread* t, Lane* l, int dir, int status) {
  for (Op* op = l->head[dir]; op;) {
    Op* next = op->next;
    finish(t, l, op, status);
    op = next;
  }
  l->head[dir] = l->tail[dir] = nullptr;
}

// Moves a list of ops onto the lane's dead list (their memory is freed on the I/O thread).
static void discardOps(Lane* l, Op* list) {
  while (list) {
    Op* next = list->next;
    list->next = l->dead;
    l->dead = list;
    list = next;
  }
}

void recycleDead(IoThread* t, Lane* l) {
  for (Op* op = l->dead; op;) {
    Op* next = op->next;
    freeOp(t, op);
    op = next;
  }
  l->dead = nullptr;
}

// The lane failed (lock held): every queued op and the receive ring learn the status.
void failLane(IoThread* t, Lane* l, int status) {
  l->err = status;
  failQueue(t, l, kW, status);
  failQueue(t, l, kR, status);
  if (l->rx && !l->quiet) emit(t, l->port, l->link, TSN_CQE_RX, status, l->rxHdr->written);
}

// --- moving bytes ---

// Moves bytes of queue dir until it is empty, the socket would block or the budget is spent.
// Returns true when the budget ran out with work left (lane lock held).
bool move(IoThread* t, Lane* l, int dir) {
  for (int round = 0;; round++) {
    while (l->head[dir] && l->head[dir]->left == 0) {
      Op* op = l->head[dir];
      l->head[dir] = op->next;
      if (!l->head[dir]) l->tail[dir] = nullptr;
      finish(t, l, op, TSN_STATUS_OK);
    }
    if (!l->head[dir]) return false;
    if (round == kBudget) return true;
    iovec v[kMaxIov];
    int n = 0;
    size_t want = 0;
    for (Op* op = l->head[dir]; op && n < kMaxIov; op = op->next) {
      if (op->discard) {
        size_t c = std::min(op->left, kScratchBytes);
        v[n++] = {t->scratch, c};
        want += c;
        if (c < op->left) break;  // the rest of this op (and later ops) next round
        continue;
      }
      for (int i = op->cur; i < op->niov && n < kMaxIov; i++)
        if (op->iov[i].iov_len) {
          v[n++] = op->iov[i];
          want += op->iov[i].iov_len;
        }
    }
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = n;
    ssize_t r = dir == kW ? sendmsg(l->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(l->fd, &m, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;  // the next edge brings us back
      failLane(t, l, -errno);
      return false;
    }
    if (r == 0 && dir == kR) {
      l->eof = true;
      failQueue(t, l, kR, TSN_STATUS_EOF);
      return false;
    }
    size_t got = static_cast<size_t>(r);
    if (dir == kW && got) noteWrite(l);
    for (Op* op = l->head[dir]; got > 0; op = op->next) {
      if (op->discard) {
        size_t c = std::min(got, op->left);
        op->left -= c;
        got -= c;
        continue;
      }
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
    // A short transfer means the socket buffer is full (or empty): edge-triggered epoll tells us
    // when that changes, so skip the syscall that would only say EAGAIN. Not once the peer's
    // FIN or an error is known: a short read may have eaten the FIN whose event we already
    // took, and only the next recvmsg (0 or the error) tells.
    if (static_cast<size_t>(r) < want && (dir == kW || !l->hup)) {
      while (l->head[dir] && l->head[dir]->left == 0) {
        Op* op = l->head[dir];
        l->head[dir] = op->next;
        if (!l->head[dir]) l->tail[dir] = nullptr;
        finish(t, l, op, TSN_STATUS_OK);
      }
      return false;
    }
  }
}

// Fills a control lane's receive ring (lock held). Returns true when the budget ran out.
bool fillRx(IoThread* t, Lane* l) {
  // Stalled: nothing is read (and no new stall counted) until RX_RESUME, however often the
  // socket becomes readable meanwhile. Ended: the end was reported once; nothing follows it.
  if (l->rxStalled || l->eof) return false;
  tsn_rx_hdr_t* h = l->rxHdr;
  uint32_t w = h->written;
  uint32_t got = 0;
  bool more = false;
  for (int round = 0;; round++) {
    if (round == kBudget) {
      more = true;
      break;
    }
    uint32_t room = l->rxCap - (w - loadSeqCst(&h->consumed));
    if (room == 0) {
      // Full: wait for RX_RESUME. Each stall gets a new number, so the protocol thread answers
      // every one once. Dekker with it: it stores consumed, then loads stalled; we store
      // stalled, then load consumed (room found now: read on; its RX_RESUME is harmless).
      storeSeqCst(&h->stalled, h->stalled + 1);
      if (l->rxCap - (w - loadSeqCst(&h->consumed)) == 0) {
        l->rxStalled = true;
        break;
      }
      continue;
    }
    uint32_t pos = w & (l->rxCap - 1);
    uint32_t first = std::min(room, l->rxCap - pos);
    iovec v[2] = {{l->rx + pos, first}, {l->rx, room - first}};
    msghdr m{};
    m.msg_iov = v;
    m.msg_iovlen = room > first ? 2 : 1;
    ssize_t r = recvmsg(l->fd, &m, MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      if (got) storeRelease(&h->written, w);
      failLane(t, l, -errno);
      return false;
    }
    if (r == 0) {
      l->eof = true;
      storeRelease(&h->written, w);
      if (!l->quiet) emit(t, l->port, l->link, TSN_CQE_RX, TSN_STATUS_EOF, w);
      return false;
    }
    w += static_cast<uint32_t>(r);
    got += static_cast<uint32_t>(r);
    if (static_cast<uint32_t>(r) < room && !l->hup) break;  // drained (see move())
  }
  if (got) {
    storeRelease(&h->written, w);
    if (!l->quiet) emit(t, l->port, l->link, TSN_CQE_RX, TSN_STATUS_OK, w);
  }
  return more;
}

// Reads and drops what the peer still sends to a lane that is closing (lock held). Returns
// kDrained once the peer's end (or an error) was seen, kEmpty when the socket has nothing for
// now (an edge brings the lane back), kMore when the budget ran out with bytes left (the lane
// must run again: those bytes bring no new edge).
enum Drain { kDrained, kEmpty, kMore };
Drain drainClosing(IoThread* t, Lane* l) {
  for (int round = 0; round < kBudget; round++) {
    ssize_t r = recv(l->fd, t->scratch, kScratchBytes, MSG_DONTWAIT);
    if (r == 0) return kDrained;
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? kEmpty : kDrained;
    }
  }
  return kMore;
}

// Ends a graceful close or a failed closing lane (lock held): the fd goes, the lane is freed
// after this pass.
void closeFd(IoThread* t, Lane* l) {
  if (l->fd >= 0) {
    epoll_ctl(t->ep, EPOLL_CTL_DEL, l->fd, nullptr);
    close(l->fd);
    l->fd = -1;
  }
  l->closed = true;
}

// Returns true when the lane should run again before the thread sleeps.
bool progress(IoThread* t, Lane* l) {
  std::unique_lock<std::mutex> g(l->mu);
  if (l->closed) return false;
  if (l->ofi) return ofiProgress(t, l);
  bool again = false;
  if (!l->err) {
    again = move(t, l, kW);
    if (!l->err && !l->closing) again = (l->rx ? fillRx(t, l) : move(t, l, kR)) || again;
  }
  if (!l->closing) return again && !l->err;
  // A graceful close: after the last queued byte, shut down writing (the peer reads everything,
  // then our end) and drain what the peer still sends until its end, so that closing never
  // resets a connection whose last bytes are still on their way.
  bool done = l->err != 0;
  if (!done && !l->shutWr && !l->head[kW]) {
    shutdown(l->fd, SHUT_WR);
    l->shutWr = true;
    l->lingerUntil = nowNs() + E->lingerNs;
    t->lingering.push_back(l);
  }
  if (!done && l->shutWr) {
    Drain d = drainClosing(t, l);
    if (d == kMore) return true;
    done = d == kDrained;
  }
  if (!done) return again;
  closeFd(t, l);
  g.unlock();
  retireNow(t, l);
  return false;
}

// --- submissions ---

Lane* laneById(uint32_t id) {
  uint32_t chunk = id / kLaneChunk;
  if (chunk >= kLaneChunks) return nullptr;
  Lane** c = E->chunks[chunk].load(std::memory_order_acquire);
  return c ? __atomic_load_n(&c[id % kLaneChunk], __ATOMIC_ACQUIRE) : nullptr;
}

// A number from a record that must be a byte count or address: an integer in [0, 2^53).
bool asSize(double d, size_t* out) {
  if (!(d >= 0) || d > 9007199254740991.0 || d != static_cast<double>(static_cast<uint64_t>(d))) return false;
  *out = static_cast<size_t>(d);
  return true;
}

// A fresh op for submission s: whose it is and its flags.
Op* opFor(IoThread* t, const tsn_sub_t* s) {
  Op* op = allocOp(t);
  op->link = s->link;
  op->op = s->op;
  op->flags = static_cast<uint16_t>(s->flags);
  return op;
}

void takeSub(IoThread* t, int port, const tsn_sub_t* s) {
  Lane* l = laneById(s->lane);
  bool cqe = !(s->flags & TSN_SUB_F_NOCQE);
  if (!l || l->port != port || l->t != t) {
    if (cqe) emit(t, port, s->link, s->op, -EBADF, 0);
    return;
  }
  if (s->kind == TSN_SUB_RX_RESUME) {
    if (!l->rx) {  // a data lane has no receive ring to resume
      if (cqe) emit(t, port, s->link, s->op, -EINVAL, 0);
      return;
    }
    std::lock_guard<std::mutex> g(l->mu);
    l->rxStalled = false;
    if (!l->closed) listLane(t, l);
    return;
  }
  size_t addr = 0, len = 0;
  if (l->ofi) {
    size_t raddr = 0, hlen = s->rkeyLo;
    bool ok = s->kind >= TSN_SUB_OFI_RECV && s->kind <= TSN_SUB_OFI_READ && asSize(s->addr, &addr) &&
              asSize(s->len, &len) && asSize(s->raddr, &raddr) && (len == 0 || addr != 0);
    if (!ok) {
      if (cqe) emit(t, port, s->link, s->op, -EINVAL, 0);
      return;
    }
    Op* op = opFor(t, s);
    op->kind = s->kind;
    op->peer = s->aux;
    uint32_t hi;
    memcpy(&hi, s->inl, sizeof hi);
    op->imm = static_cast<uint64_t>(hi) << 32 | s->imm;
    op->raddr = raddr;
    op->rkey = static_cast<uint64_t>(s->rkeyHi) << 32 | s->rkeyLo;
    op->niov = 0;
    op->mr[0] = op->mr[1] = 0;
    if (s->kind == TSN_SUB_OFI_SEND && hlen) {  // a header first: [raddr, raddr+rkeyLo), registration rkeyHi
      op->iov[op->niov] = {reinterpret_cast<void*>(raddr), hlen};
      op->mr[op->niov++] = s->rkeyHi;
      op->rkey = 0;
    }
    op->iov[op->niov] = {reinterpret_cast<void*>(addr), len};
    op->mr[op->niov++] = s->mr;
    op->total = op->left = len;
    std::lock_guard<std::mutex> g(l->mu);
    if (l->closed || l->quiet) {
      ofiRelease(op);
      freeOp(t, op);
    } else {
      ofiTake(t, l, op);
      listLane(t, l);
    }
    return;
  }
  int dir = s->kind == TSN_SUB_WRITE ? kW : kR;
  bool ok = (s->kind == TSN_SUB_WRITE || s->kind == TSN_SUB_READ || s->kind == TSN_SUB_DISCARD) &&
            asSize(s->addr, &addr) && asSize(s->len, &len) && s->inlineLen <= TSN_SUB_INLINE &&
            (len == 0 || addr != 0 || s->kind == TSN_SUB_DISCARD) && (dir == kW || (!l->rx && s->inlineLen == 0));
  if (!ok) {
    if (cqe) emit(t, port, s->link, s->op, -EINVAL, 0);
    return;
  }
  Op* op = opFor(t, s);
  op->discard = s->kind == TSN_SUB_DISCARD;
  op->ext = len > 0 && !op->discard;
  op->niov = 0;
  op->cur = 0;
  if (s->inlineLen) {
    memcpy(op->inl, s->inl, s->inlineLen);
    op->iov[op->niov++] = {op->inl, s->inlineLen};
  }
  if (len && !op->discard) op->iov[op->niov++] = {reinterpret_cast<void*>(addr), len};
  op->total = op->left = s->inlineLen + len;
  std::lock_guard<std::mutex> g(l->mu);
  if (l->closed || l->quiet) freeOp(t, op);
  else if (l->err) finish(t, l, op, l->err);
  else if (dir == kR && l->eof) finish(t, l, op, TSN_STATUS_EOF);
  else {
    enqueue(l, dir, op);
    listLane(t, l);
  }
}

// Takes every waiting submission from every protocol thread; true when there were any.
bool drainSubs(IoThread* t) {
  bool any = false;
  for (int p = 0; p < kMaxPorts; p++) {
    Port* port = E->ports[p].load(std::memory_order_acquire);
    if (!port) continue;
    Ring<tsn_sub_t>& ring = port->sub[t->index];
    uint32_t head = ring.hdr->head;
    uint32_t n = ring.ready(head);
    if (!n) continue;
    any = true;
    for (uint32_t i = 0; i < n; i++) takeSub(t, p, ring.at(head + i));
    storeRelease(&ring.hdr->head, head + n);
  }
  return any;
}

bool anySubs(IoThread* t) {
  for (int p = 0; p < kMaxPorts; p++) {
    Port* port = E->ports[p].load(std::memory_order_acquire);
    if (port && loadSeqCst(&port->sub[t->index].hdr->tail) != port->sub[t->index].hdr->head) return true;
  }
  return false;
}

bool drainAdmin(IoThread* t) {
  Admin* list = t->admin.exchange(nullptr, std::memory_order_acquire);
  if (!list) return false;
  Admin* fifo = nullptr;
  while (list) {
    Admin* next = list->next;
    list->next = fifo;
    fifo = list;
    list = next;
  }
  while (fifo) {
    Admin* a = fifo;
    fifo = a->next;
    Lane* l = a->lane;
    if (a->kind == Admin::kRetire) retireNow(t, l);
    else if (a->kind == Admin::kKick) {
      // A graceful close: the lane may have finished closing already (its peer's end was
      // seen in the pass that followed ioClose); it waits in the graveyard for this admin.
      std::lock_guard<std::mutex> g(l->mu);
      l->kicks--;
      if (!l->closed) listLane(t, l);
    } else if (a->kind == Admin::kStall && l) {
      std::lock_guard<std::mutex> g(l->mu);
      l->testStallMs = a->ms;
    } else if (a->kind == Admin::kStall) {
      InCall in(t, ~0u, IoCall::kTest);
      usleep(a->ms * 1000);
    } else if (a->kind == Admin::kAddOfi) {
      t->ofi.push_back(l);  // polled every pass from now on
      std::lock_guard<std::mutex> g(l->mu);
      if (l->ofi && !l->closed && l->ofi->waitFd() < 0) {
        l->ofiNoWait = true;
        t->ofiNoWait++;
        if (l->ofi->bellFd() >= 0) {
          l->ofiBell = true;
          t->ofiBells++;
        }
      }
    }
    delete a;
  }
  return true;
}

// Hands the completions gathered in this pass to their protocol threads; what does not fit
// stays for the next pass. Returns true when some had to stay.
bool publish(IoThread* t) {
  bool left = false;
  for (int p = 0; p < kMaxPorts; p++) {
    std::vector<tsn_cqe_t>& out = t->out[p];
    if (out.empty()) continue;
    Port* port = E->ports[p].load(std::memory_order_acquire);
    Ring<tsn_cqe_t>& ring = port->cq[t->index];
    uint32_t tail = ring.hdr->tail;
    uint32_t n = std::min<uint32_t>(ring.room(tail), static_cast<uint32_t>(out.size()));
    for (uint32_t i = 0; i < n; i++) *ring.at(tail + i) = out[i];
    if (n) {
      storeSeqCst(&ring.hdr->tail, tail + n);
      pluginWake(p);  // no-op while that thread polls
    }
    out.erase(out.begin(), out.begin() + n);
    if (!out.empty()) left = true;
  }
  return left;
}

void freeLane(IoThread* t, Lane* l) {
  recycleDead(t, l);
  for (Op* op = l->ofiHead; op;) {
    Op* next = op->next;
    ofiRelease(op);
    freeOp(t, op);
    op = next;
  }
  for (int dir = 0; dir < 2; dir++)
    for (Op* op = l->head[dir]; op;) {
      Op* next = op->next;
      freeOp(t, op);
      op = next;
    }
  uint32_t id = l->id;
  __atomic_store_n(&E->chunks[id / kLaneChunk].load()[id % kLaneChunk], nullptr, __ATOMIC_RELEASE);
  ofiDelete(l);
  if (l->rxMem) rxRelease(l->rxMem);
  delete l;
  std::lock_guard<std::mutex> g(E->laneMu);
  E->freeIds.push_back(id);
}

// Endpoints without a wait fd (libfabric's shm) after activity: sleep the thread's noWaitNs
// (TSNET_OFI_POLL_US) instead of epoll_wait's 1 ms minimum, for kNoWaitRecentNs. epoll_pwait2
// (Linux 5.11) takes a timespec; where the kernel lacks it, 1 ms it is.
constexpr uint64_t kNoWaitRecentNs = 1000000;
// The longest sleep on armed doorbells. Every peer that can reach an endpoint through shm can
// ring its bell (the same user and /dev/shm, protocol version 6), so this only bounds what an
// unforeseen lost ring would cost. Not 1 ms: on 2 cores, idle threads waking every ms put
// millisecond tails on the busy ones (8-byte ping-pong p99 0.65-2.0 ms with 1 ms, 57 us with
// longer sleeps; docs/performance.md, item 34).
constexpr int kBellFallbackMs = 10;
std::atomic<bool> g_noPwait2{false};

// The last time any I/O thread of the process did work while it served an endpoint without a
// wait fd. Rails split a device's messages between threads (round-robin, stripes), so each
// thread alone sees only every few of them: with 4 rails at 4 ranks a thread's own gaps passed
// the ms of short polls, its next message waited for the 1 ms poll, the operation slowed, the
// gaps grew, and 8-byte AllReduce settled at 1.7-2.9 ms where one rail took 42-65 us
// (docs/performance.md, item 25). Any such thread's work counts as this thread's for its short
// polls (a poll every TSNET_OFI_POLL_US). Its busy-poll window, where it polls without
// sleeping, runs from the work of the rails of its own endpoints (g_groupWork), and from any
// such thread's only while its own endpoints worked in the last kBorrowNs: when it ran from any
// thread's whatever this one did, every protocol thread's endpoint kept an I/O thread spinning
// whenever one of them carried messages, a whole CPU per idle endpoint (item 32); with no
// borrowing at all, endpoints that take turns within an operation (NCCL's channels on several
// protocol threads) slept between their turns, and 32 KiB AllReduce with 4 protocol threads
// took a quarter longer. Written at most every 100 us, so that busy threads do not fight over
// the cache lines.
std::atomic<uint64_t> g_noWaitWork{0};
constexpr uint64_t kNoWaitShareNs = 100000;
// How recent this thread's own work must be for another endpoint's to hold its window open.
constexpr uint64_t kBorrowNs = 10000000;
// The last work of each group of rails (one endpoint's rails, ofiRail's group), by group
// number modulo the table: two groups that share a slot only share their windows.
constexpr size_t kSpinGroups = 256;
std::atomic<uint64_t> g_groupWork[kSpinGroups];

void noteShared(std::atomic<uint64_t>& at, uint64_t now) {
  uint64_t last = at.load(std::memory_order_relaxed);
  if (now > last && now - last >= kNoWaitShareNs) at.store(now, std::memory_order_relaxed);
}

void noteNoWaitWork(const IoThread* t, uint64_t now) {
  noteShared(g_noWaitWork, now);
  for (const Lane* l : t->ofi)
    if (l->ofiNoWait && l->spinGroup) noteShared(g_groupWork[l->spinGroup % kSpinGroups], now);
}

uint64_t since(uint64_t recent, uint64_t now) { return recent >= now ? 0 : now - recent; }

/** ns since this thread's last work or, where it serves an endpoint without a wait fd, since any such thread's: its short polls run from that. */
uint64_t pollIdleNs(const IoThread* t, uint64_t now, uint64_t lastWork) {
  uint64_t recent = lastWork;
  if (t->ofiNoWait) recent = std::max(recent, g_noWaitWork.load(std::memory_order_relaxed));
  return since(recent, now);
}

/** ns since the last work of the rails of this thread's endpoints without a wait fd (UINT64_MAX where it has none): its busy-poll window runs from that too. */
uint64_t groupIdleNs(const IoThread* t, uint64_t now) {
  uint64_t recent = 0;
  for (const Lane* l : t->ofi)
    if (l->ofiNoWait && l->spinGroup) recent = std::max(recent, g_groupWork[l->spinGroup % kSpinGroups].load(std::memory_order_relaxed));
  return recent ? since(recent, now) : UINT64_MAX;
}

/**
 * Whether this thread's busy-poll window of spin ns has run out: its own work and its rails'
 * are that old, and so is every shm thread's or its own is older than kBorrowNs.
 */
bool windowClosed(IoThread* t, uint64_t now, uint64_t lastWork, uint64_t spin) {
  uint64_t own = since(lastWork, now);
  if (own < spin) return false;
  if (!t->ofiNoWait) return true;
  if (groupIdleNs(t, now) < spin) {
    t->sharedSpins.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (own < kBorrowNs && pollIdleNs(t, now, lastWork) < spin) {
    t->borrowedSpins.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  return true;
}

int waitShort(int ep, epoll_event* evs, int max, uint64_t ns) {
#ifdef SYS_epoll_pwait2
  if (!g_noPwait2.load(std::memory_order_relaxed)) {
    timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
    long r = syscall(SYS_epoll_pwait2, ep, evs, max, &ts, nullptr, 0);
    if (r >= 0 || errno != ENOSYS) return static_cast<int>(r);
    g_noPwait2.store(true, std::memory_order_relaxed);
  }
#else
  (void)ns;
#endif
  return epoll_wait(ep, evs, max, 1);
}

std::atomic<bool> g_ioPark{false};
std::atomic<int> g_ioParked{0};

void threadMain(IoThread* t) {
  blockHostSignals();  // a guest: the host's signals go to its own threads (native/guest.h)
  char name[16];
  snprintf(name, sizeof name, "tsnet-io%d", t->index);
  pthread_setname_np(pthread_self(), name);
  // A timed sleep ends up to the timer slack late (50 us by default): polls of endpoints
  // without a wait fd shorter than that would double. This thread's slack only.
  if (t->noWaitNs < 50000) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(std::max<uint64_t>(1000, t->noWaitNs / 10)), 0, 0, 0);
  epoll_event evs[kEvents];
  std::vector<Lane*> run;
  uint64_t lastWork = 0;
  int32_t* sleeping = &E->sleeping[t->index];
  for (;;) {
    if (g_ioPark.load(std::memory_order_relaxed)) {
      g_ioParked.fetch_add(1);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the process is exiting
    }
    t->passes.fetch_add(1, std::memory_order_relaxed);
    bool work = drainAdmin(t);
    work = drainSubs(t) || work;
    work = work || !t->run.empty();
    for (Lane* l : t->ofi) listLane(t, l);  // endpoints progress only when polled
    run.swap(t->run);
    for (Lane* l : run) {
      l->listed = false;
      if (progress(t, l)) {
        listLane(t, l);
        work = true;
      }
    }
    run.clear();
    if (t->ofiActive) {
      t->ofiActive = false;
      work = true;
    }
    uint64_t now = nowNs();
    int lingerMs = -1;
    for (size_t i = 0; i < t->lingering.size();) {
      Lane* l = t->lingering[i];
      if (now >= l->lingerUntil) {
        {
          std::lock_guard<std::mutex> g(l->mu);
          closeFd(t, l);  // the peer never closed its end: give up waiting
        }
        retireNow(t, l);
        continue;
      }
      int ms = static_cast<int>((l->lingerUntil - now) / 1000000) + 1;
      lingerMs = lingerMs < 0 ? ms : std::min(lingerMs, ms);
      i++;
    }
    bool backlog = publish(t);
    // A lane with a kKick admin still to come stays until that admin was taken (drainAdmin).
    size_t kept = 0;
    for (Lane* l : t->graveyard) {
      bool kicked;
      {
        std::lock_guard<std::mutex> g(l->mu);
        kicked = l->kicks > 0;
      }
      if (kicked) t->graveyard[kept++] = l;
      else freeLane(t, l);
    }
    t->graveyard.resize(kept);
    if (work) {
      lastWork = now;
      if (t->ofiNoWait) noteNoWaitWork(t, now);
      if (t->bellsArmed) {  // awake: peers need not ring
        ofiArmBells(t, false);
        t->bellsArmed = false;
      }
    }
    int timeout = 0;
    bool shortWait = false;
    if (backlog) timeout = 1;  // a completion ring is full: its protocol thread drains it soon
    else if (uint64_t spin = t->spinNs.load(std::memory_order_relaxed); t->run.empty() && (spin == 0 || windowClosed(t, now, lastWork, spin))) {
      // Dekker with the posters: they publish, then load sleeping; we store it, then look.
      __atomic_store_n(sleeping, 1, __ATOMIC_SEQ_CST);
      if (!anySubs(t) && !t->admin.load(std::memory_order_seq_cst)) {
        timeout = lingerMs;
        // An endpoint without a wait fd progresses only when polled (shm): every ms, and for
        // the first ms after activity every noWaitNs (a reply is usually that close). Where
        // every one has a doorbell and only receives are posted, its peers ring when they post
        // to it: the bells are armed, the endpoints polled once more (a message that came
        // before the arming), and then the thread sleeps until a ring, or kBellFallbackMs.
        if (!t->ofi.empty() && (t->ofiNoWait || !ofiMayBlock(t))) {
          timeout = t->ofiNoWait ? 1 : 0;
          if (t->ofiNoWait && ofiBellsCover(t)) {
            if (!t->bellsArmed) {
              ofiArmBells(t, true);
              t->bellsArmed = true;
              timeout = 0;
            } else {
              timeout = lingerMs >= 0 && lingerMs < kBellFallbackMs ? lingerMs : kBellFallbackMs;
            }
          } else {
            shortWait = t->ofiNoWait && pollIdleNs(t, now, lastWork) < kNoWaitRecentNs;
          }
        }
      }
    }
    int n = shortWait ? waitShort(t->ep, evs, kEvents, t->noWaitNs) : epoll_wait(t->ep, evs, kEvents, timeout);
    __atomic_store_n(sleeping, 0, __ATOMIC_RELAXED);
    if (n > 0) lastWork = nowNs();
    bool rang = false;
    for (int i = 0; i < n; i++) {
      if (!evs[i].data.ptr) {
        uint64_t v;
        ssize_t rr = read(t->ev, &v, sizeof v);
        (void)rr;
        t->wakes.woke();
        continue;
      }
      if (evs[i].data.u64 & kBellTag) {  // a peer rang: the flag it swapped is armed no more
        Lane* l = reinterpret_cast<Lane*>(evs[i].data.u64 & ~kBellTag);
        ofiBellHeard(l);
        rang = true;
        listLane(t, l);
        continue;
      }
      Lane* l = static_cast<Lane*>(evs[i].data.ptr);
      if (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) l->hup = true;
      listLane(t, l);
    }
    if (rang) {  // awake, the others' bells too: re-armed before the next sleep
      ofiArmBells(t, false);
      t->bellsArmed = false;
    }
  }
}

}  // namespace

// --- used by the JavaScript-facing functions (engine_js.cc), on protocol threads ---

void wakeThread(IoThread* t) {
  if (__atomic_exchange_n(&E->sleeping[t->index], 0, __ATOMIC_SEQ_CST) == 1) {
    t->wakes.asked();
    uint64_t one = 1;
    ssize_t w = write(t->ev, &one, sizeof one);
    (void)w;
  }
}

bool laneStreams(const Lane* l, uint64_t* now) {
  uint64_t idle = E->directIdleNs.load(std::memory_order_relaxed);
  *now = idle ? nowNs() : 0;
  return idle && *now - l->lastWriteNs < idle;
}

void wroteAt(Lane* l, uint64_t now) {
  if (now) l->lastWriteNs = now;
}

void noteWrite(Lane* l) {
  if (E->directIdleNs.load(std::memory_order_relaxed)) l->lastWriteNs = nowNs();
}

// A protocol thread writes a small submission itself (ioWriteNow): one hand-over less per
// message, and the bytes leave during its turn instead of after the I/O thread's next pass.
// Only where the stream keeps its order without the I/O thread: the caller saw its ring to t
// empty (every earlier submission taken into a lane's queue), and under the lane's lock the
// write queue is empty too, so nothing of the lane waits anywhere. The lock also keeps the I/O
// thread's own syscalls on the socket out while this one runs.
WriteNow writeNow(int port, IoThread* t, tsn_sub_t* s) {
  bool ofi = s->kind == TSN_SUB_OFI_SEND || s->kind == TSN_SUB_OFI_WRITE;
  if (!ofi && (s->kind != TSN_SUB_WRITE || s->inlineLen > TSN_SUB_INLINE)) return WriteNow::kNone;
  Lane* l = laneById(s->lane);
  if (!l || l->port != port || l->t != t || !l->ofi != !ofi) return WriteNow::kNone;
  size_t addr = 0, len = 0;
  // What takeSub would refuse it reports itself, through the I/O thread.
  if (!asSize(s->addr, &addr) || !asSize(s->len, &len) || (len && !addr)) return WriteNow::kNone;
  if (ofi) {
    size_t raddr = 0;
    if (!asSize(s->raddr, &raddr)) return WriteNow::kNone;
    return ofiWriteNow(t, l, s, addr, len, raddr);
  }
  size_t total = s->inlineLen + len;
  if (total == 0) return WriteNow::kNone;
  std::unique_lock<std::mutex> g(l->mu, std::try_to_lock);
  if (!g.owns_lock()) return WriteNow::kNone;  // its I/O thread is at the socket: leave it the write
  if (l->closed || l->quiet || l->closing || l->err || l->fd < 0 || l->head[kW]) return WriteNow::kNone;
  // A lane that wrote a moment ago streams: its I/O thread gathers the frames into fewer sendmsg
  // calls, and this thread's turn stays short.
  uint64_t now;
  if (laneStreams(l, &now)) return WriteNow::kNone;
  iovec v[2];
  int n = 0;
  if (s->inlineLen) v[n++] = {s->inl, s->inlineLen};
  if (len) v[n++] = {reinterpret_cast<void*>(addr), len};
  msghdr m{};
  m.msg_iov = v;
  m.msg_iovlen = n;
  ssize_t r;
  do r = sendmsg(l->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  // A full socket or an error: the I/O thread writes it, or meets the error and fails the lane.
  if (r <= 0) return WriteNow::kNone;
  wroteAt(l, now);
  size_t k = static_cast<size_t>(r);
  if (k == total) return WriteNow::kAll;
  // The rest stays in the record, which the caller publishes next: first of the lane's writes.
  if (k < s->inlineLen) {
    memmove(s->inl, s->inl + k, s->inlineLen - k);
    s->inlineLen = static_cast<uint16_t>(s->inlineLen - k);
  } else {
    k -= s->inlineLen;
    s->inlineLen = 0;
    s->addr = static_cast<double>(addr + k);
    s->len = static_cast<double>(len - k);
  }
  return WriteNow::kPart;
}

void postAdmin(IoThread* t, Admin* a) {
  Admin* head = t->admin.load(std::memory_order_relaxed);
  do a->next = head;
  while (!t->admin.compare_exchange_weak(head, a, std::memory_order_seq_cst, std::memory_order_relaxed));
  wakeThread(t);
}

bool startThreads(int n, double spinUs, double lingerMs, double pollUs, std::string* why) {
  Engine* e = new Engine();
  e->sleeping = new int32_t[kMaxIoThreads]();
  e->lingerNs = static_cast<uint64_t>(lingerMs * 1e6);
  for (int i = 0; i < n; i++) {
    IoThread* t = new IoThread();
    t->index = i;
    t->ep = epoll_create1(EPOLL_CLOEXEC);
    t->ev = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->scratch = new uint8_t[kScratchBytes];
    t->spinNs.store(spinUs > 0 ? static_cast<uint64_t>(spinUs * 1000) : 0, std::memory_order_relaxed);
    t->noWaitNs = static_cast<uint64_t>((pollUs >= 1 ? pollUs : 1) * 1000);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (t->ep < 0 || t->ev < 0 || epoll_ctl(t->ep, EPOLL_CTL_ADD, t->ev, &ev) < 0) {
      int err = errno;
      *why = "epoll/eventfd";  // errno names why
      errno = err;
      return false;  // leaks what was made: the process is out of descriptors anyway
    }
    e->threads.push_back(t);
  }
  // Every thread is made before any runs: one that cannot be made (a container's pids limit,
  // RLIMIT_NPROC) fails ioStart with the reason, and the ones made already end at once. E is
  // published only once all exist, so a later ioStart tries again from nothing. std::thread
  // throws when it cannot: never through the JavaScript that called ioStart (std::terminate).
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int state = 0;  // 0: wait, 1: run, -1: end
  };
  auto* gate = new Gate();  // left to the threads that wait on it: a few bytes, once
  auto open = [gate](int state) {
    std::lock_guard<std::mutex> g(gate->mu);
    gate->state = state;
    gate->cv.notify_all();
  };
  for (IoThread* t : e->threads) {
    try {
      std::thread th([gate, t] {
        int state;
        {
          std::unique_lock<std::mutex> g(gate->mu);
          gate->cv.wait(g, [&] { return gate->state != 0; });
          state = gate->state;
        }
        if (state > 0) threadMain(t);
      });
      t->handle = th.native_handle();
      th.detach();  // lives as long as the process
    } catch (const std::system_error& x) {
      open(-1);
      *why = "cannot start I/O thread " + std::to_string(t->index) + " of " + std::to_string(n);  // errno names why
      for (IoThread* u : e->threads) {
        close(u->ep);
        close(u->ev);
      }
      errno = x.code().value();
      return false;  // the Engine and its threads' structures stay: a thread made may still look at them
    }
  }
  E = e;
  open(1);
  return true;
}

Lane* newLane(int fd, IoThread* t, int port, uint32_t link) {
  Lane* l = new Lane();
  l->fd = fd;
  l->t = t;
  l->port = port;
  l->link = link;
  uint32_t id;
  {
    std::lock_guard<std::mutex> g(E->laneMu);
    if (!E->freeIds.empty()) {
      id = E->freeIds.back();
      E->freeIds.pop_back();
    } else {
      id = E->nextId++;
    }
    uint32_t chunk = id / kLaneChunk;
    if (chunk >= kLaneChunks) {
      delete l;
      return nullptr;
    }
    if (!E->chunks[chunk].load()) {
      Lane** c = new Lane*[kLaneChunk]();
      E->chunks[chunk].store(c, std::memory_order_release);
    }
  }
  l->id = id;
  __atomic_store_n(&E->chunks[id / kLaneChunk].load()[id % kLaneChunk], l, __ATOMIC_RELEASE);
  closedHere().erase(id);  // the calling protocol thread owns a lane with this id again
  return l;
}

Lane* laneOf(uint32_t id) { return laneById(id); }

// Only the protocol thread that owns a lane closes it, and the lane's I/O thread may free it
// at any moment after the close: each protocol thread remembers the ids it closed, so that a
// second close, or any call naming the id, fails without reading freed memory.
std::unordered_set<uint32_t>& closedHere() {
  thread_local std::unordered_set<uint32_t> ids;
  return ids;
}

StuckWatch::StuckWatch() : startNs(nowNs()) {
  if (E)
    for (IoThread* t : E->threads) passes.push_back(t->passes.load(std::memory_order_relaxed));
}

// Inside a provider call now, and no pass finished since the wait began, for at least half the
// link timeout (1 s at least): what ioStalls would call a stall. Such a call may never return
// (docs/ofi-facts.md), so waiting on for the thread only makes the caller hang with it.
bool StuckWatch::stuck(IoThread* t) const {
  if (t->callLane.load(std::memory_order_acquire) == 0) return false;
  uint32_t now = t->passes.load(std::memory_order_relaxed);
  if (t->stuckPass.load(std::memory_order_relaxed) == static_cast<uint64_t>(now) + 1) return true;  // found before, same call
  uint64_t limit = std::max<uint64_t>(1'000'000'000ull, E->lingerNs / 2);
  if (now != passes[t->index] || nowNs() - startNs < limit) return false;
  t->stuckPass.store(static_cast<uint64_t>(now) + 1, std::memory_order_relaxed);
  return true;
}

IoThread* StuckWatch::anyStuck() const {
  if (!E) return nullptr;
  for (IoThread* t : E->threads)
    if (stuck(t)) return t;
  return nullptr;
}

// Waits until the I/O thread of lane has taken every submission the calling protocol thread
// made so far: they are then in the lane's queues, where cancel and close find them. Gives up
// after 10 s, or sooner when the thread is stuck inside a provider call (*stuck then).
bool syncSubs(int port, IoThread* t, bool* stuck) {
  if (stuck) *stuck = false;
  Ring<tsn_sub_t>& ring = E->ports[port].load()->sub[t->index];
  uint32_t tail = ring.hdr->tail;
  if (loadAcquire(&ring.hdr->head) == tail) return true;
  wakeThread(t);
  StuckWatch watch;
  uint64_t until = watch.startNs + 10'000'000'000ull;
  while (loadAcquire(&ring.hdr->head) != tail) {
    if (nowNs() > until) return false;
    if (watch.stuck(t)) {
      if (stuck) *stuck = true;
      return false;
    }
    sched_yield();
  }
  return true;
}

void cancelLane(Lane* l, bool graceful, bool* partial, bool* hard) {
  *partial = false;
  *hard = true;
  if (l->ofi) {
    // An endpoint ends at once: nothing of it is graceful. Its I/O thread holds the lock inside
    // libfabric; a provider can hang there for good (shm, when a peer died holding a lock of
    // theirs: docs/ofi-facts.md): then the endpoint is abandoned rather than the caller hung.
    std::unique_lock<std::mutex> g(l->mu, std::defer_lock);
    StuckWatch watch;
    for (int k = 0; !g.try_lock(); k++) {
      if (k == 5000 || watch.stuck(l->t)) {
        log(kLogWarn, "ofi: lane %u: its I/O thread is stuck inside libfabric; the endpoint is abandoned", l->id);
        if (!l->abandonedOpen.exchange(true)) E->ofiAbandoned.fetch_add(1);
        l->quiet = true;  // without the lock: the I/O thread closes the endpoint itself once it is back (ofiProgress)
        return;
      }
      usleep(1000);
    }
    if (l->closed) return;
    l->quiet = true;
    ofiClose(l);
    l->closed = true;
    return;
  }
  std::lock_guard<std::mutex> g(l->mu);
  if (l->closed) return;
  l->quiet = true;
  // Reads land in memory the caller is about to give back: all go.
  discardOps(l, l->head[kR]);
  l->head[kR] = l->tail[kR] = nullptr;
  // Writes of protocol-owned (inline) bytes may finish; writes of the caller's memory go,
  // unless one is half sent: then the stream cannot end cleanly.
  Op* keep = nullptr;
  Op** tail = &keep;
  for (Op* op = l->head[kW]; op;) {
    Op* next = op->next;
    if (op->ext && op->left < op->total) *partial = true;
    if (op->ext) {
      op->next = l->dead;
      l->dead = op;
    } else {
      *tail = op;
      tail = &op->next;
    }
    op = next;
  }
  *tail = nullptr;
  l->head[kW] = keep;
  l->tail[kW] = nullptr;
  for (Op* op = keep; op; op = op->next) l->tail[kW] = op;
  *hard = !graceful || *partial || l->err || l->fd < 0;
  if (*hard) {
    shutdown(l->fd, SHUT_RDWR);  // the peer sees the end now, even if a forked child holds a dup
    epoll_ctl(l->t->ep, EPOLL_CTL_DEL, l->fd, nullptr);
    close(l->fd);
    l->fd = -1;
    l->closed = true;
    discardOps(l, l->head[kW]);
    l->head[kW] = l->tail[kW] = nullptr;
  } else {
    l->closing = true;
    l->kicks++;  // the caller posts kKick: from now on the I/O thread may finish the close itself
  }
}

void cancelRange(Lane* l, size_t base, size_t len, int* reads, int* writes) {
  std::lock_guard<std::mutex> g(l->mu);
  *reads = *writes = 0;
  auto overlaps = [&](const Op* op) {
    for (int i = 0; i < op->niov; i++) {
      size_t a = reinterpret_cast<size_t>(op->iov[i].iov_base);
      if (op->iov[i].iov_len && a < base + len && base < a + op->iov[i].iov_len) return true;
    }
    return false;
  };
  for (Op* op = l->head[kR]; op; op = op->next)
    if (!op->discard && op->left && overlaps(op)) {
      op->discard = true;  // the rest of its bytes are read and dropped: the stream stays whole
      (*reads)++;
    }
  for (Op* op = l->head[kW]; op; op = op->next)
    if (op->ext && op->left && overlaps(op)) (*writes)++;
}

int engineParkIo() {
  if (!E) return 0;
  g_ioPark.store(true, std::memory_order_seq_cst);
  for (IoThread* t : E->threads) wakeThread(t);
  return static_cast<int>(E->threads.size());
}

bool engineIoParked(int n) { return g_ioParked.load() >= n; }

}  // namespace tsn
