/* A fake version-neutral core: every tsn_* records its arguments in `fake` and returns fake_rc. */
#include <string.h>

#include "fake_core.h"

fake_call_t fake;
tsn_props_t fake_props;
tsn_result_t fake_rc = TSN_SUCCESS;

static tsn_result_t called(const char* fn) {
  fake.fn = fn;
  fake.calls++;
  return fake_rc;
}

tsn_result_t tsn_init(void** ctx, uint64_t commId, const tsn_comm_config_t* config, tsn_logger_t logger, tsn_profiler_t prof) {
  fake.ctxOut = ctx, fake.commId = commId, fake.config = config, fake.logger = logger, fake.prof = prof;
  return called("init");
}
tsn_result_t tsn_devices(int* ndev) {
  fake.ndev = ndev;
  return called("devices");
}
tsn_result_t tsn_get_properties(int dev, tsn_props_t* props) {
  fake.dev = dev;
  if (fake_rc == TSN_SUCCESS) *props = fake_props;
  else memset(props, 0x5a, sizeof(*props));
  return called("get_properties");
}
tsn_result_t tsn_listen(void* ctx, int dev, void* handle, void** listenComm) {
  fake.ctx = ctx, fake.dev = dev, fake.handle = handle, fake.commOut = listenComm;
  return called("listen");
}
tsn_result_t tsn_connect(void* ctx, int dev, const tsn_comm_config_t* config, void* handle, void** sendComm, tsn_dev_handle_t** sendDevComm) {
  fake.ctx = ctx, fake.dev = dev, fake.config = config, fake.handle = handle, fake.commOut = sendComm, fake.devComm = sendDevComm;
  return called("connect");
}
tsn_result_t tsn_accept(void* listenComm, void** recvComm, tsn_dev_handle_t** recvDevComm) {
  fake.comm = listenComm, fake.commOut = recvComm, fake.devComm = recvDevComm;
  return called("accept");
}
tsn_result_t tsn_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  fake.comm = comm, fake.data = data, fake.size = size, fake.type = type, fake.mhandleOut = mhandle;
  return called("reg_mr");
}
tsn_result_t tsn_reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  fake.comm = comm, fake.data = data, fake.size = size, fake.type = type, fake.offset = offset, fake.fd = fd, fake.mhandleOut = mhandle;
  return called("reg_mr_dma_buf");
}
tsn_result_t tsn_dereg_mr(void* comm, void* mhandle) {
  fake.comm = comm, fake.mhandle = mhandle;
  return called("dereg_mr");
}
tsn_result_t tsn_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request) {
  fake.comm = sendComm, fake.data = data, fake.size = size, fake.tag = tag, fake.mhandle = mhandle, fake.phandle = phandle, fake.request = request;
  return called("isend");
}
tsn_result_t tsn_irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles, void** phandles, void** request) {
  fake.comm = recvComm, fake.n = n, fake.datas = data, fake.sizesIn = sizes, fake.tags = tags, fake.mhandles = mhandles;
  fake.phandles = phandles, fake.request = request;
  memset(fake.sizes, 0, sizeof(fake.sizes));
  for (int i = 0; sizes != NULL && i < n && i < TSN_MAX_RECVS; i++) fake.sizes[i] = sizes[i];
  return called("irecv");
}
tsn_result_t tsn_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  fake.comm = recvComm, fake.n = n, fake.datas = data, fake.intSizes = sizes, fake.mhandles = mhandles, fake.request = request;
  return called("iflush");
}
tsn_result_t tsn_test(void* request, int* done, int* sizes) {
  fake.comm = request, fake.done = done, fake.intSizes = sizes;
  return called("test");
}
tsn_result_t tsn_close_send(void* sendComm) {
  fake.comm = sendComm;
  return called("close_send");
}
tsn_result_t tsn_close_recv(void* recvComm) {
  fake.comm = recvComm;
  return called("close_recv");
}
tsn_result_t tsn_close_listen(void* listenComm) {
  fake.comm = listenComm;
  return called("close_listen");
}
tsn_result_t tsn_finalize(void* ctx) {
  fake.ctx = ctx;
  return called("finalize");
}
tsn_result_t tsn_set_net_attr(void* ctx, const tsn_net_attr_t* attr) {
  fake.ctx = ctx, fake.attr = attr;
  return called("set_net_attr");
}
