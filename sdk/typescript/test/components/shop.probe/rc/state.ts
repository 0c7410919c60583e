export function preflight (context: any) { context.state.started = true }
