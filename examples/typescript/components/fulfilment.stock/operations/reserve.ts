// components/fulfilment.stock/operations/reserve.ts
import type { ReserveInput, State } from '../types/index.d.ts'

export async function transition (input: ReserveInput, entry: State) {
  if (entry.available < input.quantity) return new Error('OUT_OF_STOCK')

  entry.available -= input.quantity

  return entry
}
