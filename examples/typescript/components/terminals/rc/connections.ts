// components/terminals/rc/connections.ts
import type { Context } from '../types/index.d.ts'

export function preflight (context: Context) {
  context.state.connections = new Map()
}

export async function dispose (context: Context) {
  for (const connection of context.state.connections.values()) await connection.close()
}
