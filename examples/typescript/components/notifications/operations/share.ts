// Not in the seed: which of the 16 partitions this replica drains now (null: none for sure).
import type { Context } from '../types/index.d.ts'

export function computation (input: null, context: Context) {
  return context.atom.slots(16)
}
