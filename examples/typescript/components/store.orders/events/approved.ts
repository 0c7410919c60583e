// components/store.orders/events/approved.ts
import type { ApprovedEvent, State } from '../types/index.d.ts'

// Published by the write that approved the order, not by every later change of it.
export function condition (entry: ApprovedEvent, previous: State | null) {
  return !entry.DELETED && entry.status === 'approved' && previous?.status !== 'approved'
}
