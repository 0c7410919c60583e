// A lock released as usual does not abort its signal (nothing was lost).
export async function computation (input: null, context: any) {
  let aborted = false
  await context.atom.lock('probe', async (signal: AbortSignal) => {
    signal.addEventListener('abort', () => { aborted = true })
  })
  await new Promise((resolve) => setTimeout(resolve, 200))
  return { aborted }
}
