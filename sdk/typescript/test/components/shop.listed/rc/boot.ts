export function preflight () {}
