export async function computation (input: null, context: any) {
  const seen: unknown[] = []
  await new Promise<void>((resolve) => {
    const off = context.atom.onassigned((assignment: unknown) => {
      seen.push(assignment)
      off()
      resolve()
    })
  })
  return { first: seen[0], slots: context.atom.slots(4) }
}
