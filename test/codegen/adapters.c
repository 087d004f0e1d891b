/* Calls through every version's generated table (native/generated/tsnet_tables.c) into a fake
 * core (fake_core.c) and checks what arrives. Prints one FAIL line per failed check; exit 1 if any. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "abi_members.h"
#include "fake_core.h"

extern const tsn_net_v6_t ncclNetPlugin_v6;
extern const tsn_net_v7_t ncclNetPlugin_v7;
extern const tsn_net_v8_t ncclNetPlugin_v8;
extern const tsn_net_v9_t ncclNetPlugin_v9;
extern const tsn_net_v10_t ncclNetPlugin_v10;
extern const tsn_net_v11_t ncclNetPlugin_v11;
extern const tsn_net_v12_t ncclNetPlugin_v12;

static int checks, failures;
#define CHECK(cond) do { checks++; if (!(cond)) { failures++; printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
/* Checks the fake core saw `fn` as a new call. */
#define CALLED(fn_) do { CHECK(fake.calls == calls0 + 1); CHECK(fake.fn != NULL && strcmp(fake.fn, fn_) == 0); } while (0)
#define T(v) ncclNetPlugin_v##v

/* Distinct addresses to pass around. */
static char a_[1], b_[1], c_[1], d_[1], e_[1], f_[1];
#define A ((void*)a_)
#define B ((void*)b_)
#define C ((void*)c_)
#define D ((void*)d_)
#define E ((void*)e_)
#define F ((void*)f_)
static void* slot;
static tsn_dev_handle_t* devh;
static tsn_comm_config_t config = {7};
static tsn_net_attr_t attr;
static int ints[TSN_MAX_RECVS], done;
static size_t wide[TSN_MAX_RECVS] = {1, 2, 3};

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level, (void)flags, (void)file, (void)line, (void)fmt;
}
static tsn_result_t prof(void** eHandle, int type, void* phandle, int64_t pluginId, void* extData) {
  (void)eHandle, (void)type, (void)phandle, (void)pluginId, (void)extData;
  return TSN_SUCCESS;
}

/* name is "tsnet"; a slot is NULL exactly when tsnet leaves it unimplemented. */
static void check_slot(const char* table, const char* name, int is_null) {
  const char* unimplemented[] = {"getDeviceMr", "irecvConsumed", "makeVDevice"};
  int want_null = 0;
  for (size_t i = 0; i < sizeof(unimplemented) / sizeof(unimplemented[0]); i++) want_null |= !strcmp(name, unimplemented[i]);
  checks++;
  if (is_null != want_null) failures++, printf("FAIL %s.%s is %sNULL\n", table, name, is_null ? "" : "not ");
}
#define SLOT(tbl, m) check_slot(#tbl, #m, tbl.m == NULL);
static void test_slots(void) {
  TABLE_V6(SLOT, T(6)) TABLE_V7(SLOT, T(7)) TABLE_V8(SLOT, T(8)) TABLE_V9(SLOT, T(9))
  TABLE_V10(SLOT, T(10)) TABLE_V11(SLOT, T(11)) TABLE_V12(SLOT, T(12))
  CHECK(!strcmp(T(6).name, "tsnet") && !strcmp(T(7).name, "tsnet") && !strcmp(T(8).name, "tsnet"));
  CHECK(!strcmp(T(9).name, "tsnet") && !strcmp(T(10).name, "tsnet") && !strcmp(T(11).name, "tsnet"));
  CHECK(!strcmp(T(12).name, "tsnet"));
}

/* init: v6-v9 (logger), v10 + prof, v11+ ctx, commId and config too. */
#define INIT_LEGACY(v) do { int calls0 = fake.calls; fake.prof = prof; fake.ctxOut = &slot, fake.commId = 9, fake.config = &config; \
  CHECK(T(v).init(logger) == TSN_SUCCESS); CALLED("init"); \
  CHECK(fake.logger == logger && fake.prof == NULL && fake.ctxOut == (void**)TSN_NO_CTX && fake.commId == 0 && fake.config == NULL); } while (0)
#define INIT_V11(v) do { int calls0 = fake.calls; \
  CHECK(T(v).init(&slot, 0x1234567890abcdefULL, &config, logger, prof) == TSN_SUCCESS); CALLED("init"); \
  CHECK(fake.ctxOut == &slot && fake.commId == 0x1234567890abcdefULL && fake.config == &config); \
  CHECK(fake.logger == logger && fake.prof == prof); } while (0)
static void test_init(void) {
  INIT_LEGACY(6); INIT_LEGACY(7); INIT_LEGACY(8); INIT_LEGACY(9);
  int calls0 = fake.calls;
  fake.ctxOut = &slot, fake.config = &config;
  CHECK(T(10).init(logger, prof) == TSN_SUCCESS);
  CALLED("init");
  CHECK(fake.logger == logger && fake.prof == prof && fake.ctxOut == (void**)TSN_NO_CTX && fake.config == NULL && fake.commId == 0);
  INIT_V11(11); INIT_V11(12);
}

/* listen / connect / accept: legacy versions pass ctx = NULL (and config / devComm where they lack it). */
#define LISTEN_LEGACY(v) do { int calls0 = fake.calls; fake.ctx = A; CHECK(T(v).listen(3, B, &slot) == TSN_SUCCESS); \
  CALLED("listen"); CHECK(fake.ctx == NULL && fake.dev == 3 && fake.handle == B && fake.commOut == &slot); } while (0)
#define LISTEN_V11(v) do { int calls0 = fake.calls; CHECK(T(v).listen(A, 4, B, &slot) == TSN_SUCCESS); \
  CALLED("listen"); CHECK(fake.ctx == A && fake.dev == 4 && fake.handle == B && fake.commOut == &slot); } while (0)
#define CONNECT_V7(v) do { int calls0 = fake.calls; fake.ctx = A, fake.config = &config; \
  CHECK(T(v).connect(5, B, &slot, &devh) == TSN_SUCCESS); CALLED("connect"); \
  CHECK(fake.ctx == NULL && fake.config == NULL && fake.dev == 5 && fake.handle == B && fake.commOut == &slot && fake.devComm == &devh); } while (0)
#define CONNECT_V11(v) do { int calls0 = fake.calls; fake.config = &config; \
  CHECK(T(v).connect(A, 6, B, &slot, &devh) == TSN_SUCCESS); CALLED("connect"); \
  CHECK(fake.ctx == A && fake.config == NULL && fake.dev == 6 && fake.handle == B && fake.commOut == &slot && fake.devComm == &devh); } while (0)
#define ACCEPT_V7(v) do { int calls0 = fake.calls; CHECK(T(v).accept(A, &slot, &devh) == TSN_SUCCESS); \
  CALLED("accept"); CHECK(fake.comm == A && fake.commOut == &slot && fake.devComm == &devh); } while (0)
static void test_connections(void) {
  LISTEN_LEGACY(6); LISTEN_LEGACY(7); LISTEN_LEGACY(8); LISTEN_LEGACY(9); LISTEN_LEGACY(10);
  LISTEN_V11(11); LISTEN_V11(12);
  int calls0 = fake.calls;
  fake.ctx = A, fake.config = &config, fake.devComm = &devh;
  CHECK(T(6).connect(2, B, &slot) == TSN_SUCCESS);
  CALLED("connect");
  CHECK(fake.ctx == NULL && fake.config == NULL && fake.devComm == NULL && fake.dev == 2 && fake.handle == B);
  CONNECT_V7(7); CONNECT_V7(8); CONNECT_V7(9);
  calls0 = fake.calls;
  fake.ctx = A;
  CHECK(T(10).connect(1, &config, B, &slot, &devh) == TSN_SUCCESS);
  CALLED("connect");
  CHECK(fake.ctx == NULL && fake.config == &config && fake.dev == 1 && fake.handle == B && fake.devComm == &devh);
  CONNECT_V11(11); CONNECT_V11(12);
  calls0 = fake.calls;
  fake.devComm = &devh;
  CHECK(T(6).accept(A, &slot) == TSN_SUCCESS);
  CALLED("accept");
  CHECK(fake.comm == A && fake.commOut == &slot && fake.devComm == NULL);
  ACCEPT_V7(7); ACCEPT_V7(8); ACCEPT_V7(9); ACCEPT_V7(10); ACCEPT_V7(11); ACCEPT_V7(12);
}

/* regMr: int size (v6-v7) arrives as size_t; size_t (v8+) as is. */
#define REGMR(v, size_) do { int calls0 = fake.calls; CHECK(T(v).regMr(A, B, size_, TSN_PTR_HOST, &slot) == TSN_SUCCESS); \
  CALLED("reg_mr"); CHECK(fake.comm == A && fake.data == B && fake.size == (size_t)(size_) && fake.type == TSN_PTR_HOST && fake.mhandleOut == &slot); } while (0)
/* regMrDmaBuf: the same signature in every version, passed through as is. */
#define REGDMABUF(v) do { int calls0 = fake.calls; \
  CHECK(T(v).regMrDmaBuf(A, B, (size_t)1 << 33, TSN_PTR_CUDA, 0x123456789ULL, 77, &slot) == TSN_SUCCESS); CALLED("reg_mr_dma_buf"); \
  CHECK(fake.comm == A && fake.data == B && fake.size == (size_t)1 << 33 && fake.type == TSN_PTR_CUDA && fake.offset == 0x123456789ULL && \
        fake.fd == 77 && fake.mhandleOut == &slot); } while (0)
#define DEREG(v) do { int calls0 = fake.calls; CHECK(T(v).deregMr(A, B) == TSN_SUCCESS); CALLED("dereg_mr"); \
  CHECK(fake.comm == A && fake.mhandle == B); } while (0)
static void test_memory(void) {
  REGMR(6, INT_MAX); REGMR(7, 1000);
  REGMR(8, (size_t)1 << 40); REGMR(9, 1); REGMR(10, 2); REGMR(11, 3); REGMR(12, (size_t)1 << 33);
  REGDMABUF(6); REGDMABUF(7); REGDMABUF(8); REGDMABUF(9); REGDMABUF(10); REGDMABUF(11); REGDMABUF(12);
  DEREG(6); DEREG(7); DEREG(8); DEREG(9); DEREG(10); DEREG(11); DEREG(12);
}

/* isend: int size (v6-v8) arrives as size_t, phandle NULL before v10. */
#define ISEND_OLD(v, size_) do { int calls0 = fake.calls; fake.phandle = F; \
  CHECK(T(v).isend(A, B, size_, 42, C, &slot) == TSN_SUCCESS); CALLED("isend"); \
  CHECK(fake.comm == A && fake.data == B && fake.size == (size_t)(size_) && fake.tag == 42 && fake.mhandle == C && fake.phandle == NULL && fake.request == &slot); } while (0)
#define ISEND_V10(v) do { int calls0 = fake.calls; CHECK(T(v).isend(A, B, (size_t)1 << 35, 43, C, D, &slot) == TSN_SUCCESS); \
  CALLED("isend"); CHECK(fake.size == (size_t)1 << 35 && fake.tag == 43 && fake.mhandle == C && fake.phandle == D && fake.request == &slot); } while (0)
static void test_isend(void) {
  ISEND_OLD(6, 1000); ISEND_OLD(7, INT_MAX); ISEND_OLD(8, 65536); ISEND_OLD(9, (size_t)1 << 34);
  ISEND_V10(10); ISEND_V10(11); ISEND_V10(12);
}

/* irecv: int sizes (v6-v8) arrive converted; n outside 0..TSN_MAX_RECVS reaches the core (which rejects it with a WARN) without sizes. */
#define IRECV_OLD(v) do { int sizes[TSN_MAX_RECVS + 1] = {10, 20, INT_MAX, 40, 50, 60, 70, 80, 90}; int calls0 = fake.calls; \
  fake.phandles = &slot; \
  CHECK(T(v).irecv(A, 3, (void**)B, sizes, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.comm == A && fake.n == 3 && fake.datas == (void**)B && fake.tags == ints && fake.mhandles == (void**)C); \
  CHECK(fake.phandles == NULL && fake.request == &slot && fake.sizesIn != NULL); \
  CHECK(fake.sizes[0] == 10 && fake.sizes[1] == 20 && fake.sizes[2] == (size_t)INT_MAX && fake.sizes[3] == 0); \
  calls0 = fake.calls; \
  CHECK(T(v).irecv(A, TSN_MAX_RECVS, (void**)B, sizes, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.n == TSN_MAX_RECVS && fake.sizes[TSN_MAX_RECVS - 1] == 80); \
  calls0 = fake.calls; \
  CHECK(T(v).irecv(A, TSN_MAX_RECVS + 1, (void**)B, sizes, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.n == TSN_MAX_RECVS + 1 && fake.sizesIn == NULL); calls0 = fake.calls; \
  CHECK(T(v).irecv(A, -1, (void**)B, sizes, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.n == -1 && fake.sizesIn == NULL); calls0 = fake.calls; \
  CHECK(T(v).irecv(A, 1, (void**)B, NULL, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.sizesIn == NULL && fake.n == 1); } while (0)
#define IRECV_V10(v) do { int calls0 = fake.calls; \
  CHECK(T(v).irecv(A, 2, (void**)B, wide, ints, (void**)C, (void**)D, &slot) == TSN_SUCCESS); CALLED("irecv"); \
  CHECK(fake.sizesIn == wide && fake.n == 2 && fake.tags == ints && fake.mhandles == (void**)C && fake.phandles == (void**)D && fake.request == &slot); } while (0)
static void test_irecv(void) {
  IRECV_OLD(6); IRECV_OLD(7); IRECV_OLD(8);
  int calls0 = fake.calls;
  fake.phandles = &slot;
  CHECK(T(9).irecv(A, 3, (void**)B, wide, ints, (void**)C, &slot) == TSN_SUCCESS);
  CALLED("irecv");
  CHECK(fake.sizesIn == wide && fake.phandles == NULL && fake.sizes[2] == 3);
  IRECV_V10(10); IRECV_V10(11); IRECV_V10(12);
}

/* iflush, test and the closes are the same in every version. */
#define SAME(v) do { int calls0 = fake.calls; \
  CHECK(T(v).iflush(A, 2, (void**)B, ints, (void**)C, &slot) == TSN_SUCCESS); CALLED("iflush"); \
  CHECK(fake.comm == A && fake.n == 2 && fake.intSizes == ints && fake.mhandles == (void**)C && fake.request == &slot); \
  calls0 = fake.calls; CHECK(T(v).test(A, &done, ints) == TSN_SUCCESS); CALLED("test"); \
  CHECK(fake.comm == A && fake.done == &done && fake.intSizes == ints); \
  calls0 = fake.calls; CHECK(T(v).closeSend(D) == TSN_SUCCESS); CALLED("close_send"); CHECK(fake.comm == D); \
  calls0 = fake.calls; CHECK(T(v).closeRecv(E) == TSN_SUCCESS); CALLED("close_recv"); CHECK(fake.comm == E); \
  calls0 = fake.calls; CHECK(T(v).closeListen(F) == TSN_SUCCESS); CALLED("close_listen"); CHECK(fake.comm == F); \
  calls0 = fake.calls; CHECK(T(v).devices(ints) == TSN_SUCCESS); CALLED("devices"); CHECK(fake.ndev == ints); } while (0)
#define CONTEXT(v) do { int calls0 = fake.calls; CHECK(T(v).finalize(A) == TSN_SUCCESS); CALLED("finalize"); CHECK(fake.ctx == A); \
  calls0 = fake.calls; CHECK(T(v).setNetAttr(B, &attr) == TSN_SUCCESS); CALLED("set_net_attr"); \
  CHECK(fake.ctx == B && fake.attr == &attr); } while (0)
static void test_same(void) {
  SAME(6); SAME(7); SAME(8); SAME(9); SAME(10); SAME(11); SAME(12);
  CONTEXT(11); CONTEXT(12);
}

/* getProperties copies every member of the version, clamps vProps, and writes nothing past sizeof. */
#define GUARD 64
#define SAME_MEMBER(T_, m) CHECK(got->m == fake_props.m);
#define PROPS(v) do { \
  unsigned char buf[sizeof(tsn_props_v##v##_t) + GUARD]; \
  tsn_props_v##v##_t* got = (tsn_props_v##v##_t*)buf; \
  int calls0 = fake.calls; \
  memset(buf, 0xab, sizeof(buf)); \
  CHECK(T(v).getProperties(5, got) == TSN_SUCCESS); CALLED("get_properties"); CHECK(fake.dev == 5); \
  PROPS_SCALARS_V##v(SAME_MEMBER, _) \
  for (size_t i = sizeof(*got); i < sizeof(buf); i++) CHECK(buf[i] == 0xab); \
  fake_rc = TSN_SYSTEM_ERROR; memset(buf, 0xab, sizeof(buf)); \
  CHECK(T(v).getProperties(5, got) == TSN_SYSTEM_ERROR); \
  for (size_t i = 0; i < sizeof(buf); i++) CHECK(buf[i] == 0xab); \
  fake_rc = TSN_SUCCESS; } while (0)

/* vProps of a version with `len` devs: ndevs clamped to 0..len, devs copied up to len. */
#define VPROPS_COPY(v, len) do { tsn_props_v##v##_t got; int want = fake_props.vProps.ndevs; \
  want = want < 0 ? 0 : want > len ? len : want; \
  CHECK(T(v).getProperties(1, &got) == TSN_SUCCESS); \
  CHECK(sizeof(got.vProps.devs) == len * sizeof(int) && got.vProps.ndevs == want); \
  for (int i = 0; i < len; i++) CHECK(got.vProps.devs[i] == fake_props.vProps.devs[i]); } while (0)

static void fill_props(int ndevs) {
  static char name[] = "dev0", path[] = "/sys/x";
  fake_props = (tsn_props_t){
    .name = name, .pciPath = path, .guid = 0x1122334455667788ULL, .ptrSupport = TSN_PTR_HOST, .regIsGlobal = 1,
    .forceFlush = 1, .speed = 100000, .port = 2, .latency = 1.5f, .maxComms = 65536, .maxRecvs = 8,
    .netDeviceType = 3, .netDeviceVersion = 4, .vProps = {ndevs, {11, 12, 13, 14, 15, 16, 17, 18}},
    .maxP2pBytes = (size_t)1 << 40, .maxCollBytes = (size_t)1 << 29, .maxMultiRequestSize = 9, .railId = -1, .planeId = 7,
  };
}

static void test_properties(void) {
  static const int ndevs[] = {6, 2, 8, -3};
  for (size_t k = 0; k < sizeof(ndevs) / sizeof(ndevs[0]); k++) {
    fill_props(ndevs[k]);
    PROPS(6); PROPS(7); PROPS(8); PROPS(9); PROPS(10); PROPS(11); PROPS(12);
    VPROPS_COPY(9, 4); VPROPS_COPY(10, 4); VPROPS_COPY(11, 4); VPROPS_COPY(12, 8);
  }
}

/* The tsn_props_t descriptors name every member at its offset. */
static const tsn_field_t* field(const char* name) {
  for (int i = 0; i < tsn_props_field_count; i++) if (!strcmp(tsn_props_fields[i].name, name)) return &tsn_props_fields[i];
  return NULL;
}
#define FIELD(T_, m) CHECK(field(#m) != NULL && field(#m)->offset == offsetof(tsn_props_t, m));
static void test_fields(void) {
  CHECK(tsn_props_field_count == 19);
  PROPS_V12(FIELD, _)
  CHECK(field("name")->kind == TSN_FIELD_STRING && field("pciPath")->kind == TSN_FIELD_STRING);
  CHECK(field("guid")->kind == TSN_FIELD_U64 && field("latency")->kind == TSN_FIELD_F32);
  CHECK(field("speed")->kind == TSN_FIELD_I32 && field("maxP2pBytes")->kind == TSN_FIELD_SIZE);
  CHECK(field("railId")->kind == TSN_FIELD_I16 && field("planeId")->kind == TSN_FIELD_I16);
  CHECK(field("vProps")->kind == TSN_FIELD_VPROPS && field("vProps")->length == TSN_VPROPS_MAX_DEVS);
  CHECK(field("speed")->length == 1);
}

int main(void) {
  test_slots();
  test_init();
  test_connections();
  test_memory();
  test_isend();
  test_irecv();
  test_same();
  test_properties();
  test_fields();
  printf("%d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
