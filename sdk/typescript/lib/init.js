// `toa init`: a new project's files, as docs/first-project.md walks through them: the package's
// scripts, the tsconfig.json the seeds' `import type … from '../types/index.d.ts'` style needs,
// a context file and one component. Nothing that exists is overwritten.

import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { basename, dirname, join, resolve } from 'node:path'

/** The scripts a project runs the seeds' commands with. */
export const SCRIPTS = {
  types: 'toa-node types components/*',
  check: 'tsc --noEmit -p .',
  restart: 'toa restart ./components/*',
  stop: 'toa stop'
}

const TSCONFIG = {
  compilerOptions: {
    strict: true,
    noEmit: true,
    target: 'es2022',
    module: 'nodenext',
    moduleResolution: 'nodenext',
    allowImportingTsExtensions: true,
    types: ['node']
  },
  include: ['components/**/*.ts']
}

/** The application's name: the directory's, as the context's `name` takes it. @param {string} dir */
const applicationOf = (dir) => basename(resolve(dir)).toLowerCase().replace(/[^a-z0-9-]/g, '-').replace(/^-+|-+$/g, '') || 'app'

/** @param {string} application */
const files = (application) => ({
  'context.toa.yaml': `# The application's context (docs/context.md): its name, and what each environment uses.
# Locally, with nothing else named, components coordinate, call and keep entities in-process.
name: ${application}
`,
  '.gitignore': 'node_modules/\n# What `npm run restart` keeps: the running application\'s pid, address and log.\n.toa/\n',
  'tsconfig.json': JSON.stringify(TSCONFIG, null, 2) + '\n',
  [`components/${application}.greeter/manifest.toa.yaml`]: `# One component: its operations, each with its input's schema and the error codes it answers.
name: greeter
namespace: ${application}

operations:
  greet:
    type: computation
    input:
      type: object
      properties:
        name: { type: string }
      required: [name]
    errors: [NO_NAME]
`,
  [`components/${application}.greeter/operations/greet.ts`]: `// components/${application}.greeter/operations/greet.ts
import type { Context, GreetInput } from '../types/index.d.ts'

export async function computation (input: GreetInput, context: Context) {
  if (input.name.trim() === '') return new Error('NO_NAME')

  return { greeting: \`Hello, \${input.name}\` }
}
`
})

/** Writes the project's files into `dir`; the paths written. Throws naming what is in the way,
 * before writing anything.
 * @param {string} dir
 */
export function init (dir = '.') {
  const application = applicationOf(dir)
  const planned = Object.entries(files(application))
  const taken = planned.map(([path]) => path).filter((path) => existsSync(join(dir, path)))
  if (taken.length) throw new Error(`init writes nothing over what exists: ${taken.join(', ')} already here`)
  const manifest = withScripts(dir, application)
  for (const [path, text] of planned) {
    mkdirSync(dirname(join(dir, path)), { recursive: true })
    writeFileSync(join(dir, path), text)
  }
  writeFileSync(join(dir, 'package.json'), JSON.stringify(manifest, null, 2) + '\n')
  return [...planned.map(([path]) => path), 'package.json']
}

/** The project's package.json (a new one when there is none) with the scripts and
 * `"type": "module"`; throws naming a script of the same name that does something else.
 * @param {string} dir @param {string} application
 */
function withScripts (dir, application) {
  const path = join(dir, 'package.json')
  const manifest = existsSync(path) ? JSON.parse(readFileSync(path, 'utf8')) : { name: application, private: true }
  const own = /** @type {Record<string, string>} */ (manifest.scripts ?? {})
  const clash = Object.entries(SCRIPTS).filter(([name, command]) => own[name] !== undefined && own[name] !== command)
  if (clash.length) throw new Error(`package.json has other scripts named ${clash.map(([name]) => name).join(', ')}: init leaves everything as it is; add toa's by hand (docs/first-project.md)`)
  return { ...manifest, type: 'module', scripts: { ...own, ...SCRIPTS } }
}
