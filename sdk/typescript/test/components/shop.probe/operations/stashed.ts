// The stash, one step at a time: `get`, `set` or `delete`, and what it answered or threw. `size`:
// set a string of that many characters (larger than a call's input may be).
export async function computation (input: { op: 'get' | 'set' | 'delete', key: string, value?: unknown, ttl?: number, size?: number }, context: any) {
  try {
    const value = input.size === undefined ? input.value : 'x'.repeat(input.size)
    const done = input.op === 'set'
      ? await context.stash.set(input.key, value, input.ttl)
      : await context.stash[input.op](input.key)
    return { done: done ?? null }
  } catch (error: any) {
    return { error: { name: error.name, code: error.code, message: error.message } }
  }
}
