// components/store.orders/operations/pay.ts
import type { Context, PayInput } from '../types/index.d.ts'

const ADDRESSEE = 403
const ABANDONED = 404

export async function effect (input: PayInput, context: Context) {
  const terminal = await context.remote.terminals.observe({
    query: { id: input.terminal }
  })

  try {
    return await context.remote.terminals.charge({
      input: { terminal: terminal.id, amount: input.amount },
      instance: terminal.holder
    })
  } catch (exception: any) {
    if (exception.code === ADDRESSEE) return new Error('TERMINAL_OFFLINE')
    if (exception.code === ABANDONED) return new Error('TERMINAL_UNCERTAIN')

    throw exception
  }
}
