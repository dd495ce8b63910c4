"""The OpenAPI 3.1 description of the HTTP API v1, generated from the pydantic request models.

``OPERATIONS`` lists every route once: method, path, request model, the success status and the
error statuses it may answer. :func:`openapi_spec` turns it into the document served at
``GET /v1/openapi.json``; request bodies are the models' JSON schemas (``components/schemas``),
every error answer is the one rcq error body. A test checks the list against the app's router both
ways (every route documented, every documented route served).

Must not import: pysyncobj, lmdb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from rcq.names import QUEUE_NAME_PATTERN
from rcq.server.config import NODE_ID_PATTERN
from rcq.server.core.directory import PARTITION_NAME_PATTERN
from rcq.server.http.models import (
    AddMemberRequest,
    BatchRequest,
    BeginRequest,
    CommitManyRequest,
    CommitRequest,
    CreatePartitionRequest,
    DequeueRequest,
    DrainNodeRequest,
    EnqueueRequest,
    ErrorBody,
    ExecuteBatchRequest,
    ExecuteRequest,
    ExtendRequest,
    PartitionMemberRequest,
    QueueDequeueRequest,
    QueueEnqueueRequest,
    QueueSettingsRequest,
    RaiseFeatureLevelRequest,
    ReceiveRequest,
    RedriveRequest,
    RejectRequest,
    ReplaceMemberRequest,
    StorageBudgetRequest,
    TransferLeadershipRequest,
)

API_VERSION = "1"
# Error statuses any route may answer: a bad body or path (400, 404), a body too big (413) or too
# slow (408), a node out of connections (503).
ANY = (400, 404, 408, 413, 503)
# Where the node has tokens, every route but these answers 401 without a valid token and 403
# when the token lacks the permission (rcq.server.http.auth).
PUBLIC = frozenset({"/healthz", "/readyz"})
AUTH = (401, 403)
LEADER = (307, 503, 504)  # a follower redirects when asked; no leader yet, or not ready; a forward's answer lost
# ...and what another partition runs, asked with Rcq-Redirect: 1 or at a partition process (docs/partitions.md)
ROUTED = (*LEADER, 421)
TRANSACTION = (404, 409, 410)  # unknown, closed (aborted, expired, committed...), outcome forgotten
WRITE = (409, 429, 507)  # too many queues; queue full or too many requests; storage full
STATUS_TEXT = {101: "Switching protocols: the channel is open", 200: "OK", 201: "Created", 202: "Accepted",
               307: "Not the leader: re-send to the Location",
               400: "Invalid request", 401: "A valid token is needed", 403: "The token does not grant this",
               404: "Not found", 408: "Request body too slow", 409: "Conflict",
               410: "Outcome no longer remembered (maybe committed)", 413: "Too large",
               421: "wrong_partition: another partition runs it (error.details.partition; leader_url when known); "
                    "nothing was run",
               422: "The node to add does not answer as that node", 429: "Back off",
               503: "Unavailable: retry shortly", 504: "Commit outcome unknown (maybe committed)",
               507: "Storage budget used up"}


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str
    summary: str
    body: type[BaseModel] | None = None
    ok: int = 200
    errors: tuple[int, ...] = ()
    query: tuple[str, ...] = ()
    text: bool = False  # answers text (the metrics), not JSON
    binary: str | None = None  # answers bytes of this media type (a backup), not JSON


OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", "/", "The live status page (HTML)", text=True),
    Operation("GET", "/v1/cluster/overview", "What the status page shows: every node, the queues, commit latency"),
    Operation("GET", "/healthz", "The node is alive"),
    Operation("GET", "/readyz", "The node is ready: a serving leader, or a follower that knows one; with "
              "partitions=1, each of its partition processes too", errors=(503,), query=("partitions",)),
    Operation("GET", "/metrics", "Prometheus metrics of this node", text=True),
    Operation("GET", "/v1/openapi.json", "This document"),
    Operation("GET", "/v1/asyncapi.json", "The AsyncAPI 3.0 description of the session channel (GET /v1/session)"),
    Operation("GET", "/v1/cluster", "This node's view of the cluster"),
    Operation("GET", "/v1/cluster/digest", "A hash of the node's replicated state and its applied index",
              errors=(503,)),
    Operation("GET", "/v1/cluster/storage", "The memory budget and table sizes"),
    Operation("PUT", "/v1/cluster/storage-budget", "A partition process's share of its node's memory budget, "
              "given by p0's leader (docs/partitions.md, \"Memory budget\"); 400 at a node's own port",
              StorageBudgetRequest, errors=(400,)),
    Operation("POST", "/v1/admin/snapshot", "Snapshot and compact the log now", ok=202),
    Operation("GET", "/v1/admin/backup", "Stream a backup of this node's state at one applied index (docs/backup.md); "
              "a leader serves one only with from_leader=true", errors=(409, 503), query=("from_leader",),
              binary="application/vnd.rcq.backup"),
    Operation("GET", "/v1/cluster/data-digest", "A hash of the node's data (what a backup restores) and its "
              "applied index", errors=(503,)),
    Operation("GET", "/v1/cluster/members", "The voting members as this node sees them"),
    Operation("POST", "/v1/cluster/members", "Add a running node as a voting member", AddMemberRequest,
              errors=(*LEADER, 409, 422, 504)),
    Operation("DELETE", "/v1/cluster/members/{node_id}", "Remove a member (the leader hands over first)",
              errors=(*LEADER, 409, 504)),
    Operation("POST", "/v1/cluster/leadership", "Hand leadership to a member", TransferLeadershipRequest,
              errors=(*LEADER, 409)),
    Operation("GET", "/v1/cluster/feature-level", "The active feature level and what each member reads"),
    Operation("POST", "/v1/cluster/feature-level", "Raise the feature level (every member must read it)",
              RaiseFeatureLevelRequest, errors=(*LEADER, 409, 504)),
    Operation("GET", "/v1/cluster/partitions", "Every partition, its members and its leader (docs/partitions.md)"),
    Operation("POST", "/v1/cluster/partitions", "Create a partition (feature level 4)", CreatePartitionRequest, 201,
              errors=(*LEADER, 409, 504)),
    Operation("DELETE", "/v1/cluster/partitions/{name}", "Delete a partition that holds no queue",
              errors=(*LEADER, 400, 404, 409, 504)),
    Operation("POST", "/v1/cluster/partitions/{name}/leadership", "Hand a partition's leadership to a member "
              "(null: its most caught-up follower)", TransferLeadershipRequest, errors=(*LEADER, 400, 404)),
    Operation("POST", "/v1/cluster/partitions/{name}/members", "Add a member to a partition; answers once its "
              "Raft group matches and every member caught up (settled), or at timeout_s",
              PartitionMemberRequest, errors=(*LEADER, 400, 404, 409, 504)),
    Operation("DELETE", "/v1/cluster/partitions/{name}/members/{node_id}", "Take a member out of a partition",
              errors=(*LEADER, 400, 404, 409, 504), query=("timeout_s",)),
    Operation("POST", "/v1/cluster/partitions/{name}/members/{node_id}/replace", "Give a member's place in a "
              "partition to another node: added and caught up first, then the member removed",
              ReplaceMemberRequest, errors=(*LEADER, 400, 404, 409, 504)),
    Operation("POST", "/v1/cluster/nodes/{node_id}/drain", "Give a node's place in every partition to other "
              "nodes, one partition after the other", DrainNodeRequest, errors=(*LEADER, 400, 404, 409, 504)),
    Operation("GET", "/v1/cluster/balance", "Leaders per node, each partition's leader, Raft members and lag, "
              "and the leader balancer's counts"),
    Operation("POST", "/v1/cluster/rebalance", "Move partition leaders now, one at a time, until spread",
              errors=LEADER),
    Operation("POST", "/v1/transactions", "Begin a transaction", BeginRequest, 201, (*ROUTED, 429)),
    Operation("GET", "/v1/transactions", "Open transactions of every partition", errors=LEADER, query=("label_prefix",)),
    Operation("GET", "/v1/transactions/{transaction_id}", "A transaction's state", errors=ROUTED + TRANSACTION),
    Operation("POST", "/v1/transactions/{transaction_id}/enqueue", "Buffer items in a transaction", EnqueueRequest,
              errors=ROUTED + TRANSACTION + WRITE),
    Operation("POST", "/v1/transactions/{transaction_id}/dequeue", "Take and lock items", DequeueRequest,
              errors=ROUTED + TRANSACTION),
    Operation("POST", "/v1/transactions/{transaction_id}/commit", "Commit", CommitRequest,
              errors=ROUTED + TRANSACTION + WRITE + (504,)),
    Operation("POST", "/v1/transactions/{transaction_id}/abort", "Abort: dequeued items back to the head",
              errors=ROUTED + TRANSACTION + (504,)),
    Operation("POST", "/v1/transactions/{transaction_id}/extend", "Move the deadline", ExtendRequest,
              errors=ROUTED + TRANSACTION + (504,)),
    Operation("POST", "/v1/transactions/{transaction_id}/reject",
              "Held items to the dead-letter queue at once", RejectRequest, errors=ROUTED + TRANSACTION + (504,)),
    Operation("POST", "/v1/commit", "Commit several transactions atomically", CommitManyRequest,
              errors=ROUTED + TRANSACTION + WRITE + (504,)),
    Operation("POST", "/v1/execute", "A one-request transaction", ExecuteRequest,
              errors=ROUTED + TRANSACTION + WRITE + (504,)),
    Operation("POST", "/v1/execute-batch", "Independent one-request transactions", ExecuteBatchRequest,
              errors=LEADER),
    Operation("POST", "/v1/batch", "Independent sub-requests in one HTTP request", BatchRequest, errors=LEADER),
    Operation("GET", "/v1/session", "Upgrade to the session channel: a WebSocket of pipelined request frames "
              "(docs/session-channel.md)", ok=101, errors=LEADER),
    Operation("GET", "/v1/queues", "Every queue with its count"),
    Operation("GET", "/v1/queues/{queue}", "A queue's count, locked items and limits", errors=(421,)),
    Operation("PUT", "/v1/queues/{queue}", "Create a queue / set its limits", QueueSettingsRequest,
              errors=(*ROUTED, 409, 504)),
    Operation("DELETE", "/v1/queues/{queue}", "Delete a queue and its items", errors=(*ROUTED, 409, 504)),
    Operation("POST", "/v1/queues/{queue}/purge", "Remove every item of a queue", errors=(*ROUTED, 504)),
    Operation("POST", "/v1/queues/{queue}/redrive", "Dead items back to their source queues", RedriveRequest,
              errors=(*ROUTED, 429, 504)),
    Operation("GET", "/v1/queues/{queue}/stats", "A queue's statistics", errors=(421,)),
    Operation("GET", "/v1/queues/{queue}/placement", "The partitions a queue lives in, for routing (docs/partitions.md)"),
    Operation("POST", "/v1/queues/{queue}/enqueue", "One-request enqueue", QueueEnqueueRequest,
              errors=ROUTED + TRANSACTION + WRITE + (504,)),
    Operation("POST", "/v1/queues/{queue}/dequeue", "One-request dequeue and commit (at most once)",
              QueueDequeueRequest, errors=ROUTED + TRANSACTION + WRITE + (504,)),
    Operation("POST", "/v1/queues/{queue}/receive", "Begin a transaction and dequeue into it, in one request",
              ReceiveRequest, errors=(*ROUTED, 429)),
)

_PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "queue": {"type": "string", "pattern": QUEUE_NAME_PATTERN},
    "transaction_id": {"type": "string", "minLength": 1, "maxLength": 80},
    "node_id": {"type": "string", "pattern": NODE_ID_PATTERN},
    "name": {"type": "string", "pattern": PARTITION_NAME_PATTERN.pattern},
}


def openapi_spec(server_url: str | None = None) -> dict[str, Any]:
    models = sorted({op.body for op in OPERATIONS if op.body is not None} | {ErrorBody}, key=lambda m: m.__name__)
    refs, definitions = models_json_schema([(m, "validation") for m in models],
                                           ref_template="#/components/schemas/{model}")
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, refs)
    spec: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "rcq", "version": API_VERSION,
                 "description": "A transactional, Raft-replicated concurrent queue. Errors always carry the "
                                "rcq error body with a stable code."},
        "paths": paths,
        "components": {"schemas": definitions.get("$defs", {}), "securitySchemes": {
            "token": {"type": "http", "scheme": "bearer", "description": "an rcq API token (rcq token create)"},
            "basic": {"type": "http", "scheme": "basic", "description": "the token as the password (browsers)"}}},
        "security": [{"token": []}, {"basic": []}],
    }
    if server_url:
        spec["servers"] = [{"url": server_url}]
    return spec


def _operation(op: Operation, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    operation_id = (op.method.lower() + op.path.replace("/", "_").replace("{", "").replace("}", "")
                    .replace("-", "_").replace(".", "_"))
    ok_content = ({("text/html" if op.path == "/" else "text/plain"): {"schema": {"type": "string"}}} if op.text
                  else {op.binary: {"schema": {"type": "string", "format": "binary"}}} if op.binary
                  else {"application/json": {"schema": {"type": "object"}}})
    responses: dict[str, Any] = {str(op.ok): {"description": STATUS_TEXT.get(op.ok, "OK"), "content": ok_content}}
    error_schema = refs[(ErrorBody, "validation")]
    auth = () if op.path in PUBLIC else AUTH
    for status in sorted(set(op.errors) | set(ANY) | set(auth)):
        responses[str(status)] = {"description": STATUS_TEXT[status],
                                  "content": {"application/json": {"schema": error_schema}}}
    operation: dict[str, Any] = {"operationId": operation_id, "summary": op.summary, "responses": responses}
    if op.path in PUBLIC:
        operation["security"] = []  # probes need no token
    parameters = [{"name": name, "in": "path", "required": True, "schema": _PATH_PARAMETERS[name]}
                  for name in _PATH_PARAMETERS if "{" + name + "}" in op.path]
    parameters += [{"name": name, "in": "query", "required": False, "schema": {"type": "string"}}
                   for name in op.query]
    if parameters:
        operation["parameters"] = parameters
    if op.body is not None:
        operation["requestBody"] = {"required": False, "content": {
            "application/json": {"schema": refs[(op.body, "validation")]}}}
    return operation
