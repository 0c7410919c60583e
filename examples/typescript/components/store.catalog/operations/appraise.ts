// components/store.catalog/operations/appraise.ts
import type { AppraiseInput, Context } from '../types/index.d.ts'
import { appraise } from '../stand-ins.ts'

const COST = 6_000 // one request is worth 6 seconds: ten per minute
const WINDOW = 60_000

export async function effect (input: AppraiseInput, context: Context) {
  const [debt] = await context.atom.meter([`appraise:${input.customer}`], [COST])

  if (debt > WINDOW) return new Error('TOO_MANY_REQUESTS')

  return await appraise(input.product, context)
}
