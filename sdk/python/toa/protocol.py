"""The agent's protocol as this SDK speaks it (agent/openapi.yaml, docs/component-protocol.md): the
routes it calls or serves and the bodies it sends and reads, as TypedDicts. The rest of the SDK
takes its routes and body types from here; `sdk/test_protocol.py` compares what is declared here
with agent/openapi.yaml (and lists what the SDK still lacks)."""

from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type, TypedDict

# The variables the agent starts the program with (docs/component-protocol.md).
ENVIRONMENT = (
    "TOA_PORT",
    "TOA_AGENT",
    "TOA_COMPONENT",
    "TOA_INSTANCE",
    "TOA_AGENT_TOKEN",
    "TOA_AGENT_TOKEN_FILE",
    "TOA_CONFIGURATION",
    "TOA_SECRET_{NAME}",
)


class ErrorDetail(TypedDict, total=False):
    code: str
    number: Optional[int]
    message: Optional[str]


class ErrorBody(TypedDict, total=False):
    """The agent's refusal, with a 4xx or 5xx status."""

    error: ErrorDetail


class OperationError(TypedDict, total=False):
    code: str
    message: Optional[str]


class Outcome(TypedDict, total=False):
    """An operation's answer: `reply`, or its own `error`."""

    reply: Any
    error: OperationError


class Decision(TypedDict, total=False):
    """A transition's answer: the entry as the function left it and what it returned (no
    `reply`: the entry itself), or its own `error`."""

    reply: Any
    error: OperationError
    entry: Dict[str, Any]


class Query(TypedDict, total=False):
    """The object a call works on, and the version the caller saw."""

    id: str
    version: int


# --- The local API (the agent's side) --------------------------------------------------------


class LockRequest(TypedDict):
    keys: List[str]


class LockEvent(TypedDict, total=False):
    event: str  # acquired, lost or error
    token: int
    code: str  # on an error: DEADLINE when the call the lock was asked for ran out of time first
    message: str


class SlotsResponse(TypedDict):
    slots: Optional[List[int]]


class Assignment(TypedDict):
    """This replica is number `i` of `n` (owning the slots i, i + n, ...)."""

    i: int
    n: int
    epoch: int


class AssignedEvent(TypedDict, total=False):
    listener: int
    assignment: Optional[Assignment]


class MeterRequest(TypedDict):
    keys: List[str]
    deltas: List[int]


class MeterResponse(TypedDict):
    debts: List[int]


class StashValue(TypedDict):
    """The stash's value under a key (None: none kept)."""

    value: Any


class StashRequest(TypedDict):
    """A value to keep, for `ttl` ms."""

    value: Any
    ttl: int


class StashDeleted(TypedDict):
    deleted: bool


class CallRequest(TypedDict, total=False):
    input: Any
    instance: str
    timeout: int
    key: str
    query: Query


# A task takes the same request as a call; it is answered `{"reply": null}` once the broker took it.
TaskRequest = CallRequest


class Halt(TypedDict):
    halt: str


# --- The program's side (the agent calls it) -------------------------------------------------


class Described(TypedDict):
    commands: List[str]
    operations: List[str]
    kinds: Dict[str, str]


class Description(Described, total=False):
    """`GET /program`: the run commands the program exports and the operations it serves, and
    the events whose receiver's request it makes and those whose condition it keeps (only
    when there are any)."""

    receivers: List[str]
    conditions: List[str]


class CallInfo(TypedDict, total=False):
    """What the agent says of a call: the same `id` on every delivery; `redelivered` when it
    was delivered before; `deadline_ms` when the agent stops waiting for this run (ms since the
    epoch: the caller's deadline for a call to one process, else the run's limit)."""

    id: str
    redelivered: bool
    deadline_ms: Optional[int]


class OperationRequest(TypedDict, total=False):
    input: Any
    entry: Optional[Dict[str, Any]]
    call: CallInfo


class AdaptRequest(TypedDict):
    """`POST /receivers/<label>`: the event, as published."""

    payload: Dict[str, Any]


class Adapted(TypedDict, total=False):
    """The request an event makes of its receiver's operation."""

    input: Any
    query: Query
    instance: str


class Adaptation(TypedDict):
    request: Adapted


class ConditionsRequest(TypedDict):
    """`POST /conditions`: the object as a write stores it (with `id` and `VERSION`), and as it
    was (`None`: there was none)."""

    entry: Dict[str, Any]
    previous: Optional[Dict[str, Any]]


class Publish(TypedDict):
    """The names of the events whose condition holds for the write."""

    publish: List[str]


class Route(NamedTuple):
    """One route: its path's `{parameters}`, its query parameters and headers, its bodies."""

    method: str
    path: str
    query: Tuple[str, ...] = ()
    headers: Tuple[str, ...] = ()
    request: Optional[Type[Any]] = None
    response: Optional[Type[Any]] = None
    error: Optional[Type[Any]] = None

    def at(self, **parameters: object) -> str:
        """The path with its parameters in place."""
        return self.path.format(**parameters)


# The component's own routes take its token.
OWN = ("Authorization",)
# The running call's id, on the calls and locks an operation asks for (toa-context's
# `program::CallHeaders`): the agent refuses a call from a transition that retries to an
# operation declaring `once`, and waits for a lock only until the call's deadline.
CALL_HEADER = "toa-call"
# W3C trace context: the agent sends it with an operation's request; the program passes it on,
# as it came, with every call and lock the operation makes, so they join the caller's trace.
TRACE_HEADERS = ("traceparent", "tracestate")

LOCK = Route("POST", "/v1/{component}/lock", headers=(*OWN, CALL_HEADER, *TRACE_HEADERS),
             request=LockRequest, response=LockEvent, error=ErrorBody)
SLOTS = Route("GET", "/v1/{component}/slots", query=("total",), headers=OWN, response=SlotsResponse,
              error=ErrorBody)
ONASSIGNED = Route("GET", "/v1/{component}/onassigned", headers=OWN, response=AssignedEvent,
                   error=ErrorBody)
FAILED = Route("POST", "/v1/{component}/onassigned/{listener}/failed", headers=OWN)
METER = Route("POST", "/v1/{component}/meter", headers=OWN, request=MeterRequest,
              response=MeterResponse, error=ErrorBody)
# The stash (what every replica should see), one key at a time.
STASH_GET = Route("GET", "/v1/{component}/stash/{key}", headers=OWN, response=StashValue, error=ErrorBody)
STASH_SET = Route("PUT", "/v1/{component}/stash/{key}", headers=OWN, request=StashRequest, error=ErrorBody)
STASH_DELETE = Route("DELETE", "/v1/{component}/stash/{key}", headers=OWN, response=StashDeleted,
                     error=ErrorBody)
CALL = Route("POST", "/v1/call/{component}/{operation}", headers=(CALL_HEADER, *TRACE_HEADERS), request=CallRequest,
             response=Outcome, error=ErrorBody)
TASK = Route("POST", "/v1/task/{component}/{operation}", headers=(CALL_HEADER, *TRACE_HEADERS), request=TaskRequest,
             error=ErrorBody)
READYZ = Route("GET", "/readyz")
DRAIN = Route("POST", "/v1/drain")
# The program's side, which takes only the agent's requests (`Authorization`: its token).
PROGRAM = Route("GET", "/program", headers=("Authorization",), response=Description)
LIFECYCLE = Route("POST", "/lifecycle/{command}", headers=("Authorization",))
OPERATIONS = Route("POST", "/operations/{name}", headers=("Authorization", *TRACE_HEADERS),
                   request=OperationRequest, response=Decision)
RECEIVERS = Route("POST", "/receivers/{label}", headers=("Authorization",), request=AdaptRequest,
                  response=Adaptation)
CONDITIONS = Route("POST", "/conditions", headers=("Authorization",), request=ConditionsRequest,
                   response=Publish)
# The control endpoint, as the stage uses it (the token itself, not a signature).
HALT = Route("POST", "/control/halt", headers=("Authorization",), request=Halt)
RESUME = Route("POST", "/control/resume", headers=("Authorization",), request=Halt)

ROUTES = (LOCK, SLOTS, ONASSIGNED, FAILED, METER, STASH_GET, STASH_SET, STASH_DELETE, CALL, TASK, READYZ, DRAIN, PROGRAM, LIFECYCLE,
          OPERATIONS, RECEIVERS, CONDITIONS, HALT, RESUME)
