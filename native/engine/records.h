// Records shared in memory between the protocol threads (JavaScript) and native threads.
// plugin/engine/records.ts mirrors every offset; test/engine/records.test.ts compiles this
// header and compares the two. All integers are little-endian; counters wrap at 2^32.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define TSN_REC_ASSERT static_assert
extern "C" {
#else
#define TSN_REC_ASSERT _Static_assert
#endif

// A single-producer single-consumer ring of fixed-size records. The producer owns tail, the
// consumer owns head; each lives on its own cache line. The records follow the header.
typedef struct tsn_ring_hdr {
  uint32_t head;         // records consumed (consumer writes, release)
  uint32_t pad0[15];
  uint32_t tail;         // records produced (producer writes, release)
  uint32_t pad1[15];
  uint32_t mask;         // capacity - 1 (capacity is a power of two)
  uint32_t recordBytes;  // size of one record
  uint32_t pad2[14];
} tsn_ring_hdr_t;

// What a protocol thread asks an I/O thread to do (submission ring, protocol thread -> I/O thread).
enum {
  TSN_SUB_WRITE = 1,      // send inl[0..inlineLen) then [addr, addr+len) on the lane, after its earlier writes
  TSN_SUB_READ = 2,       // fill [addr, addr+len) from the lane, after its earlier reads
  TSN_SUB_DISCARD = 3,    // read len bytes from the lane and drop them
  TSN_SUB_RX_RESUME = 4,  // the lane's receive ring has room again: read on
  // libfabric lanes (an RDM endpoint): aux = peer (fi_addr), mr = registration of the payload
  TSN_SUB_OFI_RECV = 16,   // fi_recv into [addr, addr+len)
  TSN_SUB_OFI_SEND = 17,   // fi_sendmsg of [raddr, raddr+rkeyLo) (registration rkeyHi; rkeyLo 0:
                           // none) then [addr, addr+len), imm if F_IMM
  TSN_SUB_OFI_WRITE = 18,  // fi_writedata (F_IMM) or fi_write of [addr, addr+len) to raddr/rkey
  TSN_SUB_OFI_READ = 19,   // fi_read of the peer's raddr/rkey into [addr, addr+len)
};  // lanes are closed by ioClose (engine_js.cc), not by a submission
enum {
  TSN_SUB_F_NOCQE = 1,  // no completion record (writes of protocol-owned bytes)
  TSN_SUB_F_IMM = 2,    // libfabric lanes: imm is sent as remote CQ data
};
#define TSN_SUB_INLINE 32

typedef struct tsn_sub {
  uint32_t lane;       // engine lane id
  uint32_t link;       // the protocol thread's link id, echoed in the completion
  uint32_t op;         // the protocol's operation token, echoed in the completion
  uint16_t kind;       // TSN_SUB_*
  uint16_t inlineLen;  // bytes of inl[] written before the payload
  double addr;         // payload address (exact below 2^53)
  double len;          // payload bytes
  double raddr;        // remote address (RDMA transports)
  uint32_t rkeyLo;     // remote key, low and high halves (RDMA transports)
  uint32_t rkeyHi;
  uint32_t imm;        // immediate data (RDMA transports)
  uint32_t flags;      // TSN_SUB_F_*
  uint32_t aux;        // libfabric lanes: the peer (fi_addr from ofiInsertPeer)
  uint32_t mr;         // libfabric lanes: the payload's registration (ofiRegMr), 0: none
  uint8_t inl[TSN_SUB_INLINE];  // inline bytes (a frame header); libfabric lanes: the immediate
                                // data's high 32 bits in inl[0..4) (providers with 8 bytes of it)
} tsn_sub_t;

// A finished operation or an arrival (completion ring, I/O thread -> protocol thread).
#define TSN_CQE_RX 0xffffffffu      // op of a receive-ring notification: value = bytes written so far
#define TSN_CQE_REMOTE 0xfffffffeu  // op of a peer's remote write with immediate data (libfabric lanes)
enum { TSN_STATUS_OK = 0, TSN_STATUS_EOF = -1000 };  // else -errno (a closed or cancelled lane's ops complete with nothing)

typedef struct tsn_cqe {
  uint32_t link;   // as submitted
  uint32_t op;     // as submitted, or TSN_CQE_RX / TSN_CQE_REMOTE
  int32_t status;  // TSN_STATUS_OK, TSN_STATUS_EOF or -errno
  uint32_t imm;    // immediate data (libfabric lanes, with TSN_CQE_F_DATA)
  double value;    // bytes moved; for TSN_CQE_RX the lane's receive counter
  uint32_t flags;  // libfabric lanes: TSN_CQE_F_*
  uint32_t immHi;  // libfabric lanes: the immediate data's high 32 bits
  double time;     // completion time in microseconds (CLOCK_MONOTONIC) when tracing, else 0
  uint32_t src;    // libfabric lanes with FI_SOURCE: the sender (fi_addr) of a message or remote
                   // write; TSN_CQE_NO_SRC when not known
  uint32_t pad;
} tsn_cqe_t;
#define TSN_CQE_NO_SRC 0xffffffffu
enum {
  TSN_CQE_F_SEND = 1,
  TSN_CQE_F_RECV = 2,
  TSN_CQE_F_WRITE = 4,
  TSN_CQE_F_READ = 8,
  TSN_CQE_F_REMOTE_WRITE = 16,
  TSN_CQE_F_DATA = 32,  // imm holds remote CQ data
};

// The header of a control lane's receive ring (a byte ring the I/O thread fills).
typedef struct tsn_rx_hdr {
  uint32_t written;   // bytes received so far (I/O thread writes, release)
  uint32_t pad0[15];
  uint32_t consumed;  // bytes the protocol is done with (protocol thread writes, release)
  uint32_t pad1[15];
  uint32_t stalled;   // stalls so far: when it moved, the I/O thread waits for room (send RX_RESUME)
  uint32_t capacity;  // bytes in the ring (a power of two)
  uint32_t pad2[14];
} tsn_rx_hdr_t;

// The state of one request slot, written by the protocol thread and read by test().
enum { TSN_SLOT_FREE = 0, TSN_SLOT_POSTED = 1, TSN_SLOT_DONE = 2, TSN_SLOT_FAILED = 3 };
typedef struct tsn_slot_status {
  int32_t state;     // TSN_SLOT_*; DONE and FAILED are stored last, with release order
  int32_t result;    // tsn_result_t once failed
  int32_t sizes[8];  // completed sizes: n for a receive, 1 for a send
} tsn_slot_status_t;

// Records of the posted-request mailbox (native -> protocol thread), in doubles.
#define TSN_POST_HEAD 7  // op, comm, slot, n, posted-at us (tracing), taken-at us (tracing), 1 if the warm-up posted it
#define TSN_POST_BUF 4   // per buffer: region id, offset, size, tag

TSN_REC_ASSERT(sizeof(tsn_ring_hdr_t) == 192, "tsn_ring_hdr_t size");
TSN_REC_ASSERT(offsetof(tsn_ring_hdr_t, tail) == 64, "tsn_ring_hdr_t.tail");
TSN_REC_ASSERT(offsetof(tsn_ring_hdr_t, mask) == 128, "tsn_ring_hdr_t.mask");
TSN_REC_ASSERT(sizeof(tsn_sub_t) == 96, "tsn_sub_t size");
TSN_REC_ASSERT(offsetof(tsn_sub_t, addr) == 16, "tsn_sub_t.addr");
TSN_REC_ASSERT(offsetof(tsn_sub_t, inl) == 64, "tsn_sub_t.inl");
TSN_REC_ASSERT(sizeof(tsn_cqe_t) == 48, "tsn_cqe_t size");
TSN_REC_ASSERT(offsetof(tsn_cqe_t, src) == 40, "tsn_cqe_t.src");
TSN_REC_ASSERT(sizeof(tsn_rx_hdr_t) == 192, "tsn_rx_hdr_t size");
TSN_REC_ASSERT(sizeof(tsn_slot_status_t) == 40, "tsn_slot_status_t size");

#ifdef __cplusplus
}
#endif
