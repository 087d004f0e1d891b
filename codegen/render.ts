// Strict handlebars: one template per output, shared partials, no helpers, no escaping.
import * as fs from 'fs';
import * as path from 'path';
import Handlebars from 'handlebars';
import { TEMPLATE_DIR } from './paths';

const OPTIONS = { strict: true, noEscape: true, knownHelpersOnly: true } as const;

let env: typeof Handlebars | null = null;

function environment(): typeof Handlebars {
  if (env) return env;
  env = Handlebars.create();
  const dir = path.join(TEMPLATE_DIR, 'partials');
  for (const file of fs.readdirSync(dir).filter((f) => f.endsWith('.hbs')).sort()) {
    env.registerPartial(path.basename(file, '.hbs'), env.compile(fs.readFileSync(path.join(dir, file), 'utf8'), OPTIONS));
  }
  return env;
}

/** Renders `codegen/templates/<name>` with a view object (every field it names must exist). */
export function render(name: string, view: object): string {
  const hb = environment();
  const template = hb.compile(fs.readFileSync(path.join(TEMPLATE_DIR, name), 'utf8'), OPTIONS);
  return template(view);
}
