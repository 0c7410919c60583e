"""Both SDKs against the protocol: the fields `agent/openapi.yaml` documents (and the program's
environment variables docs/component-protocol.md lists), compared with the ones each SDK
declares in its protocol module, the one its code takes its routes and body types from:

- Python: `sdk/python/toa/protocol.py`, TypedDicts and `Route`s (read by importing it);
- TypeScript: `sdk/typescript/lib/protocol.js`, JSDoc typedefs and `ROUTES`, whose field maps
  `tsc` checks to be exactly the typedefs' keys (read by importing it with node).

A field is named `METHOD /path WHERE name`: WHERE is `path`, `query` or `header` (a parameter),
`request` (the JSON body's properties, nested ones dotted), `response` (a 2xx answer's JSON) or
`error` (a 4xx or 5xx answer's JSON); `METHOD /path` alone is the route, `env NAME` a variable.
Each SDK's list of what it still lacks is below: the test fails when the SDK declares a field
the protocol does not have, lacks one that is not listed, or has one that is listed.

    python3 sdk/test_protocol.py            # after npm ci --prefix sdk/typescript
"""

import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
OPENAPI = ROOT / "agent" / "openapi.yaml"
PROTOCOL_DOC = ROOT / "docs" / "component-protocol.md"
PYTHON = ROOT / "sdk" / "python"
TYPESCRIPT = ROOT / "sdk" / "typescript"

METHODS = ("get", "put", "post", "delete", "patch")


def route(name, *fields):
    """`name` and its fields, e.g. route("GET /v1/instance", "response instance")."""
    return {name, *(f"{name} {field}" for field in fields)}


# The agent's error body, on a 4xx or 5xx answer.
ERROR = ("error error", "error error.code", "error error.number", "error error.message")
# The control endpoint's answer: the process's status.
STATUS = tuple(f"response {name}" for name in (
    "phase", "halt", "instance", "calls", "calls.since_pause", "calls.last_at_ms", "calls.in_flight",
    "failure", "failure.halt", "failure.command", "failure.message"))

# Neither SDK reads these: the probes and metrics are the kubelet's and Prometheus's, `instance`
# comes as TOA_INSTANCE, the control endpoint is the operator's (the stages halt and resume with
# it but read only the status code, and do not ask for the status), a drain's or a failed
# listener's refusal is only logged by status.
BOTH = (
    route("GET /healthz")
    | route("GET /metrics")
    | route("GET /v1/instance", "response instance")
    | route("GET /control/status", "header Authorization", *STATUS, *ERROR)
    | {f"POST /control/halt {field}" for field in STATUS + ERROR}
    | {f"POST /control/resume {field}" for field in STATUS + ERROR}
    | {f"POST /v1/drain {field}" for field in ERROR}
    | {f"POST /v1/{{component}}/onassigned/{{listener}}/failed {field}" for field in ERROR}
    # The SDKs send the caller's version as `query.version`; `If-Match` is for other HTTP clients.
    | {"POST /v1/call/{component}/{operation} header If-Match"}
)

# What each SDK does not speak (yet). Keep these exact: the test fails either way.
LACKING = {
    "python": BOTH,
    "typescript": BOTH | {
        # `slots` answers from the onassigned stream, not from this route.
        *route("GET /v1/{component}/slots", "path component", "query total", "header Authorization",
               "response slots", *ERROR),
    },
}


# --- The protocol -----------------------------------------------------------------------------


def resolve(spec, node):
    while isinstance(node, dict) and "$ref" in node:
        target = spec
        for part in node["$ref"].lstrip("#/").split("/"):
            target = target[part]
        node = target
    return node


def schema_fields(spec, schema, prefix=""):
    """The properties of `schema`, nested ones dotted (`error.code`), array items' as `name[].x`."""
    schema = resolve(spec, schema)
    fields = set()
    if not isinstance(schema, dict):
        return fields
    for name, property_ in (schema.get("properties") or {}).items():
        property_ = resolve(spec, property_)
        fields.add(prefix + name)
        fields |= schema_fields(spec, property_, f"{prefix}{name}.")
        if isinstance(property_, dict) and property_.get("type") == "array":
            fields |= schema_fields(spec, property_.get("items"), f"{prefix}{name}[].")
    return fields


def body_fields(spec, body):
    fields = set()
    for media in (resolve(spec, body).get("content") or {}).values():
        fields |= schema_fields(spec, media.get("schema"))
    return fields


def security_headers(spec, requirements):
    headers = set()
    schemes = spec["components"]["securitySchemes"]
    for requirement in requirements or []:
        for name in requirement:
            scheme = schemes[name]
            if scheme["type"] == "apiKey" and scheme["in"] == "header":
                headers.add(scheme["name"])
            elif scheme["type"] == "http":
                headers.add("Authorization")
    return headers


def environment():
    """The variables the agent starts the program with: the table after that sentence."""
    text = PROTOCOL_DOC.read_text()
    table = text.split("The agent starts the program with these variables:", 1)[1]
    names = []
    for line in table.strip().splitlines():
        if not line.startswith("|"):
            break
        match = re.match(r"\|\s*`(TOA_[A-Z_{}]+)`", line)
        if match:
            names.append(match.group(1))
    assert names, f"{PROTOCOL_DOC}: no table of the program's variables"
    return {f"env {name}" for name in names}


def protocol():
    """Every field agent/openapi.yaml and the program's variables define."""
    spec = yaml.safe_load(OPENAPI.read_text())
    fields = environment()
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            route = f"{method.upper()} {path}"
            fields.add(route)
            for parameter in item.get("parameters", []) + operation.get("parameters", []):
                parameter = resolve(spec, parameter)
                fields.add(f"{route} {parameter['in']} {parameter['name']}")
            for header in security_headers(spec, operation.get("security")):
                fields.add(f"{route} header {header}")
            if "requestBody" in operation:
                fields |= {f"{route} request {f}" for f in body_fields(spec, operation["requestBody"])}
            for status, response in operation.get("responses", {}).items():
                where = "response" if str(status).startswith("2") else "error"
                fields |= {f"{route} {where} {f}" for f in body_fields(spec, response)}
    return fields


# --- What each SDK declares -------------------------------------------------------------------


def declared(routes, variables):
    """The fields a protocol module declares: `routes` as plain data (method, path, query,
    headers, and request/response/error as nested field maps: name → True or a nested map)."""

    def flatten(fields, prefix=""):
        names = set()
        for name, value in fields.items():
            names.add(prefix + name)
            if isinstance(value, dict):
                names |= flatten(value, f"{prefix}{name}.")
        return names

    fields = {f"env {name}" for name in variables}
    for route in routes:
        name = f"{route['method']} {route['path']}"
        fields.add(name)
        fields |= {f"{name} path {p}" for p in re.findall(r"\{(\w+)\}", route["path"])}
        fields |= {f"{name} query {q}" for q in route.get("query", [])}
        fields |= {f"{name} header {h}" for h in route.get("headers", [])}
        for where in ("request", "response", "error"):
            if route.get(where):
                fields |= {f"{name} {where} {f}" for f in flatten(route[where])}
    return fields


def typed_fields(kind):
    """A TypedDict's keys as a field map; nested TypedDicts (also optional, or in a list, as
    `name[]`) as nested maps."""
    fields = {}
    for name, hint in typing.get_type_hints(kind).items():
        fields[name] = True
        for inner in (hint, *typing.get_args(hint)):
            if typing.is_typeddict(inner):
                fields[name] = typed_fields(inner)
            elif typing.get_origin(inner) is list and typing.is_typeddict(typing.get_args(inner)[0]):
                fields[name] = True
                fields[f"{name}[]"] = typed_fields(typing.get_args(inner)[0])
    return fields


def python_sdk():
    sys.path.insert(0, str(PYTHON))
    from toa import protocol as module

    routes = []
    for route in module.ROUTES:
        routes.append({
            "method": route.method,
            "path": route.path,
            "query": list(route.query),
            "headers": list(route.headers),
            **{where: typed_fields(getattr(route, where)) for where in ("request", "response", "error")
               if getattr(route, where) is not None},
        })
    return declared(routes, module.ENVIRONMENT), PYTHON / "toa", "protocol.py"


def typescript_sdk():
    script = ("const m = await import('./lib/protocol.js');"
              "console.log(JSON.stringify({ routes: m.ROUTES, environment: m.ENVIRONMENT }))")
    out = subprocess.run(["node", "--input-type=module", "-e", script], cwd=TYPESCRIPT,
                         check=True, capture_output=True, text=True).stdout
    module = json.loads(out)
    return declared(module["routes"], module["environment"]), TYPESCRIPT / "lib", "protocol.js"


def used_variables(directory, protocol_module, fields):
    """The declared variables the SDK's other modules do not name (exactly: the whole name, or
    up to the `{` of a pattern)."""
    sources = "\n".join(p.read_text() for p in sorted(directory.iterdir())
                        if p.suffix in (".py", ".js") and p.name != protocol_module)
    unused = set()
    for field in fields:
        if field.startswith("env "):
            name = field[4:].split("{")[0]
            pattern = re.escape(name) if name.endswith("_") else re.escape(name) + r"\b"
            if not re.search(r"(?<![A-Z_])" + pattern, sources):
                unused.add(field)
    return unused


def main():
    fields = protocol()
    failures = []
    for sdk, read in (("python", python_sdk), ("typescript", typescript_sdk)):
        has, directory, module = read()
        lacking = LACKING[sdk]
        problems = [
            ("declared but not in agent/openapi.yaml (or the program's variables)", has - fields),
            ("lacking but not listed in LACKING", fields - has - lacking),
            ("listed in LACKING but declared: take it off the list", lacking & has),
            ("listed in LACKING but not in the protocol", lacking - fields),
            ("declared variables the SDK's code never names", used_variables(directory, module, has)),
        ]
        for what, names in problems:
            if names:
                failures.append(f"{sdk}: {what}:\n" + "\n".join(f"    {n!r}," for n in sorted(names)))
        print(f"{sdk}: {len(has & fields)} of {len(fields)} protocol fields declared, {len(lacking)} lacking (listed)")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
