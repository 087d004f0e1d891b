// What discovery reports of one NIC (ofiOpen), for tests of the transport over a fake binding:
// a shm NIC with host memory only unless told otherwise.
import type { OfiNicInfo } from '../../plugin/transports/ofi/native-rail';

export const nicInfo = (over: Partial<OfiNicInfo> = {}): OfiNicInfo => ({
  provider: 'shm',
  domain: 'shm',
  fabric: 'shm',
  pciPath: '',
  guid: 1n,
  speedMbps: 0,
  hmem: false,
  hmemWhy: '',
  noCudaApi: false,
  mixedIov: true,
  virtAddr: true,
  mrLocal: false,
  rxCqData: false,
  autoProgress: false,
  maxMsgSize: 1 << 30,
  injectSize: 0,
  cqDataBytes: 8,
  describe: 'shm domain shm',
  ...over,
});
