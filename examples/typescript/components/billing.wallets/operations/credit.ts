// components/billing.wallets/operations/credit.ts
import type { CreditInput, State } from '../types/index.d.ts'

// Accumulates, and has nothing to be keyed by: declared `once`, and reached by an event, whose
// receiver runs it once per event.
export async function transition (input: CreditInput, entry: State) {
  entry.balance += input.amount

  return { balance: entry.balance }
}
