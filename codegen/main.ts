// npm run codegen: write the generated files that changed.
// npm run codegen:check: exit 1 listing the committed generated files that are stale.
import * as fs from 'fs';
import * as path from 'path';
import { AbiError } from './diagnostics';
import { generate, staleFiles } from './generate';
import { ROOT } from './paths';

function main(argv: string[]): number {
  const check = argv.includes('--check');
  const only = argv.filter((a) => a !== '--check');
  let files;
  try {
    files = generate(only);
  } catch (e) {
    if (e instanceof AbiError) {
      process.stderr.write(e.message + '\n');
      return 1;
    }
    throw e;
  }
  const stale = staleFiles(files);
  if (check) {
    for (const f of stale) process.stderr.write(`${f}: stale\n`);
    if (stale.length) process.stderr.write('run npm run codegen and commit the result\n');
    else process.stdout.write('generated files are up to date\n');
    return stale.length ? 1 : 0;
  }
  for (const f of files.filter((x) => stale.includes(x.path))) {
    const full = path.join(ROOT, f.path);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, f.content);
    process.stdout.write(`wrote ${f.path}\n`);
  }
  if (!stale.length) process.stdout.write('generated files are up to date\n');
  return 0;
}

process.exitCode = main(process.argv.slice(2));
