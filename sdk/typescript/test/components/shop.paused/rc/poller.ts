export function preflight () {}
export function pause () {}
