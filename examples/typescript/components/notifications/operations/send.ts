// components/notifications/operations/send.ts
import type { Context, SendInput } from '../types/index.d.ts'

export async function effect (input: SendInput, context: Context) {
  await context.state.mailer.send(input.to, input.text)
}
