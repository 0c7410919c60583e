// components/fulfilment.shipments/operations/book.ts
import type { BookInput, Context } from '../types/index.d.ts'
import { book } from '../stand-ins.ts'

export async function effect (input: BookInput, context: Context) {
  return await context.atom.lock(`booking:${input.order}`, async () => {
    const shipment = await context.local.observe({ query: { id: input.order } })

    if (shipment.booking !== undefined) return shipment // whoever held the lock before did it

    const booking = await book(shipment, context)

    return await context.local.assign({ query: { id: input.order }, input: { booking } })
  })
}
