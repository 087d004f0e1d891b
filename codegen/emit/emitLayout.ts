// Emits plugin/abi/layout.generated.ts: sizes and offsets of every C struct, and the field descriptors.
import { tableLayout, structLayout } from '../layout';
import type { AbiModel } from '../model';
import { render } from '../render';
import { banner, Emitter } from './emitter';
import { fieldDescs } from './fields';
import { structInstances } from './structs';

function layouts(model: AbiModel) {
  const structs = structInstances(model).map((s) => ({ cname: s.cname, ...structLayout(model, s.def, s.version) }));
  const tables = model.versions.map((v) => ({ cname: `${model.table.cname}_v${v}_t`, ...tableLayout(model, v) }));
  return [...structs, ...tables];
}

export const emitLayout: Emitter = {
  output: 'plugin/abi/layout.generated.ts',
  source: 'codegen/emit/emitLayout.ts',
  emit(model) {
    const described = model.structs.filter((s) => s.fields);
    return render('layout.generated.ts.hbs', {
      banner: banner(this.source, 'ts'),
      versions: model.versions.join(', '),
      props: model.structs.find((s) => s.fields)?.cname ?? '',
      table: model.table.cname,
      layouts: layouts(model),
      fieldTables: described.map((s) => ({
        name: `${s.cname}_t`,
        ident: `${s.cname.replace(/^tsn_/, '')}Fields`,
        fields: fieldDescs(model, s),
      })),
    });
  },
};
