// Native objects shared by the core (NCCL's threads), the host and the binding (plugin thread).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "engine/records.h"
#include "generated/tsnet_abi.h"

namespace tsn {

// Every handle given to NCCL starts with one of these, so a stale or foreign pointer is caught.
enum Magic : uint32_t {
  kMagicCtx = 0x7473'6378,     // "tscx"
  kMagicListen = 0x7473'6c73,  // "tsls"
  kMagicSend = 0x7473'7364,    // "tssd"
  kMagicRecv = 0x7473'7276,    // "tsrv"
  kMagicMr = 0x7473'6d72,      // "tsmr"
  kMagicRequest = 0x7473'7271, // "tsrq"
  kMagicDead = 0xdead'beef,
};

enum SlotState : int { kFree = TSN_SLOT_FREE, kPosted = TSN_SLOT_POSTED, kDone = TSN_SLOT_DONE, kFailed = TSN_SLOT_FAILED };
enum OpKind : int { kOpSend = 1, kOpRecv = 2, kOpFlush = 3 };

// Request slots per comm: NCCL keeps up to 32 requests in flight, a sender up to 32 x maxRecvs.
constexpr int kSlotsPerComm = TSN_MAX_REQUESTS * TSN_MAX_RECVS;

struct Comm;

struct Ctx {
  uint32_t magic;  // kMagicCtx
  uint32_t jsId;   // the plugin's context id
  // setNetAttr: the hints last handed to the plugin. NCCL passes the same hints again for
  // every operation it plans (22,000 calls a rank bringing up 48 communicators of 32
  // channels under PyTorch, each a hand-over to protocol thread 0): only new ones go.
  std::mutex attrMu;
  bool hasAttr;
  tsn_net_attr_t attr;
};

struct ListenComm {
  uint32_t magic;  // kMagicListen
  uint32_t jsId;   // the plugin's listener id
  int thread;      // the protocol thread that runs it (and the comms it accepts)
  Ctx* ctx;        // the context it was made in (finalize retires it)
};

struct Mr {
  uint32_t magic;  // kMagicMr
  uint32_t jsId;   // the plugin's region id
  char* base;      // first byte NCCL registered
  size_t size;     // bytes registered
  Comm* comm;      // comm it was registered on
  void* jsBuffer;  // napi_ref to the external ArrayBuffer (detached at deregMr)
};

// One buffer of a posted operation, resolved inside its registered region.
struct Buf {
  uint32_t mrId;    // region id, 0 when size is 0 and no region was given
  int tag;          // NCCL's tag (the peer rank)
  uint64_t offset;  // from the region's base
  uint64_t size;    // bytes to send, or room to receive
};  // 24 bytes: one in each of a comm's 256 request slots, 8 in each of its 32 groups
static_assert(sizeof(Buf) == 24, "Buf has no padding");

// A request slot: the pointer NCCL holds between isend/irecv/iflush and the test that ends it.
// Its state lives in the comm's status array, which the protocol thread writes.
struct Request {
  uint32_t magic;  // kMagicRequest
  Request* next;   // link in the post queue
  Comm* comm;      // owner
  uint16_t index;  // position in the owner's pool (and its status)
  int op;          // OpKind
  int n;           // buffers in the operation
  int group;       // the owner's group of buffers it holds (n > 1), else -1
  double postedUs; // when NCCL posted it (TSNET_TRACE), else 0
  bool warmup;     // posted by the warm-up at init (warmup.cc), not by NCCL
  Buf one;         // the buffer of an operation of one
  Buf* bufs;       // what was posted: &one, or the group's buffers
};

// Groups of buffers for receives and flushes of more than one buffer: NCCL keeps at most
// TSN_MAX_REQUESTS requests in flight per comm, so as many groups serve every slot (8 buffers
// in each of the 256 slots took 48 KiB per comm; docs/performance.md, item 39).
constexpr int kGroups = TSN_MAX_REQUESTS;
static_assert(kGroups <= 32, "the free groups are the bits of one word");

struct Comm {
  uint32_t magic;   // kMagicSend or kMagicRecv
  uint32_t jsId;    // the plugin's comm id
  uint32_t cursor;  // where the next free-slot search starts
  int thread;       // the protocol thread that runs it
  Ctx* ctx;         // the context it was made in (finalize retires it)
  alignas(64) tsn_slot_status_t status[kSlotsPerComm];  // shared with that thread
  Request slots[kSlotsPerComm];
  uint32_t groupsFree;                  // bit g: groups[g] is free (atomic: taken at a post, freed at its test)
  Buf groups[kGroups][TSN_MAX_RECVS];  // buffers of the requests of more than one
};

inline int slotState(const Comm* c, int i) { return __atomic_load_n(&c->status[i].state, __ATOMIC_ACQUIRE); }

// Logging through NCCL's logger (or stderr before one is known, only for WARN).
void setLogger(tsn_logger_t logger);
void log(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void logMessage(int level, unsigned long flags, const char* msg);
constexpr int kLogWarn = 2, kLogInfo = 3, kLogTrace = 5;
constexpr unsigned long kSubsysInit = 1, kSubsysNet = 16;

}  // namespace tsn
