// The model read from plugin/abi/: slots per version, NULL slots, overload ranges, core signatures.
import { beforeAll, describe, expect, it } from 'vitest';
import { inspectAbi } from '../../codegen/inspect';
import { coreOf, slotIn, type AbiModel } from '../../codegen/model';
import { ABI_DIR, ROOT } from '../../codegen/paths';
import { generate } from '../../codegen/generate';

const V6 = ['name', 'init', 'devices', 'getProperties', 'listen', 'connect', 'accept', 'regMr', 'regMrDmaBuf',
  'deregMr', 'isend', 'irecv', 'iflush', 'test', 'closeSend', 'closeRecv', 'closeListen'];
const V7 = [...V6, 'getDeviceMr', 'irecvConsumed'];
const V9 = [...V7, 'makeVDevice'];
const V11 = [...V9, 'finalize', 'setNetAttr'];
const SLOTS: Record<number, string[]> = { 6: V6, 7: V7, 8: V7, 9: V9, 10: V9, 11: V11, 12: V11 };

let model: AbiModel;
beforeAll(() => {
  model = inspectAbi(ABI_DIR, ROOT);
});

describe('ABI model', () => {
  it('has versions 6..12', () => {
    expect(model.versions).toEqual([6, 7, 8, 9, 10, 11, 12]);
  });
  for (const [v, slots] of Object.entries(SLOTS)) {
    it(`v${v} has the slots of the doc, in order`, () => {
      expect(model.table.slots.filter((s) => slotIn(s, Number(v))).map((s) => s.name)).toEqual(slots);
    });
  }
  it('leaves exactly getDeviceMr, irecvConsumed and makeVDevice NULL', () => {
    expect(model.table.slots.filter((s) => s.unimplemented).map((s) => s.name)).toEqual(
      ['getDeviceMr', 'irecvConsumed', 'makeVDevice']);
  });
  it('covers each version of each slot exactly once (a signature or @absent)', () => {
    for (const slot of model.table.slots) {
      const covered = [
        ...slot.overloads.flatMap((o) => o.versions), ...slot.absent, ...(slot.data?.versions ?? []),
      ].sort((a, b) => a - b);
      expect(covered, slot.name).toEqual(model.versions);
    }
  });
  it('has one @core overload per implemented slot', () => {
    for (const slot of model.table.slots.filter((s) => !s.data && !s.unimplemented)) {
      expect(slot.overloads.filter((o) => o.core).length, slot.name).toBe(1);
    }
  });
  it('puts the signature changes of the doc at the right versions', () => {
    const ranges = (name: string) => model.table.slots.find((s) => s.name === name)!.overloads
      .filter((o) => o.versions.length).map((o) => [o.versions[0], o.versions[o.versions.length - 1]]);
    expect(ranges('init')).toEqual([[6, 9], [10, 10], [11, 12]]);
    expect(ranges('connect')).toEqual([[6, 6], [7, 9], [10, 10], [11, 12]]);
    expect(ranges('regMr')).toEqual([[6, 7], [8, 12]]);
    expect(ranges('isend')).toEqual([[6, 8], [9, 9], [10, 12]]);
    expect(ranges('irecv')).toEqual([[6, 8], [9, 9], [10, 12]]);
    expect(ranges('listen')).toEqual([[6, 10], [11, 12]]);
    expect(coreOf(model.table.slots.find((s) => s.name === 'irecv')!)!.counts).toEqual([{ param: 'sizes', by: 'n', max: 'MAX_RECVS' }]);
  });
});

describe('generated header', () => {
  it('declares the core API exactly as native/core.cc implements it', () => {
    const header = generate(['native/generated/tsnet_abi.h'])[0].content;
    const protos = header.split('\n').filter((l) => /^tsn_result_t tsn_\w+\(/.test(l));
    expect(protos).toEqual([
      'tsn_result_t tsn_init(void** ctx, uint64_t commId, const tsn_comm_config_t* config, tsn_logger_t logger, tsn_profiler_t prof);',
      'tsn_result_t tsn_devices(int* ndev);',
      'tsn_result_t tsn_get_properties(int dev, tsn_props_t* props);',
      'tsn_result_t tsn_listen(void* ctx, int dev, void* handle, void** listenComm);',
      'tsn_result_t tsn_connect(void* ctx, int dev, const tsn_comm_config_t* config, void* handle, void** sendComm, tsn_dev_handle_t** sendDevComm);',
      'tsn_result_t tsn_accept(void* listenComm, void** recvComm, tsn_dev_handle_t** recvDevComm);',
      'tsn_result_t tsn_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);',
      'tsn_result_t tsn_reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);',
      'tsn_result_t tsn_dereg_mr(void* comm, void* mhandle);',
      'tsn_result_t tsn_isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle, void** request);',
      'tsn_result_t tsn_irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles, void** phandles, void** request);',
      'tsn_result_t tsn_iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);',
      'tsn_result_t tsn_test(void* request, int* done, int* sizes);',
      'tsn_result_t tsn_close_send(void* sendComm);',
      'tsn_result_t tsn_close_recv(void* recvComm);',
      'tsn_result_t tsn_close_listen(void* listenComm);',
      'tsn_result_t tsn_finalize(void* ctx);',
      'tsn_result_t tsn_set_net_attr(void* ctx, const tsn_net_attr_t* attr);',
    ]);
    expect(header).toContain('typedef void (*tsn_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);');
    expect(header).toContain('typedef tsn_result_t (*tsn_profiler_t)(void** eHandle, int type, void* phandle, int64_t pluginId, void* extData);');
    for (const m of ['TSN_HANDLE_SIZE 128', 'TSN_MAX_REQUESTS 32', 'TSN_MAX_RECVS 8', 'TSN_PTR_HOST 1', 'TSN_PTR_CUDA 2',
      'TSN_PTR_DMABUF 4', 'TSN_NET_DEVICE_HOST 0', 'TSN_LOG_NET 16', 'TSN_SUCCESS 0', 'TSN_REMOTE_ERROR 6']) {
      expect(header).toContain(`#define ${m} `);
    }
  });
});
