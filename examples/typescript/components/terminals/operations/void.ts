// components/terminals/operations/void.ts
import type { Context, VoidInput } from '../types/index.d.ts'

// A cancelled order's charge is voided on the terminal that took it, by the process that holds
// its connection: seed 001's receiver names that process (receivers/store.orders.cancelled.ts).
export async function effect (input: VoidInput, context: Context) {
  const connection = context.state.connections.get(input.terminal)

  if (connection === undefined) return new Error('NOT_HELD')

  return await connection.void()
}
