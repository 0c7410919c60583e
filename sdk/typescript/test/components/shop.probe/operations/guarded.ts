// Work under the lock `shared`: what happened is kept (`ran`, or the lock's error code) for
// `guardlog`, since the caller may have been told the call failed long before.
export async function effect (input: null, context: any) {
  const log = (context.state.guarded ??= [])
  try {
    await context.atom.lock('shared', async () => { log.push('ran') })
  } catch (error: any) {
    log.push(error.code)
    throw error
  }
  return null
}
