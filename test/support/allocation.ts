// What the data path allocates: V8's sampling heap profiler (through node:inspector), counting
// objects the collector has already freed too, so that short-lived garbage shows. Each
// young-generation collection stops a protocol thread for 0.2-1.2 ms (docs/performance.md, item 18).
import { Session } from 'node:inspector';

interface ProfileNode {
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  selfSize: number;
  children: ProfileNode[];
}

export interface Allocated {
  /** Bytes allocated while run() ran (sampled: about samplingInterval bytes each). */
  total: number;
  /** The same per site; a builtin's allocations go to the JavaScript function that called it. */
  sites: [site: string, bytes: number][];
}

/** Bytes allocated while run() runs, by allocation site, largest first. */
export async function allocatedBy(run: () => Promise<void> | void, samplingInterval = 64): Promise<Allocated> {
  const s = new Session();
  s.connect();
  const post = (method: string, params?: object) =>
    new Promise<unknown>((resolve, reject) => s.post(method, params ?? {}, (err, r) => (err ? reject(err) : resolve(r))));
  try {
    await post('HeapProfiler.startSampling', { samplingInterval, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
    await run();
    const { profile } = (await post('HeapProfiler.stopSampling')) as { profile: { head: ProfileNode } };
    const bySite = new Map<string, number>();
    const name = (f: ProfileNode['callFrame']) => `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*\/(plugin|test)\//, '$1/')}:${f.lineNumber + 1}`;
    const walk = (n: ProfileNode, caller: string) => {
      const here = n.callFrame.url ? name(n.callFrame) : `${n.callFrame.functionName || '(builtin)'} <- ${caller}`;
      if (n.selfSize) bySite.set(here, (bySite.get(here) ?? 0) + n.selfSize);
      for (const c of n.children) walk(c, n.callFrame.url ? here : caller);
    };
    walk(profile.head, '');
    const sites = [...bySite].sort((a, b) => b[1] - a[1]);
    return { total: sites.reduce((t, [, b]) => t + b, 0), sites };
  } finally {
    s.disconnect();
  }
}

/** The sites of the plugin's own code (the test's harness left out), bytes per message. */
export function pluginSites(a: Allocated, messages: number): string[] {
  return a.sites.filter(([site]) => site.includes('plugin/')).map(([site, b]) => `${(b / messages).toFixed(1)} B/msg ${site}`);
}
