// components/notifications/receivers/store.orders.approved.ts
import type { Received } from '../types/index.d.ts'

export const request = (payload: Received['store.orders.approved']) => {
  if (payload.DELETED) throw new Error('an order is approved, never deleted')

  return { input: { to: payload.customer, text: `Your order ${payload.id} is approved.` } }
}
