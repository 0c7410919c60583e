// components/notifications/operations/drain.ts
import type { Context } from '../types/index.d.ts'
import { drain } from '../stand-ins.ts'

export async function effect (input: null, context: Context) {
  const slots = context.atom.slots(16)

  if (slots === null) return

  for (const partition of slots)
    await drain(partition, context)
}
