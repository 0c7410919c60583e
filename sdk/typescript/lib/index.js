export { CallError } from './errors.js'
export { Context } from './context.js'
