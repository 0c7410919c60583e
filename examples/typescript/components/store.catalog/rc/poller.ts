// components/store.catalog/rc/poller.ts
import type { Context } from '../types/index.d.ts'
import { poll } from '../stand-ins.ts'

export function preflight (context: Context) {
  context.state.poller = setInterval(() => poll(context), 1000)
}

export function pause (context: Context) {
  clearInterval(context.state.poller)
}

export const resume = preflight

export const dispose = pause
