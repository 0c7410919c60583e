// `toa-node types DIR...`: each component's `types/index.d.ts`, generated from the manifests of
// the components given (as the original runtime generated it): an `<Operation>Input` per
// operation from its input schema, `Configuration` from the configuration schema, `State` (the
// entry a transition or an observation is given) from the entity's properties, and `Context`
// with `local` typed by the component's own operations and `remote` by every component given (a
// component with an entity also has the inherited `observe` and `enumerate`, and its operations
// take a `query`), an `<Event>Event` per event the entity publishes (the object as stored, or a
// deletion), and `Received`, the payload of each event the component's receivers take, by label.

import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parse } from 'yaml'

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/

/** A JSON Schema, as a manifest holds it: any JSON. @typedef {any} Schema */
/** A manifest (manifest.toa.yaml), parsed. @typedef {any} Manifest */
/** @typedef {{ directory: string, fullName: string, manifest: Manifest }} Component */
/** Components nested by the dots of their names (under `\0`, the one named so far). @typedef {Record<string, any>} Tree */

/** @param {string} name */
export function pascal (name) {
  return name.split(/[^A-Za-z0-9]+/).filter(Boolean).map((part) => part[0].toUpperCase() + part.slice(1)).join('')
}

const key = (/** @type {string} */ name) => IDENTIFIER.test(name) ? name : JSON.stringify(name)

/** A TypeScript type for a JSON Schema; what it cannot express is `unknown`. `filled`: the value
 * has its `default`s filled in (a configuration), so a property with one is always there.
 * @param {Schema} schema
 * @param {string} [indent]
 * @param {boolean} [filled]
 * @returns {string}
 */
export function typeOf (schema, indent = '', filled = false) {
  if (schema === undefined || schema === null || schema === true) return 'unknown'
  if (schema === false) return 'never'
  if (Array.isArray(schema.enum)) return schema.enum.map((/** @type {unknown} */ value) => JSON.stringify(value)).join(' | ')
  if ('const' in schema) return JSON.stringify(schema.const)
  for (const union of ['oneOf', 'anyOf']) {
    if (Array.isArray(schema[union])) return schema[union].map((/** @type {Schema} */ s) => typeOf(s, indent, filled)).join(' | ')
  }
  if (Array.isArray(schema.type)) return schema.type.map((/** @type {string} */ type) => typeOf({ ...schema, type }, indent, filled)).join(' | ')
  switch (schema.type) {
    case 'string': return 'string'
    case 'integer':
    case 'number': return 'number'
    case 'boolean': return 'boolean'
    case 'null': return 'null'
    case 'array': return `Array<${typeOf(schema.items, indent, filled)}>`
    case 'object': return objectType(schema, indent, filled)
    default: return 'unknown'
  }
}

/** @param {Schema} schema @param {string} indent @param {boolean} filled @returns {string} */
function objectType (schema, indent, filled) {
  const properties = Object.entries(schema.properties ?? {})
  // A map: the values' schema, when it gives one (`paid: { additionalProperties: { type: integer } }`).
  const values = typeof schema.additionalProperties === 'object' ? typeOf(schema.additionalProperties, indent, filled) : 'unknown'
  if (properties.length === 0) return `Record<string, ${values}>`
  const required = new Set(schema.required ?? [])
  const present = (/** @type {string} */ name, /** @type {Schema} */ property) => required.has(name) || (filled && property?.default !== undefined)
  const inner = indent + '  '
  const lines = properties.map(([name, property]) =>
    `${inner}${key(name)}${present(name, property) ? '' : '?'}: ${typeOf(property, inner, filled)}`)
  return `{\n${lines.join('\n')}\n${indent}}`
}

/** @param {string} directory @returns {Component} */
export function readManifest (directory) {
  const path = join(directory, 'manifest.toa.yaml')
  let manifest
  try {
    manifest = parse(readFileSync(path, 'utf8'))
  } catch (error) {
    throw new Error(`${path}: ${/** @type {Error} */ (error).message}`)
  }
  if (typeof manifest?.name !== 'string') throw new Error(`${path}: expected a manifest with a \`name\``)
  const fullName = manifest.namespace ? `${manifest.namespace}.${manifest.name}` : manifest.name
  return { directory, fullName, manifest }
}

/** The method a caller sees for one operation of `component`; `entity`: the component has one,
 * so the call may name its object (`query`, required when the operation declares `query: true`).
 * @param {string} component @param {string} name @param {any} operation @param {string} indent
 * @param {boolean} [entity]
 */
function method (component, name, operation, indent, entity = false) {
  const input = `${component}.${pascal(name)}Input`
  // No input, or one with no required field: the caller may leave it out.
  const optional = operation?.input === undefined || !operation.input.required?.length ? '?' : ''
  const query = !entity || operation?.query === false ? '' : `, query${operation?.query === true ? '' : '?'}: Query`
  if (operation?.stateful) {
    return `${indent}${key(name)} (request: { input${optional}: ${input}, instance: string${query}, key?: string }, options?: CallOptions): Promise<any>`
  }
  return `${indent}${key(name)} (request: { input${optional}: ${input}${query}, key?: string }, options?: TaskOptions): Promise<any>`
}

/** The input `enumerate` takes: a page of up to `limit` objects after the id `after`. */
const ENUMERATE = { type: 'object', properties: { limit: { type: 'integer' }, after: { type: 'string' } } }

/** The operations a caller sees: the declared ones, and with an entity the inherited `observe`
 * (by query) and `enumerate` (a page), unless declared.
 * @param {Manifest} manifest @returns {Array<[string, any]>} */
function operationsOf (manifest) {
  const declared = Object.entries(manifest.operations ?? {})
  if (manifest.entity === undefined) return declared
  const inherited = [['observe', { query: true }], ['enumerate', { query: false, input: ENUMERATE }]]
    .filter(([name]) => manifest.operations?.[/** @type {string} */ (name)] === undefined)
  return [...declared, .../** @type {Array<[string, any]>} */ (inherited)]
}

/** The entry of an object of `entity`: its properties (those `blank` has are always there), its
 * `id` and `VERSION`, and the flags a transition may set.
 * @param {any} entity */
function stateType (entity) {
  const properties = typeOf({ type: 'object', properties: entity.properties, required: Object.keys(entity.blank ?? {}) })
  return `${properties} & { id: string, VERSION: number, DISCARD?: boolean, DELETE?: boolean }`
}

/** What an event of `entity` carries: the object as the write stored it, with its `id` and
 * `VERSION`, or a deletion's tombstone.
 * @param {any} entity @param {string} indent */
function eventType (entity, indent) {
  const properties = typeOf({ type: 'object', properties: entity.properties, required: Object.keys(entity.blank ?? {}) }, indent)
  return `(${properties} & { id: string, VERSION: number, DELETED?: never }) | { id: string, VERSION: number, DELETED: true }`
}

/** The events a manifest declares, by name. @param {Manifest} manifest @returns {string[]} */
const eventsOf = (manifest) => manifest.entity === undefined ? [] : Object.keys(manifest.events ?? {})

/** The namespace `Components` declares: per component, its inputs, as `<Namespace><Name>.XInput`,
 * and its events' payloads, as `<Namespace><Name>.XEvent`.
 * @param {Component} component
 */
function componentNamespace ({ fullName, manifest }) {
  const lines = [`  export namespace ${pascal(fullName)} {`]
  for (const [name, operation] of operationsOf(manifest)) {
    const input = operation?.input === undefined ? 'null' : typeOf(operation.input, '    ')
    lines.push(`    export type ${pascal(name)}Input = ${input}`)
  }
  for (const name of eventsOf(manifest)) {
    lines.push(`    export type ${pascal(name)}Event = ${eventType(manifest.entity, '    ')}`)
  }
  lines.push('  }')
  return lines.join('\n')
}

/** `Received`: the payload of each event `component` receives, by its label (`unknown` for an
 * event of a component not given).
 * @param {Component} component @param {Component[]} components */
function receivedType (component, components) {
  const lines = ['export interface Received {']
  for (const label of Object.keys(component.manifest.receivers ?? {})) {
    const dot = label.lastIndexOf('.')
    const sender = components.find((c) => c.fullName === label.slice(0, dot))
    const event = label.slice(dot + 1)
    const known = sender !== undefined && eventsOf(sender.manifest).includes(event)
    lines.push(`  ${JSON.stringify(label)}: ${known ? `Components.${pascal(sender.fullName)}.${pascal(event)}Event` : 'unknown'}`)
  }
  lines.push('}', '')
  return lines
}

/** `remote`: components nested by the dots of their names.
 * @param {Component[]} components
 * @param {string} [indent]
 */
function remoteType (components, indent = '  ') {
  /** @type {Tree} */
  const tree = {}
  for (const component of components) {
    let node = tree
    for (const part of component.fullName.split('.')) node = (node[part] ??= {})
    node['\0'] = component
  }
  /** @type {(node: Tree, indent: string) => string[]} */
  const render = (node, indent) => {
    /** @type {string[]} */
    const lines = []
    for (const [name, child] of Object.entries(node)) {
      if (name === '\0') continue
      const inner = indent + '  '
      const own = child['\0']
      const members = own ? operationsOf(own.manifest).map(([op, operation]) => method(`Components.${pascal(own.fullName)}`, op, operation, inner, own.manifest.entity !== undefined)) : []
      lines.push(`${indent}${key(name)}: {`, ...members, ...render(child, inner), `${indent}}`)
    }
    return lines
  }
  return render(tree, indent)
}

/** @param {Component} component @param {Component[]} components */
export function generate (component, components) {
  const self = `Components.${pascal(component.fullName)}`
  const lines = [
    `// Generated by \`toa-node types\` from ${component.fullName}'s manifest.toa.yaml and its neighbours'. Do not edit.`,
    "import type { CallOptions, Context as Base, OperationError, TaskOptions } from 'toa-component'",
    '',
    '/** The object a call works on, and the version the caller saw. */',
    'type Query = { id?: string, version?: number }',
    '',
    'declare namespace Components {',
    ...components.map(componentNamespace),
    '}',
    ''
  ]
  for (const [name] of operationsOf(component.manifest)) {
    lines.push(`export type ${pascal(name)}Input = ${self}.${pascal(name)}Input`)
  }
  for (const [name, operation] of Object.entries(component.manifest.operations ?? {})) {
    const codes = /** @type {string[]} */ (operation?.errors ?? [])
    if (codes.length) lines.push(`export type ${pascal(name)}Error = OperationError<${codes.map((code) => JSON.stringify(code)).join(' | ')}>`)
  }
  for (const name of eventsOf(component.manifest)) {
    lines.push(`export type ${pascal(name)}Event = ${self}.${pascal(name)}Event`)
  }
  const configuration = component.manifest.configuration
  if (component.manifest.entity !== undefined) lines.push(`export type State = ${stateType(component.manifest.entity)}`)
  const entity = component.manifest.entity !== undefined
  lines.push(
    `export type Configuration = ${configuration === undefined ? 'Record<string, never>' : typeOf(configuration, '', true)}`,
    '',
    'export interface Local {',
    ...operationsOf(component.manifest).map(([name, operation]) => method(self, name, operation, '  ', entity)),
    '}',
    '',
    'export interface Remote {',
    ...remoteType(components),
    '}',
    '',
    ...receivedType(component, components),
    'export type Context = Base<Local, Remote, Configuration>',
    ''
  )
  return lines.join('\n')
}

/** Writes `types/index.d.ts` into every component directory given; the paths written.
 * @param {string[]} directories
 */
export function writeTypes (directories) {
  const components = directories.map(readManifest)
  return components.map((component) => {
    mkdirSync(join(component.directory, 'types'), { recursive: true })
    const path = join(component.directory, 'types', 'index.d.ts')
    writeFileSync(path, generate(component, components))
    return path
  })
}
