// Prints the C compiler's layout of every record in native/engine/records.h, and its
// constants, as JSON for test/engine/records.test.ts.
#include <stddef.h>
#include <stdio.h>

#include "records.h"

static int first;

static void open_struct(const char* name, size_t size) {
  printf("%s\"%s\":{\"size\":%zu,\"fields\":{", first ? "" : ",", name, size);
  first = 0;
}

#define FIELD(T, f, sep) printf("%s\"%s\":[%zu,%zu]", sep, #f, offsetof(T, f), sizeof(((T*)0)->f))
#define CONST(name, sep) printf("%s\"%s\":%lld", sep, #name, (long long)(name))

int main(void) {
  printf("{\"structs\":{");
  first = 1;
  open_struct("tsn_ring_hdr_t", sizeof(tsn_ring_hdr_t));
  FIELD(tsn_ring_hdr_t, head, "");
  FIELD(tsn_ring_hdr_t, pad0, ",");
  FIELD(tsn_ring_hdr_t, tail, ",");
  FIELD(tsn_ring_hdr_t, pad1, ",");
  FIELD(tsn_ring_hdr_t, mask, ",");
  FIELD(tsn_ring_hdr_t, recordBytes, ",");
  FIELD(tsn_ring_hdr_t, pad2, ",");
  printf("}}");
  open_struct("tsn_sub_t", sizeof(tsn_sub_t));
  FIELD(tsn_sub_t, lane, "");
  FIELD(tsn_sub_t, link, ",");
  FIELD(tsn_sub_t, op, ",");
  FIELD(tsn_sub_t, kind, ",");
  FIELD(tsn_sub_t, inlineLen, ",");
  FIELD(tsn_sub_t, addr, ",");
  FIELD(tsn_sub_t, len, ",");
  FIELD(tsn_sub_t, raddr, ",");
  FIELD(tsn_sub_t, rkeyLo, ",");
  FIELD(tsn_sub_t, rkeyHi, ",");
  FIELD(tsn_sub_t, imm, ",");
  FIELD(tsn_sub_t, flags, ",");
  FIELD(tsn_sub_t, aux, ",");
  FIELD(tsn_sub_t, mr, ",");
  FIELD(tsn_sub_t, inl, ",");
  printf("}}");
  open_struct("tsn_cqe_t", sizeof(tsn_cqe_t));
  FIELD(tsn_cqe_t, link, "");
  FIELD(tsn_cqe_t, op, ",");
  FIELD(tsn_cqe_t, status, ",");
  FIELD(tsn_cqe_t, imm, ",");
  FIELD(tsn_cqe_t, value, ",");
  FIELD(tsn_cqe_t, flags, ",");
  FIELD(tsn_cqe_t, immHi, ",");
  FIELD(tsn_cqe_t, time, ",");
  FIELD(tsn_cqe_t, src, ",");
  FIELD(tsn_cqe_t, pad, ",");
  printf("}}");
  open_struct("tsn_rx_hdr_t", sizeof(tsn_rx_hdr_t));
  FIELD(tsn_rx_hdr_t, written, "");
  FIELD(tsn_rx_hdr_t, pad0, ",");
  FIELD(tsn_rx_hdr_t, consumed, ",");
  FIELD(tsn_rx_hdr_t, pad1, ",");
  FIELD(tsn_rx_hdr_t, stalled, ",");
  FIELD(tsn_rx_hdr_t, capacity, ",");
  FIELD(tsn_rx_hdr_t, pad2, ",");
  printf("}}");
  open_struct("tsn_slot_status_t", sizeof(tsn_slot_status_t));
  FIELD(tsn_slot_status_t, state, "");
  FIELD(tsn_slot_status_t, result, ",");
  FIELD(tsn_slot_status_t, sizes, ",");
  printf("}}},\"consts\":{");
  CONST(TSN_SUB_WRITE, "");
  CONST(TSN_SUB_READ, ",");
  CONST(TSN_SUB_DISCARD, ",");
  CONST(TSN_SUB_RX_RESUME, ",");
  CONST(TSN_SUB_OFI_RECV, ",");
  CONST(TSN_SUB_OFI_SEND, ",");
  CONST(TSN_SUB_OFI_WRITE, ",");
  CONST(TSN_SUB_OFI_READ, ",");
  CONST(TSN_SUB_F_NOCQE, ",");
  CONST(TSN_SUB_F_IMM, ",");
  CONST(TSN_SUB_INLINE, ",");
  CONST(TSN_CQE_RX, ",");
  CONST(TSN_CQE_REMOTE, ",");
  CONST(TSN_CQE_NO_SRC, ",");
  CONST(TSN_CQE_F_SEND, ",");
  CONST(TSN_CQE_F_RECV, ",");
  CONST(TSN_CQE_F_WRITE, ",");
  CONST(TSN_CQE_F_READ, ",");
  CONST(TSN_CQE_F_REMOTE_WRITE, ",");
  CONST(TSN_CQE_F_DATA, ",");
  CONST(TSN_STATUS_OK, ",");
  CONST(TSN_STATUS_EOF, ",");
  CONST(TSN_SLOT_FREE, ",");
  CONST(TSN_SLOT_POSTED, ",");
  CONST(TSN_SLOT_DONE, ",");
  CONST(TSN_SLOT_FAILED, ",");
  CONST(TSN_POST_HEAD, ",");
  CONST(TSN_POST_BUF, ",");
  printf("}}\n");
  return 0;
}
