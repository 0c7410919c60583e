// Every way a call can end, as the caller sees it: `{ code, name }` of what it threw, or `reply`.
const outcome = async (call: () => Promise<unknown>) => {
  try {
    const reply = await call()
    return reply instanceof Error ? { error: reply.message } : { reply }
  } catch (exception: any) {
    return { code: exception.code, name: exception.name }
  }
}

export async function computation (input: null, context: any) {
  const instance = context.instance
  const aborted = AbortSignal.abort()
  return {
    local: await outcome(() => context.local.echo({ input: { hello: 1 }, instance })),
    nobody: await outcome(() => context.remote.shop.nobody.anything({ input: {} })),
    refused: await outcome(() => context.local.refuse({ input: null })),
    abortedBefore: await outcome(() => context.local.slow({ input: { ms: 10 }, instance }, { signal: aborted })),
    abortedDuring: await outcome(() => context.local.slow({ input: { ms: 3000 }, instance }, { signal: AbortSignal.timeout(200) })),
    timedOut: await outcome(() => context.local.slow({ input: { ms: 3000 }, instance }, { timeout: 200 })),
    signalOnOrdinary: await outcome(() => context.local.refuse({ input: null }, { signal: new AbortController().signal })),
    noInstance: await outcome(() => context.local.echo({ input: {} })),
    failed: await outcome(() => context.local.fail({ input: null })),
    unknownField: await context.local.refuse({ input: null, qeury: { id: 'x' } }).catch((e: any) => ({ code: e.code, message: e.message })),
    unknownOption: await outcome(() => context.local.refuse({ input: null }, { timeuot: 5 })),
    task: await outcome(() => context.local.tasked({ input: { n: 7 } }, { discard: true })),
    taskRan: await ran(context, 7),
    signalOnTask: await outcome(() => context.local.echo({ input: {}, instance }, { discard: true, signal: new AbortController().signal }))
  }
}

// The task runs after the call that sent it returned: waited for here, at most 5 s.
async function ran (context: any, n: number) {
  for (const deadline = Date.now() + 5000; Date.now() < deadline;) {
    if (context.state.tasked?.includes(n)) return true
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
  return false
}
