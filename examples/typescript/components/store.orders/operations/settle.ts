// components/store.orders/operations/settle.ts
import type { Context } from '../types/index.d.ts'
import { collect, submit } from '../stand-ins.ts'

export async function effect (input: null, context: Context) {
  return await context.atom.lock('settlement', async (signal) => {
    const batch = await collect(context)

    if (signal.aborted) throw signal.error

    await submit(batch, context)

    return { submitted: batch.length, token: signal.token }
  })
}
