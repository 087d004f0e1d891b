// gcc's AddressSanitizer runtime, for the suites that run a build under it in a child process
// (LD_PRELOAD): its path, or undefined where gcc has none (gcc then answers the bare name).
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

export function libasan(): string | undefined {
  try {
    const p = execFileSync('gcc', ['-print-file-name=libasan.so'], { encoding: 'utf8' }).trim();
    return path.isAbsolute(p) && fs.existsSync(p) ? p : undefined;
  } catch {
    return undefined;
  }
}
