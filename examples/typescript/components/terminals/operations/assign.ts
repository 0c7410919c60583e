// Stands in for the entity's inherited `assign`: records the terminal's holder.
import type { AssignInput, Context } from '../types/index.d.ts'
import { store } from '../stand-ins.ts'

export async function effect (input: AssignInput, context: Context) {
  store.write(input.id, { id: input.id, holder: input.holder })
}
