// components/terminals/operations/charge.ts
import type { ChargeInput, Context } from '../types/index.d.ts'

export async function computation (input: ChargeInput, context: Context) {
  const connection = context.state.connections.get(input.terminal)

  if (connection === undefined) return new Error('NOT_HELD')

  return await connection.charge(input.amount)
}
