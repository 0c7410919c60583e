// What the seeds leave to the reader: the paid appraisal service, the price lookup, the poll.
import type { Context } from './types/index.d.ts'

export async function appraise (product: string, context: Context) {
  return { product, price: 42 }
}

export async function lookup (product: string) {
  return { product, price: 42 }
}

/** Counts the polls in the process's state, where `polls` reads them. */
export function poll (context: Context) {
  context.state.polls = (context.state.polls ?? 0) + 1
}
