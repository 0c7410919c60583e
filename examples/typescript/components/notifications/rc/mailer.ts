// components/notifications/rc/mailer.ts
import type { Context } from '../types/index.d.ts'
import { connect } from '../stand-ins.ts'

export async function preflight (context: Context) {
  context.state.mailer = await connect(context.configuration)
}

export async function dispose (context: Context) {
  await context.state.mailer.close()
}
