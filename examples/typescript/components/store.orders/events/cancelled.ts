// components/store.orders/events/cancelled.ts
import type { CancelledEvent, State } from '../types/index.d.ts'

// Published when an approved order is cancelled: its money was taken, and goes back. A pending
// order cancelled took nothing.
export function condition (entry: CancelledEvent, previous: State | null) {
  return !entry.DELETED && entry.status === 'cancelled' && previous?.status === 'approved'
}
