// components/terminals/operations/connect.ts
import type { ConnectInput, Context } from '../types/index.d.ts'
import { open } from '../stand-ins.ts'

export async function effect (input: ConnectInput, context: Context) {
  context.state.connections.set(input.terminal, await open(input.address))

  await context.local.assign({
    query: { id: input.terminal },
    input: { holder: context.instance }
  })
}
