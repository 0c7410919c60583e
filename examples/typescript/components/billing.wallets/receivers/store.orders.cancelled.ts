// components/billing.wallets/receivers/store.orders.cancelled.ts
import type { Received } from '../types/index.d.ts'

export const request = (payload: Received['store.orders.cancelled']) => {
  if (payload.DELETED) throw new Error('an order is cancelled, never deleted')

  return { query: { id: payload.customer }, input: { amount: payload.total } }
}
