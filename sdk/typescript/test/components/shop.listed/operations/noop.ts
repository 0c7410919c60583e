export function effect () { return null }
