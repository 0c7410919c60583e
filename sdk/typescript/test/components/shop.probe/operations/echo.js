// JavaScript modules load as TypeScript ones do.
export const computation = (input) => input
