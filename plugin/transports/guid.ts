// Device guids. NCCL reads a device's guid as the identity of its NIC chip: devices with one
// guid and one port are taken for one NIC, whose bandwidth the channel search shares among
// them, and recent NCCL keys rails by it. So a guid must be distinct per NIC and the same in
// every process of a host. Each transport hashes a stable identity of what the NIC owns
// (plugin/transports/tcp/devices.ts: nicIdentity) with guidOf.
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';

/** A 64-bit guid from a stable identity (a string or raw bytes such as a MAC): the first 8 bytes of its SHA-256, big-endian. */
export function guidOf(identity: string | Uint8Array): bigint {
  return createHash('sha256').update(identity).digest().readBigUInt64BE(0);
}

/** The guid of a device made of several NICs: from its members' guids, in any order; one member keeps its own. */
export function groupGuid(members: readonly bigint[]): bigint {
  if (members.length === 1) return members[0];
  return guidOf(`group:${[...members].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)).map((g) => g.toString(16)).join(',')}`);
}

/** `0x` and 16 hex digits, as logs show a guid. */
export function guidText(guid: bigint): string {
  return `0x${guid.toString(16).padStart(16, '0')}`;
}

let host: string | undefined;

/**
 * This host's identity, for virtual NICs that own nothing stable (lo's address is all zeros):
 * systemd's machine id, the same for every process and across reboots; else the host name.
 */
export function hostId(): string {
  if (host === undefined) {
    host = os.hostname();
    for (const f of ['/etc/machine-id', '/var/lib/dbus/machine-id']) {
      try {
        const id = fs.readFileSync(f, 'utf8').trim();
        if (id) {
          host = id;
          break;
        }
      } catch {
        // not there: try the next, then the host name
      }
    }
  }
  return host;
}
