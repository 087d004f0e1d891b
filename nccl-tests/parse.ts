// Reads nccl-tests output: the result rows, the average bus bandwidth, and what NCCL said
// about the network it loaded and used.
export interface Half {
  timeUs: number;
  algbw: number;
  busbw: number;
  wrong: number | null; // null: not checked (N/A)
}

export interface Row {
  size: number;
  count: number;
  type: string;
  redop: string;
  outOfPlace: Half;
  inPlace: Half | null;
}

export interface Parsed {
  rows: Row[];
  avgBusbw: number | null;
  /** Lines where NCCL says which net plugin it loaded and which network it uses. */
  loaded: string[];
  using: string[];
  warnings: string[];
  /** True when NCCL (or nccl-tests) reported an error. */
  failed: boolean;
}

const num = (s: string | undefined) => (s === undefined || s === 'N/A' ? NaN : Number(s));

function half(t: string[]): Half | null {
  if (t.length < 4) return null;
  const [time, algbw, busbw, wrong] = t;
  if (!Number.isFinite(num(time))) return null;
  return { timeUs: num(time), algbw: num(algbw), busbw: num(busbw), wrong: wrong === 'N/A' ? null : num(wrong) };
}

export function parseLog(text: string): Parsed {
  const rows: Row[] = [];
  let avgBusbw: number | null = null;
  const loaded: string[] = [];
  const using: string[] = [];
  const warnings: string[] = [];
  let failed = false;
  for (const line of text.split('\n')) {
    const t = line.trim().split(/\s+/);
    if (/^\d+$/.test(t[0] ?? '') && /^\d+$/.test(t[1] ?? '') && t.length >= 9) {
      const oop = half(t.slice(5, 9));
      if (oop) rows.push({ size: Number(t[0]), count: Number(t[1]), type: t[2], redop: t[3], outOfPlace: oop, inPlace: half(t.slice(9, 13)) });
      continue;
    }
    const avg = /Avg bus bandwidth\s*:\s*([\d.]+)/.exec(line);
    if (avg) avgBusbw = Number(avg[1]);
    if (/Loaded net plugin|NET\/Plugin/.test(line)) loaded.push(line.trim());
    if (/Using network/.test(line)) using.push(line.trim());
    if (/ WARN /.test(line)) warnings.push(line.trim());
    if (/NCCL failure|Test failure|unhandled system error|internal error/i.test(line)) failed = true;
    const oob = /Out of bounds values\s*:\s*(\d+)/.exec(line);
    if (oob && Number(oob[1]) !== 0) failed = true;
  }
  return { rows, avgBusbw, loaded, using, warnings, failed };
}

/** Every row's #wrong summed (out-of-place and in-place); NaN rows count as unchecked. */
export function wrongTotal(rows: Row[]): number {
  let n = 0;
  for (const r of rows) for (const h of [r.outOfPlace, r.inPlace]) if (h && h.wrong !== null && Number.isFinite(h.wrong)) n += h.wrong;
  return n;
}
