// Layouts transcribed by hand from docs/ncclnet-abi.md (x86_64), keyed by tsnet's C type names.

/** Offsets of the properties members, one column per version v6..v12 (null: absent). */
const PROPS: [string, ...(number | null)[]][] = [
  ['name', 0, 0, 0, 0, 0, 0, 0],
  ['pciPath', 8, 8, 8, 8, 8, 8, 8],
  ['guid', 16, 16, 16, 16, 16, 16, 16],
  ['ptrSupport', 24, 24, 24, 24, 24, 24, 24],
  ['regIsGlobal', null, null, 28, 28, 28, 28, 28],
  ['forceFlush', null, null, null, 32, 32, 32, 32],
  ['speed', 28, 28, 32, 36, 36, 36, 36],
  ['port', 32, 32, 36, 40, 40, 40, 40],
  ['latency', 36, 36, 40, 44, 44, 44, 44],
  ['maxComms', 40, 40, 44, 48, 48, 48, 48],
  ['maxRecvs', 44, 44, 48, 52, 52, 52, 52],
  ['netDeviceType', null, 48, 52, 56, 56, 56, 56],
  ['netDeviceVersion', null, 52, 56, 60, 60, 60, 60],
  ['vProps', null, null, null, 64, 64, 64, 64],
  ['maxP2pBytes', null, null, null, 88, 88, 88, 104],
  ['maxCollBytes', null, null, null, 96, 96, 96, 112],
  ['maxMultiRequestSize', null, null, null, null, null, 104, 120],
  ['railId', null, null, null, null, null, null, 124],
  ['planeId', null, null, null, null, null, null, 126],
];
const PROPS_SIZE = [48, 56, 64, 104, 104, 112, 128];

/** Table slots in order; `since` is the first version that has the slot. */
const SLOTS: [string, number][] = [
  ['name', 6], ['init', 6], ['devices', 6], ['getProperties', 6], ['listen', 6], ['connect', 6],
  ['accept', 6], ['regMr', 6], ['regMrDmaBuf', 6], ['deregMr', 6], ['isend', 6], ['irecv', 6],
  ['iflush', 6], ['test', 6], ['closeSend', 6], ['closeRecv', 6], ['closeListen', 6],
  ['getDeviceMr', 7], ['irecvConsumed', 7], ['makeVDevice', 9], ['finalize', 11], ['setNetAttr', 11],
];
const TABLE_SIZE = [136, 152, 152, 160, 160, 176, 176];

export const VERSIONS = [6, 7, 8, 9, 10, 11, 12];

/** Expected size and member offsets of one struct. */
export interface Expected {
  size: number;
  offsets: Record<string, number>;
}

function props(): Record<string, Expected> {
  const out: Record<string, Expected> = {};
  VERSIONS.forEach((v, i) => {
    const offsets: Record<string, number> = {};
    for (const [name, ...cols] of PROPS) if (cols[i] !== null) offsets[name] = cols[i] as number;
    out[`tsn_props_v${v}_t`] = { size: PROPS_SIZE[i], offsets };
  });
  return out;
}

function tables(): Record<string, Expected> {
  const out: Record<string, Expected> = {};
  VERSIONS.forEach((v, i) => {
    const offsets: Record<string, number> = {};
    SLOTS.filter(([, since]) => v >= since).forEach(([name], k) => (offsets[name] = 8 * k));
    out[`tsn_net_v${v}_t`] = { size: TABLE_SIZE[i], offsets };
  });
  return out;
}

const vprops4 = { size: 20, offsets: { ndevs: 0, devs: 4 } };

/** Every layout the doc fixes. */
export const EXPECTED: Record<string, Expected> = {
  ...props(),
  ...tables(),
  tsn_props_t: { ...props().tsn_props_v12_t },
  tsn_vprops_v9_t: vprops4,
  tsn_vprops_v10_t: vprops4,
  tsn_vprops_v11_t: vprops4,
  tsn_vprops_v12_t: { size: 36, offsets: { ndevs: 0, devs: 4 } },
  tsn_vprops_t: { size: 36, offsets: { ndevs: 0, devs: 4 } },
  tsn_comm_config_t: { size: 4, offsets: { trafficClass: 0 } },
  tsn_dev_handle_t: { size: 32, offsets: { type: 0, version: 4, handle: 8, size: 16, needsProxyProgress: 24 } },
  tsn_net_attr_peers_t: {
    size: 16,
    offsets: { maxConcurrentPeers: 0, minConcurrentPeers: 4, maxFlowsPerPeer: 8, minFlowsPerPeer: 12 },
  },
  tsn_net_attr_t: { size: 44, offsets: { send: 0, recv: 16, op: 32, algo: 36, proto: 40 } },
};
