// The engine's objects, shared by engine.cc (the I/O threads) and engine_js.cc (the functions
// protocol threads call). See engine.cc for who touches what.
#pragma once
#include <pthread.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <string>
#include <thread>
#include <vector>

#include "engine.h"
#include "ring.h"
#include "../wake_delays.h"

namespace tsn {
class OfiEndpoint;
}

namespace tsn {

constexpr int kMaxIoThreads = 64;
constexpr size_t kScratchBytes = 1 << 16;   // where dropped bytes go, per I/O thread
constexpr uint32_t kLaneChunk = 1024;       // lane ids: a table of chunks, never moved
constexpr uint32_t kLaneChunks = 1024;
constexpr uint32_t kSubRecords = 2048;      // submission ring, per protocol and I/O thread
constexpr uint32_t kCqRecords = 4096;       // completion ring, per I/O and protocol thread
enum { kW = 0, kR = 1 };

struct Op {
  Op* next = nullptr;  // free list, lane queue or dead list: one at a time
  uint32_t link = 0, op = 0;
  uint16_t flags = 0;
  uint16_t kind = 0;     // TSN_SUB_*
  bool ext = false;      // names memory the protocol does not own (NCCL's)
  bool discard = false;  // a read whose bytes are dropped
  int niov = 0, cur = 0;
  size_t total = 0, left = 0;
  iovec iov[2];
  uint8_t inl[TSN_SUB_INLINE];
  // libfabric lanes: the peer, the remote side, immediate data, registrations of iov[0], iov[1]
  uint64_t peer = 0, raddr = 0, rkey = 0;
  uint64_t imm = 0;
  uint32_t mr[2] = {0, 0};
};

struct IoThread;

// Memory shared with JavaScript for a comm's life (receive rings, ofiAlloc's buffers): whole
// pages mapped for it, zero-filled by the kernel and resident only once touched, and given back
// to the kernel when freed. From malloc, a freed 256 KiB ring stayed in the allocator's heap
// (glibc raises its mmap threshold to the size of a freed mapping), so a process kept what it
// had freed after closing its comms (docs/performance.md, items 40 and 41).
void* pagesAlloc(size_t bytes);               // nullptr when the kernel refuses (errno set)
void pagesFree(void* p, size_t bytes);

// A control lane's receive ring: the lane and its JavaScript ArrayBuffer each hold one
// reference, and the memory goes with the last (rxRelease). Neither outlives the other's use.
struct RxMem {
  std::atomic<int> refs{2};
  void* mem = nullptr;
  size_t bytes = 0;
};
void rxRelease(RxMem* m);
// JavaScript's reference to a ring: dropped at ioClose (the ArrayBuffer detached then), or when
// V8 collects the ArrayBuffer of a lane never closed from JavaScript, whichever comes first.
struct RxView {
  RxMem* mem = nullptr;
  bool dropped = false;
};

struct Lane {
  uint32_t id = 0;
  int fd = -1;
  IoThread* t = nullptr;
  int port = 0;       // the protocol thread that owns the lane
  uint32_t link = 0;  // its link id, for receive-ring notifications
  std::mutex mu;
  // Under mu:
  bool closed = false;   // the fd is gone
  // The protocol closed the lane: no more completions. Atomic: a close that gives up on an I/O
  // thread stuck inside libfabric sets it without the lane's lock (cancelLane).
  std::atomic<bool> quiet{false};
  // A close gave up on this libfabric lane (cancelLane) and its I/O thread has not closed the
  // endpoint yet: counted in Engine::ofiAbandoned until it does (abandoned(), ofiDelete).
  std::atomic<bool> abandonedOpen{false};
  bool closing = false;  // graceful close: finish inline writes, shut down writing, drain
  uint32_t testStallMs = 0;  // tests only (Admin::kStall with a lane): the next poll sleeps this long first
  int kicks = 0;         // kKick admins posted for it and not yet taken (lock held): it is not freed before
  int err = 0;           // the lane failed: every op completes with this status
  bool eof = false;      // the peer ended the stream
  Op* head[2] = {nullptr, nullptr};  // per direction (kW, kR): FIFO
  Op* tail[2] = {nullptr, nullptr};
  Op* dead = nullptr;    // cancelled ops, recycled by the I/O thread
  uint64_t lastWriteNs = 0;  // when bytes last left (a libfabric lane: a send or write was posted), while
                             // E->directIdleNs is set; 0: never
  // libfabric lanes: an RDM endpoint in place of the socket, and posts waiting for room (FI_EAGAIN)
  OfiEndpoint* ofi = nullptr;
  Op* ofiHead = nullptr;
  Op* ofiTail = nullptr;
  uint32_t ofiQueuedRecvs = 0;  // receives among them (ofiProgress posts them past a full send queue)
  int ofiErrors = 0;         // failed completions so far (the first ones are logged)
  bool ofiNoWait = false;    // no wait fd: its thread must poll it (I/O thread only)
  bool ofiBell = false;      // of those, one with a doorbell its peers ring (I/O thread only)
  uint32_t spinGroup = 0;    // the rails of one endpoint share their busy-poll window (ofiRail); set before kAddOfi
  std::string ofiLastError;  // the provider's words for the last one
  uint8_t* rx = nullptr;  // control lanes: the receive ring (rxMem), shared with its JavaScript ArrayBuffer
  tsn_rx_hdr_t* rxHdr = nullptr;
  struct RxMem* rxMem = nullptr;
  struct RxView* rxView = nullptr;  // control lanes: JavaScript's hold on rxMem (its protocol thread only)
  void* rxRef = nullptr;            // napi_ref: a weak reference to that ArrayBuffer (its protocol thread only)
  uint32_t rxCap = 0;
  bool rxStalled = false;  // the ring was full: no read until RX_RESUME (I/O thread only)
  // I/O thread only:
  bool listed = false;  // in the thread's run list
  bool hup = false;     // epoll reported the peer's end or an error: read until EAGAIN or 0
  bool shutWr = false;
  uint64_t lingerUntil = 0;
};

// Rare messages to an I/O thread (MPSC stack): a hard-closed lane to free, a lane to look at.
struct Admin {
  enum Kind { kRetire, kKick, kAddOfi, kStall };
  Admin* next = nullptr;
  Kind kind;
  Lane* lane;
  // kStall (tests only): the thread sleeps this long as if inside a provider call; with a lane
  // (an endpoint), inside that lane's next poll, its lock held (Lane::testStallMs).
  uint32_t ms = 0;
};

// What a provider call an I/O thread is inside of does (IoThread::call), for ioStalls.
enum class IoCall : uint32_t { kNone = 0, kPost, kPoll, kCudaContext, kTest };

struct IoThread {
  int index = 0;
  int ep = -1, ev = -1;
  pthread_t handle{};
  std::atomic<Admin*> admin{nullptr};
  std::vector<Lane*> run;        // lanes with work (I/O thread only)
  std::vector<Lane*> lingering;  // closing lanes waiting for the peer's end
  std::vector<Lane*> graveyard;  // freed before the next epoll_wait
  std::vector<Lane*> ofi;        // libfabric lanes: polled every pass
  int cudaDevice = -1;           // the GPU whose primary context this thread made current (-1: none)
  int ofiNoWait = 0;             // of those, lanes without a wait fd: the thread never blocks long
  int ofiBells = 0;              // of those, lanes with a doorbell (OfiEndpoint::bellFd)
  bool bellsArmed = false;       // their bells are armed, and no ring was heard since
  bool ofiActive = false;        // this pass found completions on them: activity, like a submission
  // Passes this thread polled on in a busy-poll window that only another rail of one of its
  // endpoints kept open (its own work older than the window), and that only another endpoint's
  // work kept open (its own within kBorrowNs): ioSpinShared, for tests.
  std::atomic<uint64_t> sharedSpins{0};
  std::atomic<uint64_t> borrowedSpins{0};
  Op* freeOps = nullptr;
  std::vector<tsn_cqe_t> out[kMaxPorts];  // completions of this pass, per protocol thread
  std::atomic<uint64_t> spinNs{0};  // after work, poll this long before sleeping (TSNET_SPIN_US; ioSetSpin)
  WakeDelays wakes;     // how late it woke when asked to (ioWakes, TSNET_STATS)
  uint64_t noWaitNs = 50000;  // sleep between polls of endpoints without a wait fd, after activity (TSNET_OFI_POLL_US)
  uint8_t* scratch = nullptr;
  // A call into libfabric (or CUDA) may never return (docs/ofi-facts.md). The thread counts its
  // passes and says which lane's call it is inside of; ioStalls samples both.
  std::atomic<uint32_t> passes{0};
  std::atomic<uint32_t> callLane{0};  // 0: in no such call
  std::atomic<uint32_t> call{0};      // IoCall
  // ioStalls' view (under Engine::stallMu): the passes last seen and since when, reported yet.
  uint32_t seenPasses = 0;
  uint64_t seenSinceNs = 0;
  bool stallReported = false;
  // Found stuck inside a provider call (by ioStalls or a StuckWatch): its pass count then, plus
  // one; 0: never. Later waits give up at once while it is still in that pass.
  std::atomic<uint64_t> stuckPass{0};
};

// Marks the calling I/O thread as inside a provider call of lane l for its scope.
class InCall {
 public:
  InCall(IoThread* t, uint32_t lane, IoCall what) : t_(t) {
    t_->call.store(static_cast<uint32_t>(what), std::memory_order_relaxed);
    t_->callLane.store(lane, std::memory_order_release);
  }
  ~InCall() { t_->callLane.store(0, std::memory_order_release); }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;

 private:
  IoThread* t_;
};

// One protocol thread's rings: a submission ring to and a completion ring from each I/O thread.
struct Port {
  Ring<tsn_sub_t> sub[kMaxIoThreads];
  Ring<tsn_cqe_t> cq[kMaxIoThreads];
  // Early wake-ups (TSNET_EARLY_WAKE, engine_js.cc): the fds whose readiness also wakes this
  // protocol thread, one-shot entries of an epoll set its event loop watches. Its thread only.
  struct Watch {
    uint32_t lane;
    int fd;
  };
  int watchEp = -1;
  std::vector<Watch> watched;
};

struct Engine {
  std::vector<IoThread*> threads;
  std::atomic<Port*> ports[kMaxPorts] = {};
  int32_t* sleeping = nullptr;  // per I/O thread, shared with JavaScript: 1 = wake me
  uint64_t lingerNs = 0;        // how long a closing lane waits for the peer's end
  // writeNow: a lane that wrote (or posted a send or write) less than this long ago is left to
  // its I/O thread, which gathers a stream's frames; 0: no such rule (TSNET_DIRECT_SEND_IDLE_US)
  std::atomic<uint64_t> directIdleNs{0};
  std::atomic<bool> trace{false};
  std::atomic<bool> earlyWake{false};  // TSNET_EARLY_WAKE (ioSetEarlyWake)
  std::atomic<int> ofiAbandoned{0};    // libfabric lanes whose close gave up, endpoint not yet closed
  std::mutex laneMu;
  std::vector<uint32_t> freeIds;
  uint32_t nextId = 1;
  std::atomic<Lane**> chunks[kLaneChunks] = {};
  std::mutex stallMu;  // ioStalls' sampling
};
extern Engine* E;

// engine_js.cc: early wake-ups, on the protocol thread that owns the lane
void watchLane(Lane* l, int fd);  // right after making it: fd's readiness wakes the thread too
void unwatchLane(Lane* l);        // before closing it

// engine.cc
uint64_t nowNs();  // CLOCK_MONOTONIC
bool startThreads(int n, double spinUs, double lingerMs, double pollUs, std::string* why);
void emit(IoThread* t, int port, uint32_t link, uint32_t op, int status, double value, uint64_t imm = 0,
          uint32_t flags = 0, uint32_t src = TSN_CQE_NO_SRC);
Op* allocOp(IoThread* t);
void freeOp(IoThread* t, Op* op);
void listLane(IoThread* t, Lane* l);
void retireNow(IoThread* t, Lane* l);
// engine_ofi.cc (libfabric lanes; the caller holds the lane's lock where it says so)
void ofiTake(IoThread* t, Lane* l, Op* op);          // queue a post (lock held)
bool ofiProgress(IoThread* t, Lane* l);              // post what waits, poll; true: work remains (lock held); sets t->ofiActive on completions
void ofiClose(Lane* l, bool drainFirst = true);      // close the endpoint, drop every op (lock held)
void ofiDelete(Lane* l);                             // the lane is freed: its endpoint goes
void ofiRelease(Op* op);                             // an op leaves: its registrations' counts drop
bool ofiMayBlock(IoThread* t);                       // every endpoint agrees to sleep (fi_trywait)
// Doorbells (endpoints without a wait fd, native/ofi/ofi_bell.cc). The epoll entry of a bell
// carries its lane's pointer with kBellTag set.
constexpr uint64_t kBellTag = 1;
bool ofiBellsCover(IoThread* t);                     // the thread may sleep on its bells: see engine_ofi.cc
void ofiArmBells(IoThread* t, bool arm);             // arms (or disarms) every bell of the thread
void ofiBellHeard(Lane* l);                          // reads what rang l's bell
void ofiRegister(napi_env env, napi_value exports);  // ofiOpen, ofiRail, ofiInsertPeer, ofiRegMr, ...
Lane* newLane(int fd, IoThread* t, int port, uint32_t link);
Lane* laneOf(uint32_t id);
// Ids of the lanes the calling protocol thread closed (ioClose) and has not got back from
// newLane since: their memory may be gone, so nothing may read it (ownLane, ownOfiLane).
std::unordered_set<uint32_t>& closedHere();
void wakeThread(IoThread* t);
// A protocol thread writing its own submission s (unpublished, in its ring to t) at once:
// kNone: nothing written; kPart: part written, s now names the rest; kAll: all written.
enum class WriteNow { kNone, kPart, kAll };
WriteNow writeNow(int port, IoThread* t, tsn_sub_t* s);
// The same for a libfabric lane's send or write with immediate data (engine_ofi.cc): an inject,
// so never kPart. addr, len, raddr: s's, checked by writeNow.
WriteNow ofiWriteNow(IoThread* t, Lane* l, tsn_sub_t* s, size_t addr, size_t len, size_t raddr);
// The rule of TSNET_DIRECT_SEND_IDLE_US (E->directIdleNs), lane lock held. laneStreams: whether l
// wrote too recently to be written on a protocol thread; *now is the time to stamp with
// wroteAt if it then writes (0 without the rule). noteWrite: bytes left l now (the I/O thread's
// write, or a libfabric send or write it posted).
bool laneStreams(const Lane* l, uint64_t* now);
void wroteAt(Lane* l, uint64_t now);
void noteWrite(Lane* l);
void postAdmin(IoThread* t, Admin* a);
// What a protocol thread waiting on I/O threads checks: whether one of them has been inside one
// provider call, without finishing a pass, since the wait began and for a stall's time.
struct StuckWatch {
  uint64_t startNs;
  std::vector<uint32_t> passes;  // per I/O thread, when the wait began
  StuckWatch();
  bool stuck(IoThread* t) const;
  IoThread* anyStuck() const;
};
bool syncSubs(int port, IoThread* t, bool* stuck = nullptr);
void cancelLane(Lane* l, bool graceful, bool* partial, bool* hard);
void cancelRange(Lane* l, size_t base, size_t len, int* reads, int* writes);

}  // namespace tsn
