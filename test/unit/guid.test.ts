// The guid helpers every transport derives its devices' guids with (plugin/transports/guid.ts).
import * as fs from 'node:fs';
import * as os from 'node:os';
import { describe, expect, it } from 'vitest';
import { groupGuid, guidOf, guidText, hostId } from '../../plugin/transports/guid';

describe('guidOf', () => {
  it('is the first 8 bytes of SHA-256, big-endian: fixed values, the same in every process', () => {
    // SHA-256("") = e3b0c442 98fc1c14 ..., SHA-256("abc") = ba7816bf 8f01cfea ... (FIPS 180-2 examples)
    expect(guidOf('')).toBe(0xe3b0c44298fc1c14n);
    expect(guidOf('abc')).toBe(0xba7816bf8f01cfean);
    expect(guidOf(new Uint8Array([0x61, 0x62, 0x63]))).toBe(guidOf('abc'));
  });

  it('gives different guids to different identities, all within 64 bits', () => {
    const ids = Array.from({ length: 1000 }, (_, i) => `mac:b8:ce:f6:00:${(i >> 8).toString(16)}:${(i & 255).toString(16)}`);
    const gs = ids.map(guidOf);
    expect(new Set(gs).size).toBe(ids.length);
    for (const g of gs) expect(g >= 0n && g < 1n << 64n).toBe(true);
  });
});

describe('groupGuid', () => {
  const a = guidOf('mac:b8:ce:f6:00:00:01');
  const b = guidOf('mac:b8:ce:f6:00:00:02');
  const c = guidOf('mac:b8:ce:f6:00:00:03');

  it('depends on the members, not their order', () => {
    expect(groupGuid([a, b])).toBe(groupGuid([b, a]));
    expect(groupGuid([a, b, c])).toBe(groupGuid([c, a, b]));
    expect(new Set([groupGuid([a, b]), groupGuid([a, c]), groupGuid([b, c]), groupGuid([a, b, c]), a, b, c]).size).toBe(7);
  });

  it('one member keeps its own guid', () => {
    expect(groupGuid([b])).toBe(b);
  });
});

describe('guidText and hostId', () => {
  it('guidText is 0x and 16 hex digits', () => {
    expect(guidText(0x1234n)).toBe('0x0000000000001234');
    expect(guidText(0xe3b0c44298fc1c14n)).toBe('0xe3b0c44298fc1c14');
  });

  it('hostId is the machine id where there is one, else the host name, and does not change', () => {
    let machineId = '';
    try {
      machineId = fs.readFileSync('/etc/machine-id', 'utf8').trim();
    } catch {
      // no machine id here
    }
    const id = hostId();
    if (machineId) expect(id).toBe(machineId);
    else expect(id.length).toBeGreaterThan(0);
    if (!machineId && !fs.existsSync('/var/lib/dbus/machine-id')) expect(id).toBe(os.hostname());
    expect(hostId()).toBe(id);
  });
});
