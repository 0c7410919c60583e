// components/store.orders/operations/approve.ts
import type { Context, State } from '../types/index.d.ts'

export async function transition (input: null, entry: State, context: Context) {
  if (entry.status === 'approved') {
    entry.DISCARD = true // asked again: it is approved already

    return entry
  }

  if (entry.status !== 'pending') return new Error('NOT_PENDING')

  // made on every attempt
  const debit = await context.remote.billing.wallets.debit({
    query: { id: entry.customer },
    input: { amount: entry.total, ref: entry.id }
  })

  if (debit instanceof Error) return debit

  entry.status = 'approved'

  return entry
}
