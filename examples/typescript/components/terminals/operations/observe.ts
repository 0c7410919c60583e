// Stands in for the entity's `observe`: the terminal as recorded, or null.
import type { Context, ObserveInput } from '../types/index.d.ts'
import { store } from '../stand-ins.ts'

export async function observation (input: ObserveInput, context: Context) {
  return store.read(input.id)
}
