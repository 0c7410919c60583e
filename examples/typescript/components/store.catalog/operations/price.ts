// components/store.catalog/operations/price.ts
import type { Context, PriceInput } from '../types/index.d.ts'
import { lookup } from '../stand-ins.ts'

export async function computation (input: PriceInput, context: Context) {
  context.state.prices ??= new Map()

  if (!context.state.prices.has(input.product))
    context.state.prices.set(input.product, await lookup(input.product))

  return context.state.prices.get(input.product)
}
