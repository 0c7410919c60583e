// Not in the seed: how many times this process's poller polled (see stand-ins.ts).
import type { Context } from '../types/index.d.ts'

export function computation (input: null, context: Context) {
  return { polls: context.state.polls ?? 0 }
}
