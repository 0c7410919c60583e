// The public declarations (index.d.ts, stage.d.ts: what a component's TypeScript sees) checked
// against the code (lib/*.js, typed with JSDoc), by `npx tsc -p tsconfig.json`: each module
// exports the same values as its declarations, each of a type its declaration accepts.
import * as sdk from '../lib/index.js'
import * as stage from '../lib/stage.js'
import type * as Declared from '../index.js'

declare const declared: typeof import('../index.js')
declare const declaredStage: typeof import('../stage.js')

// The same names exported, both ways.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
const names: Same<keyof typeof sdk, keyof typeof declared> = true
const stageNames: Same<'compose', keyof typeof declaredStage> = true

// Each export as its declaration says.
const values: typeof import('../index.js') = sdk
const stageValues: Pick<typeof import('../stage.js'), 'compose'> = stage

// The context an operation gets is the declared `Context`, also with its type parameters.
const context: Declared.Context = new sdk.Context()
const typed: Declared.Context<{ appraise: () => Promise<unknown> }, unknown, { limit: number }> = new sdk.Context()

// A failed call: the declared `CallError`, with its `code`.
const error: Declared.CallError = new sdk.CallError({ code: 'Addressee', number: 403 })

export { names, stageNames, values, stageValues, context, typed, error }
