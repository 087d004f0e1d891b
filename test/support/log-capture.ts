// The plugin's log captured per test, for the TypeScript suites.
import { afterEach, beforeEach } from 'vitest';
import { setLogSink } from '../../plugin/log';

export interface LogLine {
  level: number;
  flags: number;
  msg: string;
}

/** Captures every log line of the plugin for the tests of the calling file (no stderr noise). */
export function captureLog(): LogLine[] {
  const lines: LogLine[] = [];
  beforeEach(() => {
    lines.length = 0;
    setLogSink((level, flags, msg) => lines.push({ level, flags, msg }), true);
  });
  afterEach(() => setLogSink(() => {}));
  return lines;
}

/** The plugin's WARN lines (level 2), captured per test of the calling file. */
export function captureWarnings(): string[] {
  const warns: string[] = [];
  beforeEach(() => {
    warns.length = 0;
    setLogSink((level, _flags, msg) => {
      if (level === 2) warns.push(msg);
    });
  });
  afterEach(() => setLogSink(() => {}));
  return warns;
}
