// Device discovery of the TCP transport against fake sysfs trees built in a temp dir:
// names, PCI paths, speeds, operstate, addresses, NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY,
// the loopback fallback, TSNET_DEVICE_GROUPS and each device's guid.
import * as fs from 'node:fs';
import type * as os from 'node:os';
import * as path from 'node:path';
import { tmpdir } from 'node:os';
import { afterAll, describe, expect, it } from 'vitest';
import { ResultCode } from '../../plugin/abi';
import { NetError } from '../../plugin/errors';
import { groupGuid, guidOf, hostId } from '../../plugin/transports/guid';
import { type Addresses, discoverDevices, ifnameFilter } from '../../plugin/transports/tcp/devices';

const roots: string[] = [];
afterAll(() => roots.forEach((r) => fs.rmSync(r, { recursive: true, force: true })));

interface FakeIf {
  /** Contents of `speed`; undefined: no file. */
  speed?: string;
  /** Contents of `operstate`; undefined: no file. */
  operstate?: string;
  /** A PCI address: the interface gets a `device` symlink to a fake PCI dir. */
  pci?: string;
  /** Contents of `address` (the hardware address); undefined: no file. */
  mac?: string;
  /** Contents of `addr_assign_type` (0 permanent, 1 random, 2 stolen, 3 set); undefined: no file. */
  assign?: string;
}

/** A fake /sys/class/net (plus /sys/devices for the PCI dirs); returns the class/net dir and the realpath of each PCI dir. */
function sysfs(ifs: Record<string, FakeIf>): { sysRoot: string; pci: Record<string, string> } {
  const top = fs.mkdtempSync(path.join(tmpdir(), 'tsnet-sysfs-'));
  roots.push(top);
  const sysRoot = path.join(top, 'class', 'net');
  fs.mkdirSync(sysRoot, { recursive: true });
  const pci: Record<string, string> = {};
  for (const [name, f] of Object.entries(ifs)) {
    const dir = path.join(sysRoot, name);
    fs.mkdirSync(dir);
    if (f.speed !== undefined) fs.writeFileSync(path.join(dir, 'speed'), `${f.speed}\n`);
    if (f.operstate !== undefined) fs.writeFileSync(path.join(dir, 'operstate'), `${f.operstate}\n`);
    if (f.mac !== undefined) fs.writeFileSync(path.join(dir, 'address'), `${f.mac}\n`);
    if (f.assign !== undefined) fs.writeFileSync(path.join(dir, 'addr_assign_type'), `${f.assign}\n`);
    if (f.pci) {
      const dev = path.join(top, 'devices', 'pci0000:00', f.pci);
      fs.mkdirSync(dev, { recursive: true });
      // Relative, like the kernel's: ../../../devices/pci0000:00/<addr>
      fs.symlinkSync(path.relative(dir, dev), path.join(dir, 'device'));
      pci[name] = fs.realpathSync(dev);
    }
  }
  // A file that is not an interface, as in the real /sys/class/net.
  fs.writeFileSync(path.join(sysRoot, 'bonding_masters'), 'bond0\n');
  return { sysRoot, pci };
}

function v4(address: string, internal = false): os.NetworkInterfaceInfo {
  return { address, netmask: '255.255.255.0', family: 'IPv4', mac: '02:00:00:00:00:01', internal, cidr: `${address}/24` };
}
function v6(address: string, internal = false): os.NetworkInterfaceInfo {
  return { address, netmask: 'ffff:ffff:ffff:ffff::', family: 'IPv6', mac: '02:00:00:00:00:01', internal, cidr: `${address}/64`, scopeid: 0 };
}

/** A typical host: lo, two physical NICs, docker0, virbr0, a veth, each with its kind of hardware address. */
function host() {
  const fake = sysfs({
    lo: { operstate: 'unknown', mac: '00:00:00:00:00:00', assign: '0' },
    eth0: { speed: '25000', operstate: 'up', pci: '0000:17:00.0', mac: 'b8:ce:f6:00:17:00', assign: '0' },
    eth1: { speed: '100000', operstate: 'up', pci: '0000:17:00.1', mac: 'b8:ce:f6:00:17:01', assign: '0' },
    docker0: { speed: '-1', operstate: 'up', mac: '02:42:5e:11:22:33', assign: '3' },
    virbr0: { operstate: 'up', mac: '52:54:00:aa:bb:cc', assign: '3' },
    veth1a2b: { speed: '10000', operstate: 'up', mac: '9a:3f:41:0c:7d:e2', assign: '1' },
  });
  const addresses: Addresses = {
    lo: [v4('127.0.0.1', true), v6('::1', true)],
    eth0: [v6('fe80::1'), v6('fd00::10'), v4('10.0.0.10')],
    eth1: [v4('10.0.1.10'), v6('fd00:1::10')],
    docker0: [v4('172.17.0.1')],
    virbr0: [v4('192.168.122.1')],
    veth1a2b: [v6('fd00:2::1')],
  };
  return { ...fake, addresses };
}

const names = (devs: { name: string }[]) => devs.map((d) => d.name);

/** The error fn throws, checked to be a NetError with INVALID_ARGUMENT. */
function thrown(fn: () => unknown): NetError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(NetError);
    expect((e as NetError).code).toBe(ResultCode.INVALID_ARGUMENT);
    return e as NetError;
  }
  throw new Error('expected an error');
}

describe('discoverDevices: what each device says', () => {
  it('one device per usable interface, default excludes lo, docker and virbr', () => {
    const { sysRoot, addresses } = host();
    expect(names(discoverDevices({ sysRoot, addresses }))).toEqual(['eth0', 'eth1', 'veth1a2b']);
  });

  it('pciPath is the realpath of the device symlink, null for virtual NICs', () => {
    const { sysRoot, addresses, pci } = host();
    const devs = discoverDevices({ sysRoot, addresses });
    const by = Object.fromEntries(devs.map((d) => [d.name, d]));
    expect(by.eth0.pciPath).toBe(pci.eth0);
    expect(by.eth0.pciPath).toMatch(/pci0000:00\/0000:17:00\.0$/);
    expect(path.isAbsolute(by.eth0.pciPath!)).toBe(true);
    expect(fs.lstatSync(by.eth0.pciPath!).isSymbolicLink()).toBe(false);
    expect(by.eth1.pciPath).toBe(pci.eth1);
    expect(by.veth1a2b.pciPath).toBeNull();
    expect(by.eth0.nics[0].pciPath).toBe(pci.eth0);
  });

  it('speed in Mbps from sysfs, with one NIC per device', () => {
    const { sysRoot, addresses } = host();
    const devs = discoverDevices({ sysRoot, addresses });
    expect(devs.map((d) => [d.name, d.speedMbps, d.nics.length])).toEqual([
      ['eth0', 25000, 1],
      ['eth1', 100000, 1],
      ['veth1a2b', 10000, 1],
    ]);
  });

  it.each([
    ['missing', undefined],
    ['-1 (link down / virtual)', '-1'],
    ['0', '0'],
    ['empty', ''],
    ['garbage', 'fast'],
    ['a fraction', '2.5'],
  ])('speed %s falls back to 10000', (_what, speed) => {
    const { sysRoot } = sysfs({ ens1: { speed, operstate: 'up', pci: '0000:01:00.0' } });
    const devs = discoverDevices({ sysRoot, addresses: { ens1: [v4('10.1.1.1')] } });
    expect(devs.map((d) => d.speedMbps)).toEqual([10000]);
  });

  it('an interface whose operstate is down is skipped; up, unknown and no file are kept', () => {
    const { sysRoot } = sysfs({
      a0: { operstate: 'down', speed: '1000' },
      a1: { operstate: 'up' },
      a2: { operstate: 'unknown' },
      a3: {},
    });
    const addresses = { a0: [v4('10.0.0.1')], a1: [v4('10.0.0.2')], a2: [v4('10.0.0.3')], a3: [v4('10.0.0.4')] };
    expect(names(discoverDevices({ sysRoot, addresses }))).toEqual(['a1', 'a2', 'a3']);
  });

  it('interfaces without an address (or only a link-local IPv6 one) are skipped', () => {
    const { sysRoot } = sysfs({ b0: { operstate: 'up' }, b1: { operstate: 'up' }, b2: { operstate: 'up' }, b3: { operstate: 'up' } });
    const addresses: Addresses = { b1: [], b2: [v6('fe80::2')], b3: [v4('10.0.0.3')] };
    expect(names(discoverDevices({ sysRoot, addresses }))).toEqual(['b3']);
  });

  it('IPv4 is preferred; a link-local IPv6 is never the address', () => {
    const { sysRoot, addresses } = host();
    const by = Object.fromEntries(discoverDevices({ sysRoot, addresses }).map((d) => [d.name, d.nics[0]]));
    expect([by.eth0.address, by.eth0.family]).toEqual(['10.0.0.10', 4]);
    expect([by.eth1.address, by.eth1.family]).toEqual(['10.0.1.10', 4]);
    expect([by.veth1a2b.address, by.veth1a2b.family]).toEqual(['fd00:2::1', 6]);
    const { sysRoot: s2 } = sysfs({ c0: { operstate: 'up' } });
    const only6 = discoverDevices({ sysRoot: s2, addresses: { c0: [v6('fe80::9'), v6('2001:db8::9')] } });
    expect(only6[0].nics[0]).toMatchObject({ address: '2001:db8::9', family: 6 });
  });

  it('NCCL_SOCKET_FAMILY 4 keeps only IPv4 addresses, 6 only IPv6 ones', () => {
    const { sysRoot, addresses } = host();
    const four = discoverDevices({ sysRoot, addresses, family: 4 });
    expect(four.map((d) => [d.name, d.nics[0].address])).toEqual([
      ['eth0', '10.0.0.10'],
      ['eth1', '10.0.1.10'],
    ]);
    const six = discoverDevices({ sysRoot, addresses, family: 6 });
    expect(six.map((d) => [d.name, d.nics[0].address, d.nics[0].family])).toEqual([
      ['eth0', 'fd00::10', 6],
      ['eth1', 'fd00:1::10', 6],
      ['veth1a2b', 'fd00:2::1', 6],
    ]);
  });

  it('without a readable sysfs, the interfaces come from the address map (virtual, default speed)', () => {
    const devs = discoverDevices({ sysRoot: '/nonexistent/tsnet/sys', addresses: { eth5: [v4('10.5.5.5')], lo: [v4('127.0.0.1', true)] }, hostId: 'h' });
    // The hardware address comes from the OS; without addr_assign_type it is not known to be the NIC's own.
    const guid = guidOf('if:h/eth5/02:00:00:00:00:01');
    expect(devs).toEqual([
      {
        name: 'eth5',
        nics: [{ name: 'eth5', address: '10.5.5.5', family: 4, pciPath: null, speedMbps: 10000, mac: '02:00:00:00:00:01', guid }],
        pciPath: null,
        speedMbps: 10000,
        guid,
      },
    ]);
  });
});

describe('discoverDevices: NCCL_SOCKET_IFNAME', () => {
  it('a prefix list selects by prefix', () => {
    const { sysRoot, addresses } = host();
    expect(names(discoverDevices({ sysRoot, addresses, ifname: 'eth' }))).toEqual(['eth0', 'eth1']);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: 'eth1,veth' }))).toEqual(['eth1', 'veth1a2b']);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: 'docker' }))).toEqual(['docker0']);
  });

  it('^ excludes by prefix', () => {
    const { sysRoot, addresses } = host();
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '^eth' }))).toEqual(['docker0', 'lo', 'veth1a2b', 'virbr0']);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '^eth1,lo,docker,virbr' }))).toEqual(['eth0', 'veth1a2b']);
  });

  it('= matches exactly, ^= excludes exactly', () => {
    const { sysRoot, addresses } = host();
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '=eth' }))).toEqual([]);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '=eth1' }))).toEqual(['eth1']);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '=eth0,veth1a2b' }))).toEqual(['eth0', 'veth1a2b']);
    expect(names(discoverDevices({ sysRoot, addresses, ifname: '^=eth0' }))).toEqual(['docker0', 'eth1', 'lo', 'veth1a2b', 'virbr0']);
  });

  it('ifnameFilter on its own', () => {
    const all = ['lo', 'lo1', 'eth0', 'eth10', 'ens3', 'docker0', 'virbr0', 'ib0'];
    const sel = (spec: string | undefined) => all.filter(ifnameFilter(spec));
    expect(sel(undefined)).toEqual(['eth0', 'eth10', 'ens3', 'ib0']);
    expect(sel('')).toEqual(['eth0', 'eth10', 'ens3', 'ib0']);
    expect(sel('eth')).toEqual(['eth0', 'eth10']);
    expect(sel('eth1')).toEqual(['eth10']);
    expect(sel('=eth1')).toEqual([]);
    expect(sel('=eth10,ib0')).toEqual(['eth10', 'ib0']);
    expect(sel('^eth,lo')).toEqual(['ens3', 'docker0', 'virbr0', 'ib0']);
    expect(sel('^=lo')).toEqual(['lo1', 'eth0', 'eth10', 'ens3', 'docker0', 'virbr0', 'ib0']);
    expect(sel('e , i')).toEqual(['eth0', 'eth10', 'ens3', 'ib0']);
  });
});

describe('discoverDevices: loopback when nothing else', () => {
  it('loopback is used when no other interface is usable', () => {
    const { sysRoot } = sysfs({ lo: { operstate: 'unknown' }, eth0: { operstate: 'down', pci: '0000:01:00.0' }, docker0: {} });
    const addresses = { lo: [v4('127.0.0.1', true), v6('::1', true)], eth0: [v4('10.0.0.1')], docker0: [v4('172.17.0.1')] };
    const devs = discoverDevices({ sysRoot, addresses });
    const guid = guidOf(`if:${hostId()}/lo/02:00:00:00:00:01`);
    expect(devs).toEqual([
      {
        name: 'lo',
        nics: [{ name: 'lo', address: '127.0.0.1', family: 4, pciPath: null, speedMbps: 10000, mac: '02:00:00:00:00:01', guid }],
        pciPath: null,
        speedMbps: 10000,
        guid,
      },
    ]);
    expect(discoverDevices({ sysRoot, addresses, family: 6 })[0].nics[0].address).toBe('::1');
  });

  it('loopback is not used when another interface is', () => {
    const { sysRoot, addresses } = host();
    expect(names(discoverDevices({ sysRoot, addresses }))).not.toContain('lo');
  });

  it('loopback is not a fallback when NCCL_SOCKET_IFNAME is set explicitly', () => {
    const { sysRoot } = sysfs({ lo: {}, eth0: { operstate: 'up' } });
    const addresses = { lo: [v4('127.0.0.1', true)], eth0: [v4('10.0.0.1')] };
    expect(discoverDevices({ sysRoot, addresses, ifname: 'ib' })).toEqual([]);
    expect(discoverDevices({ sysRoot, addresses, ifname: '^eth' }).map((d) => d.name)).toEqual(['lo']);
    expect(discoverDevices({ sysRoot, addresses, ifname: '=lo' }).map((d) => d.name)).toEqual(['lo']);
  });

  it('nothing at all gives no devices', () => {
    const { sysRoot } = sysfs({ eth0: { operstate: 'down' } });
    expect(discoverDevices({ sysRoot, addresses: { eth0: [v4('10.0.0.1')] } })).toEqual([]);
  });
});

describe('discoverDevices: TSNET_DEVICE_GROUPS', () => {
  function many() {
    const ifs: Record<string, FakeIf> = {};
    const addresses: Addresses = {};
    for (let i = 0; i < 7; i++) {
      ifs[`eth${i}`] = { operstate: 'up', speed: String(1000 * (i + 1)), pci: `0000:0${i}:00.0`, mac: `b8:ce:f6:00:0${i}:00`, assign: '0' };
      addresses[`eth${i}`] = [v4(`10.0.${i}.1`)];
    }
    return { ...sysfs(ifs), addresses };
  }

  it('a+b,c makes a two-NIC device and a one-NIC device; the rest stay single', () => {
    const { sysRoot, addresses, pci } = many();
    const devs = discoverDevices({ sysRoot, addresses, groups: 'eth1+eth0,eth2' });
    expect(devs.map((d) => [d.name, d.nics.map((n) => n.name), d.speedMbps])).toEqual([
      ['eth1+eth0', ['eth1', 'eth0'], 2000 + 1000],
      ['eth2', ['eth2'], 3000],
      ['eth3', ['eth3'], 4000],
      ['eth4', ['eth4'], 5000],
      ['eth5', ['eth5'], 6000],
      ['eth6', ['eth6'], 7000],
    ]);
    expect(devs[0].pciPath).toBe(pci.eth1);
    expect(devs[0].nics.map((n) => n.address)).toEqual(['10.0.1.1', '10.0.0.1']);
  });

  it('five members are fine; spaces are allowed', () => {
    const { sysRoot, addresses } = many();
    const devs = discoverDevices({ sysRoot, addresses, groups: ' eth0 + eth1+eth2+eth3+eth4 , eth5+eth6' });
    expect(devs.map((d) => [d.name, d.speedMbps])).toEqual([
      ['eth0+eth1+eth2+eth3+eth4', 15000],
      ['eth5+eth6', 13000],
    ]);
  });

  it('an unknown member is an error naming the variable and the member', () => {
    const { sysRoot, addresses } = many();
    const e = thrown(() => discoverDevices({ sysRoot, addresses, groups: 'eth0+ib0' }));
    expect(e.message).toContain('TSNET_DEVICE_GROUPS=eth0+ib0');
    expect(e.message).toContain('ib0');
  });

  it('a member filtered away by NCCL_SOCKET_IFNAME is unknown too', () => {
    const { sysRoot, addresses } = many();
    const e = thrown(() => discoverDevices({ sysRoot, addresses, ifname: '^eth3', groups: 'eth2+eth3' }));
    expect(e.message).toMatch(/TSNET_DEVICE_GROUPS=eth2\+eth3.*eth3/);
  });

  it('a member named twice is an error naming the variable', () => {
    const { sysRoot, addresses } = many();
    for (const groups of ['eth0+eth1,eth1+eth2', 'eth0,eth0', 'eth3+eth3']) {
      const e = thrown(() => discoverDevices({ sysRoot, addresses, groups }));
      expect(e.message).toContain(`TSNET_DEVICE_GROUPS=${groups}`);
      expect(e.message).toMatch(/eth[0-3]/);
    }
  });

  it('more than 5 members is an error naming the variable', () => {
    const { sysRoot, addresses } = many();
    const e = thrown(() => discoverDevices({ sysRoot, addresses, groups: 'eth0+eth1+eth2+eth3+eth4+eth5' }));
    expect(e.message).toContain('TSNET_DEVICE_GROUPS=eth0+eth1+eth2+eth3+eth4+eth5');
    expect(e.message).toMatch(/5/);
  });

  it('an empty member is an error', () => {
    const { sysRoot, addresses } = many();
    const e = thrown(() => discoverDevices({ sysRoot, addresses, groups: 'eth0+' }));
    expect(e.message).toContain('TSNET_DEVICE_GROUPS=eth0+');
  });
});

describe('discoverDevices: guids', () => {
  const all = '^none'; // NCCL_SOCKET_IFNAME that keeps every interface
  const guids = (devs: { name: string; guid: bigint }[]) => Object.fromEntries(devs.map((d) => [d.name, d.guid]));

  it('a NIC with its permanent address: hashed from the address alone, whatever its name or host', () => {
    const { sysRoot, addresses } = host();
    const g = guids(discoverDevices({ sysRoot, addresses, hostId: 'host-a' }));
    expect(g.eth0).toBe(guidOf('mac:b8:ce:f6:00:17:00'));
    expect(g.eth1).toBe(guidOf('mac:b8:ce:f6:00:17:01'));
    const renamed = sysfs({ ens5f0: { operstate: 'up', pci: '0000:17:00.0', mac: 'B8:CE:F6:00:17:00', assign: '0' } });
    const r = discoverDevices({ sysRoot: renamed.sysRoot, addresses: { ens5f0: [v4('10.0.0.10')] }, hostId: 'host-b' });
    expect(r[0].guid).toBe(g.eth0);
  });

  it('every device of a host has its own guid, and one that fits 64 bits and is not 0', () => {
    const { sysRoot, addresses } = host();
    const devs = discoverDevices({ sysRoot, addresses, ifname: all, hostId: 'host-a' });
    expect(names(devs)).toEqual(['docker0', 'eth0', 'eth1', 'lo', 'veth1a2b', 'virbr0']);
    expect(new Set(devs.map((d) => d.guid)).size).toBe(devs.length);
    for (const d of devs) {
      expect(d.guid).toBeGreaterThan(0n);
      expect(d.guid).toBeLessThan(1n << 64n);
      expect(d.nics[0].guid).toBe(d.guid);
    }
  });

  it('the same in every discovery (every process) of a host', () => {
    const { sysRoot, addresses } = host();
    const once = guids(discoverDevices({ sysRoot, addresses, ifname: all, hostId: 'host-a' }));
    const again = guids(discoverDevices({ sysRoot, addresses, ifname: all, hostId: 'host-a' }));
    expect(again).toEqual(once);
    // An interface filter or family changes which devices exist, not their guids.
    const eth = guids(discoverDevices({ sysRoot, addresses, ifname: 'eth', family: 6, hostId: 'host-a' }));
    expect(eth).toEqual({ eth0: once.eth0, eth1: once.eth1 });
  });

  it('lo (all-zero address) and addresses that are not the NIC\'s own: host id, name and address', () => {
    const { sysRoot, addresses } = host();
    const a = guids(discoverDevices({ sysRoot, addresses, ifname: all, hostId: 'host-a' }));
    expect(a.lo).toBe(guidOf('if:host-a/lo/00:00:00:00:00:00'));
    expect(a.veth1a2b).toBe(guidOf('if:host-a/veth1a2b/9a:3f:41:0c:7d:e2')); // random
    expect(a.docker0).toBe(guidOf('if:host-a/docker0/02:42:5e:11:22:33')); // set
    const b = guids(discoverDevices({ sysRoot, addresses, ifname: all, hostId: 'host-b' }));
    expect(b.lo).not.toBe(a.lo);
    expect(b.eth0).toBe(a.eth0);
  });

  it('a VLAN or bond with a stolen address differs from the NIC it took it from', () => {
    const { sysRoot } = sysfs({
      eth0: { operstate: 'up', pci: '0000:17:00.0', mac: 'b8:ce:f6:00:17:00', assign: '0' },
      'eth0.100': { operstate: 'up', mac: 'b8:ce:f6:00:17:00', assign: '2' },
      bond0: { operstate: 'up', mac: 'b8:ce:f6:00:17:00', assign: '2' },
    });
    const addresses = { eth0: [v4('10.0.0.1')], 'eth0.100': [v4('10.1.0.1')], bond0: [v4('10.2.0.1')] };
    const g = guids(discoverDevices({ sysRoot, addresses, hostId: 'h' }));
    expect(g.eth0).toBe(guidOf('mac:b8:ce:f6:00:17:00'));
    expect(g['eth0.100']).toBe(guidOf('if:h/eth0.100/b8:ce:f6:00:17:00'));
    expect(new Set(Object.values(g)).size).toBe(3);
  });

  it('no address or addr_assign_type file, or an empty one: the address from the OS, not taken as permanent', () => {
    const { sysRoot } = sysfs({
      n0: { operstate: 'up' },
      n1: { operstate: 'up', mac: 'b8:ce:f6:00:00:01' },
      n2: { operstate: 'up', mac: 'b8:ce:f6:00:00:02', assign: '' },
    });
    const addresses = { n0: [v4('10.0.0.1')], n1: [v4('10.0.0.2')], n2: [v4('10.0.0.3')] };
    const devs = discoverDevices({ sysRoot, addresses, hostId: 'h' });
    expect(devs.map((d) => [d.name, d.nics[0].mac, d.guid])).toEqual([
      ['n0', '02:00:00:00:00:01', guidOf('if:h/n0/02:00:00:00:00:01')],
      ['n1', 'b8:ce:f6:00:00:01', guidOf('if:h/n1/b8:ce:f6:00:00:01')],
      ['n2', 'b8:ce:f6:00:00:02', guidOf('if:h/n2/b8:ce:f6:00:00:02')],
    ]);
  });

  it('two NICs claiming one permanent address still get distinct guids', () => {
    const { sysRoot } = sysfs({
      a: { operstate: 'up', pci: '0000:01:00.0', mac: 'b8:ce:f6:00:00:01', assign: '0' },
      b: { operstate: 'up', pci: '0000:02:00.0', mac: 'b8:ce:f6:00:00:01', assign: '0' },
      c: { operstate: 'up', pci: '0000:03:00.0', mac: 'b8:ce:f6:00:00:03', assign: '0' },
    });
    const addresses = { a: [v4('10.0.0.1')], b: [v4('10.0.0.2')], c: [v4('10.0.0.3')] };
    const g = guids(discoverDevices({ sysRoot, addresses, hostId: 'h' }));
    expect(g).toEqual({
      a: guidOf('if:h/a/b8:ce:f6:00:00:01'),
      b: guidOf('if:h/b/b8:ce:f6:00:00:01'),
      c: guidOf('mac:b8:ce:f6:00:00:03'),
    });
  });
});

describe('discoverDevices: guids of multi-NIC devices', () => {
  function four() {
    const ifs: Record<string, FakeIf> = {};
    const addresses: Addresses = {};
    for (let i = 0; i < 4; i++) {
      ifs[`eth${i}`] = { operstate: 'up', pci: `0000:0${i}:00.0`, mac: `b8:ce:f6:00:0${i}:00`, assign: '0' };
      addresses[`eth${i}`] = [v4(`10.0.${i}.1`)];
    }
    return { ...sysfs(ifs), addresses };
  }

  it('a group\'s guid comes from its members, in any order, and differs from each member\'s', () => {
    const { sysRoot, addresses } = four();
    const single = Object.fromEntries(discoverDevices({ sysRoot, addresses }).map((d) => [d.name, d.guid]));
    const ab = discoverDevices({ sysRoot, addresses, groups: 'eth1+eth0' })[0];
    const ba = discoverDevices({ sysRoot, addresses, groups: 'eth0+eth1' })[0];
    expect(ab.guid).toBe(groupGuid([single.eth1, single.eth0]));
    expect(ba.guid).toBe(ab.guid);
    expect(ab.guid).not.toBe(single.eth0);
    expect(ab.guid).not.toBe(single.eth1);
    expect(ab.nics.map((n) => n.guid)).toEqual([single.eth1, single.eth0]);
  });

  it('groups and the single devices beside them are all distinct; a one-NIC group keeps its NIC\'s guid', () => {
    const { sysRoot, addresses } = four();
    const single = Object.fromEntries(discoverDevices({ sysRoot, addresses }).map((d) => [d.name, d.guid]));
    const devs = discoverDevices({ sysRoot, addresses, groups: 'eth0+eth1,eth2' });
    expect(names(devs)).toEqual(['eth0+eth1', 'eth2', 'eth3']);
    expect(devs[1].guid).toBe(single.eth2);
    expect(devs[2].guid).toBe(single.eth3);
    expect(new Set(devs.map((d) => d.guid)).size).toBe(3);
    const other = discoverDevices({ sysRoot, addresses, groups: 'eth0+eth2,eth1+eth3' });
    expect(new Set([...devs, ...other].map((d) => d.guid)).size).toBe(5);
  });
});
