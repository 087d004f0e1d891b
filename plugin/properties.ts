// A device's properties from its transport's one description.
import { Limits, NetDeviceType, type NetProperties } from './abi';
import type { Device, Traits } from './transports/transport';

export function propertiesOf(index: number, dev: Device, traits: Traits): NetProperties {
  return {
    name: dev.name,
    pciPath: dev.pciPath,
    guid: dev.guid,
    ptrSupport: traits.ptrSupport,
    regIsGlobal: traits.regIsGlobal ? 1 : 0,
    forceFlush: traits.forceFlush ? 1 : 0,
    speed: dev.speedMbps,
    port: 0,
    latency: traits.latencyUs,
    maxComms: traits.maxComms,
    maxRecvs: traits.maxRecvs,
    netDeviceType: NetDeviceType.HOST,
    netDeviceVersion: 0,
    vProps: { ndevs: 1, devs: [index] },
    maxP2pBytes: traits.maxP2pBytes,
    maxCollBytes: traits.maxCollBytes,
    maxMultiRequestSize: 1,
    railId: Limits.UNSET,
    planeId: Limits.UNSET,
  };
}
