// components/store.orders/operations/cancel.ts
import type { State } from '../types/index.d.ts'

// Only the order changes here. Giving the money back is a consequence: it is left to the
// `cancelled` event, which is published once, for the run that was stored (seed 003, "once does
// not help"), and billing.wallets' receiver of it credits the wallet.
export async function transition (input: null, entry: State) {
  if (entry.status === 'cancelled') {
    entry.DISCARD = true // asked again: it is cancelled already

    return entry
  }

  entry.status = 'cancelled'

  return entry
}
