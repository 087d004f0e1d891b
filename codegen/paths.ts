// Paths, resolved from the repository root (works from codegen/ and dist/codegen/).
import * as fs from 'fs';
import * as path from 'path';

function findRoot(start: string): string {
  let dir = start;
  while (!fs.existsSync(path.join(dir, 'codegen', 'templates'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`codegen: no repository root above ${start}`);
    dir = up;
  }
  return dir;
}

/** The repository root. */
export const ROOT = findRoot(__dirname);
/** The ABI definitions codegen reads. */
export const ABI_DIR = path.join(ROOT, 'plugin', 'abi');
/** The handlebars templates. */
export const TEMPLATE_DIR = path.join(ROOT, 'codegen', 'templates');
