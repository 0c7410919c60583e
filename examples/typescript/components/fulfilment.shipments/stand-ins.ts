// What the seed leaves to the reader: booking the carrier. Each booking is appended to $BOOKINGS
// (when set), so that a test can count them; it takes 200 ms, as a call to a carrier would.
import { appendFileSync } from 'node:fs'
import type { Context } from './types/index.d.ts'

export async function book (shipment: { id: string }, context: Context): Promise<string> {
  await new Promise((resolve) => setTimeout(resolve, 200))
  if (process.env.BOOKINGS) appendFileSync(process.env.BOOKINGS, JSON.stringify({ order: shipment.id, instance: context.instance }) + '\n')
  return `parcel-${shipment.id}`
}
