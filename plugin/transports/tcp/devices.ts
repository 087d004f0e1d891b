// Network devices for the TCP transport: one NCCL device per usable interface, found in
// /sys/class/net, filtered with NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY as NCCL does, and
// optionally grouped (TSNET_DEVICE_GROUPS=a+b,c) into multi-NIC devices whose large
// messages are striped over every NIC. Loopback is used when nothing else is. Each device
// gets a guid from what its NIC owns (nicIdentity), so NCCL tells the NICs apart.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { invalidArgument } from '../../errors';
import { groupGuid, guidOf, hostId } from '../guid';

export interface Nic {
  name: string;
  /** The address the transport binds and advertises. */
  address: string;
  family: 4 | 6;
  /** realpath of the NIC's device in sysfs; null for a virtual NIC. */
  pciPath: string | null;
  speedMbps: number;
  /** Hardware address from sysfs (else from the OS), lower case; null when unknown. */
  mac: string | null;
  /** Stable and distinct per NIC: guidOf(nicIdentity(...)). */
  guid: bigint;
}

export interface NetDevice {
  name: string;
  nics: Nic[];
  pciPath: string | null;
  speedMbps: number;
  /** The NIC's guid; a multi-NIC device's from its members (groupGuid). */
  guid: bigint;
}

export type Addresses = Record<string, os.NetworkInterfaceInfo[] | undefined>;

export interface Discovery {
  sysRoot?: string;
  addresses?: Addresses;
  ifname?: string;
  family?: 4 | 6;
  groups?: string;
  /** The host's identity for virtual NICs' guids; default hostId(). */
  hostId?: string;
}

function readText(p: string): string | undefined {
  try {
    return fs.readFileSync(p, 'utf8').trim();
  } catch {
    return undefined;
  }
}

/** NCCL_SOCKET_IFNAME matching: `^` excludes, `=` matches names exactly, else prefixes. */
export function ifnameFilter(spec: string | undefined): (name: string) => boolean {
  if (spec === undefined || spec === '') {
    // NCCL's default: anything but loopback and container bridges.
    return (n) => !/^(lo|docker|virbr)/.test(n);
  }
  let s = spec;
  const exclude = s.startsWith('^');
  if (exclude) s = s.slice(1);
  const exact = s.startsWith('=');
  if (exact) s = s.slice(1);
  const list = s.split(',').map((x) => x.trim()).filter(Boolean);
  const hit = (n: string) => list.some((p) => (exact ? n === p : n.startsWith(p)));
  return exclude ? (n) => !hit(n) : hit;
}

/** /sys/class/net/<if>/addr_assign_type of an address the NIC was made with (the kernel's NET_ADDR_PERM). */
const ADDR_PERMANENT = 0;

/**
 * What a NIC's guid is hashed from. An address the NIC was made with (addr_assign_type 0, not
 * all zeros) is its own and unique, like an InfiniBand node guid: `mac:<address>`, whatever the
 * interface is called and on whichever host. Any other address may be shared or chosen (random
 * for veth and dummy, stolen from another interface for a VLAN or a bond, set by a user or by
 * enslaving), and lo's is all zeros: those NICs are `if:<host id>/<name>/<address>`, since an
 * interface name is unique on a host and the same for all its processes, and the host id (the
 * machine id) keeps two hosts' lo apart where NCCL puts several hosts in one topology (an
 * NVLink domain).
 */
export function nicIdentity(name: string, mac: string | null, assignType: number | undefined, host: string): string {
  const own = mac !== null && assignType === ADDR_PERMANENT && /[1-9a-f]/.test(mac);
  return own ? `mac:${mac}` : `if:${host}/${name}/${mac ?? ''}`;
}

function nicOf(name: string, sysRoot: string, addresses: Addresses, family: 4 | 6 | undefined, host: string): Nic | undefined {
  const dir = path.join(sysRoot, name);
  if (readText(path.join(dir, 'operstate')) === 'down') return undefined;
  const addrs = (addresses[name] ?? []).filter(
    (a) => (a.family === 'IPv4' || (a.family === 'IPv6' && !a.address.startsWith('fe80'))) &&
      (family === undefined || (family === 4) === (a.family === 'IPv4')),
  );
  const pick = addrs.find((a) => a.family === 'IPv4') ?? addrs[0];
  if (!pick) return undefined;
  let pciPath: string | null = null;
  try {
    pciPath = fs.realpathSync(path.join(dir, 'device'));
  } catch {
    pciPath = null; // virtual NIC: no device behind it
  }
  const speed = Number(readText(path.join(dir, 'speed')));
  const mac = (readText(path.join(dir, 'address')) || addrs[0].mac || '').toLowerCase() || null;
  const assign = readText(path.join(dir, 'addr_assign_type'));
  return {
    name,
    address: pick.address,
    family: pick.family === 'IPv4' ? 4 : 6,
    pciPath,
    speedMbps: Number.isInteger(speed) && speed > 0 ? speed : 10000,
    mac,
    guid: guidOf(nicIdentity(name, mac, /^\d+$/.test(assign ?? '') ? Number(assign) : undefined, host)),
  };
}

/** Two NICs claiming one permanent address (a cloned or misprogrammed NIC) fall back to their interface identity. */
function distinct(nics: Nic[], host: string): Nic[] {
  const count = new Map<bigint, number>();
  for (const n of nics) count.set(n.guid, (count.get(n.guid) ?? 0) + 1);
  return nics.map((n) => (count.get(n.guid)! > 1 ? { ...n, guid: guidOf(nicIdentity(n.name, n.mac, undefined, host)) } : n));
}

export function discoverDevices(d: Discovery = {}): NetDevice[] {
  const sysRoot = d.sysRoot ?? '/sys/class/net';
  const addresses = d.addresses ?? os.networkInterfaces();
  const host = d.hostId ?? hostId();
  let names: string[];
  try {
    names = fs.readdirSync(sysRoot).sort();
  } catch {
    names = Object.keys(addresses).sort();
  }
  const usable = (filter: (n: string) => boolean) =>
    distinct(names.filter(filter).map((n) => nicOf(n, sysRoot, addresses, d.family, host)).filter((n): n is Nic => !!n), host);
  let nics = usable(ifnameFilter(d.ifname));
  if (nics.length === 0 && d.ifname === undefined) nics = usable((n) => n === 'lo' || n.startsWith('lo'));
  return group(nics, d.groups);
}

function group(nics: Nic[], spec: string | undefined): NetDevice[] {
  const single = (n: Nic): NetDevice => ({ name: n.name, nics: [n], pciPath: n.pciPath, speedMbps: n.speedMbps, guid: n.guid });
  if (!spec) return nics.map(single);
  const byName = new Map(nics.map((n) => [n.name, n]));
  const used = new Set<string>();
  const out: NetDevice[] = [];
  for (const g of spec.split(',').map((x) => x.trim()).filter(Boolean)) {
    const members = g.split('+').map((x) => x.trim());
    for (const m of members) {
      if (!byName.has(m)) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: ${m} is not a usable interface (${[...byName.keys()].join(', ') || 'none'})`);
      if (used.has(m)) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: ${m} is in two groups`);
      used.add(m);
    }
    const list = members.map((m) => byName.get(m)!);
    if (list.length > 5) throw invalidArgument(`TSNET_DEVICE_GROUPS=${spec}: at most 5 interfaces per device`);
    out.push({
      name: members.join('+'),
      nics: list,
      pciPath: list[0].pciPath,
      speedMbps: list.reduce((s, n) => s + n.speedMbps, 0),
      guid: groupGuid(list.map((n) => n.guid)),
    });
  }
  for (const n of nics) if (!used.has(n.name)) out.push(single(n));
  return out;
}
