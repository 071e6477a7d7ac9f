"""The stored-state routes: responses (retrieve, delete, input items) and the Conversations API.

Every route answers for the caller's tenant only: an id that is another tenant's gets the 404
an id that does not exist gets. Ids are checked before they reach a query (a malformed one:
400). Shapes are the official ``openai`` client's (its strict validation is the test).

| route | answer |
|---|---|
| ``GET /v1/responses/{id}`` | the stored Response (a background one that runs: as it is so far) |
| ``GET /v1/responses/{id}?stream=true&starting_after=N`` | a background response's events after ``N`` (default: all), then the live ones |
| ``POST /v1/responses/{id}/cancel`` | cancel a background response wherever it runs; the Response (idempotent) |
| ``DELETE /v1/responses/{id}`` | ``{"id", "object": "response", "deleted": true}`` |
| ``GET /v1/responses/{id}/input_items`` | a cursor page (``after``, ``limit`` 1 to 100, ``order`` asc/desc, default desc) of the turn's input items |
| ``POST /v1/conversations`` | a new conversation (``items``, ``metadata``) |
| ``GET``/``POST``/``DELETE /v1/conversations/{id}`` | retrieve, update its metadata, delete |
| ``POST``/``GET /v1/conversations/{id}/items`` | add items / a cursor page of them (default asc) |
| ``GET``/``DELETE /v1/conversations/{id}/items/{item_id}`` | one item / remove it (answers the conversation) |
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from respflow.flows.gateway._background import Background
from respflow.flows.gateway._http import error_payload, error_status, sse_response
from respflow.flows.gateway._rounds import Gateway
from respflow.flows.gateway._state import StateError, not_found, stored_item
from respflow.operators import RequestError, RespflowError
from respflow.sinks.store import Conversation, Page, Store, StoreError, tenant_of, valid_id

Handler = Callable[[Request], Awaitable[Response]]


def _error(exc: RespflowError) -> JSONResponse:
    return JSONResponse(error_payload(exc), status_code=error_status(exc))


def _page_body(page: Page) -> dict[str, Any]:
    data = page.items
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": page.has_more,
    }


def _paging(request: Request, default_order: str) -> tuple[str | None, int, str]:
    after = request.query_params.get("after")
    if after is not None and not valid_id(after):
        raise RequestError("'after' is not a valid item id", param="after")
    raw_limit = request.query_params.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 100:
        raise RequestError("'limit' must be an integer from 1 to 100", param="limit")
    order = request.query_params.get("order", default_order)
    if order not in ("asc", "desc"):
        raise RequestError("'order' must be 'asc' or 'desc'", param="order")
    return after, int(raw_limit), order


async def _json_object(request: Request, limit: int = 4 << 20) -> dict[str, Any]:
    data = await request.body()
    if len(data) > limit:
        raise RequestError(f"the request body is over {limit} bytes", status=413, code="request_too_large")
    if not data:
        return {}
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise RequestError("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    return body


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > 16 or not all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in metadata.items()
    ):
        raise RequestError("'metadata' is at most 16 string keys (64 characters) with string values (512)", param="metadata")
    return metadata


def _items(body: dict[str, Any], limit: int = 20) -> list[dict[str, Any]]:
    items = body.get("items") or []
    if not isinstance(items, list) or len(items) > limit:
        raise RequestError(f"'items' must be an array of at most {limit} items", param="items")
    return [stored_item(i) for i in items]


def _starting_after(request: Request) -> int:
    raw = request.query_params.get("starting_after")
    if raw is None:
        return -1
    if not raw.isdigit() or len(raw) > 18:
        raise RequestError("'starting_after' must be a non-negative integer (a sequence number)", param="starting_after")
    return int(raw)


def state_routes(gateway: Gateway, background: Background | None = None) -> list[Route]:
    """The routes, or none when the gateway keeps no state."""
    if gateway.store is None:
        return []
    if background is None:
        background = Background(gateway, gateway.store)
    runs: Background = background
    store: Store = gateway.store

    def endpoint(fn: Callable[[Request, str], Awaitable[Response]]) -> Handler:
        async def handler(request: Request) -> Response:
            tenant = tenant_of(request.headers.get("authorization"))
            for key, value in request.path_params.items():
                if not valid_id(value):
                    return _error(RequestError(f"{key!r} is not a valid id", param=key))
            try:
                return await fn(request, tenant)
            except RespflowError as exc:
                return _error(exc)
            except StoreError as exc:
                return _error(StateError(f"the store failed: {exc}"))

        return handler

    async def get_response(request: Request, tenant: str) -> Response:
        rid = request.path_params["response_id"]
        stream = request.query_params.get("stream", "false")
        if stream not in ("true", "false"):
            raise RequestError("'stream' must be true or false", param="stream")
        after = _starting_after(request)
        stored = await store.get_response(tenant, rid)
        if stored is None:
            raise not_found("Response", rid, "response_id")
        if stream == "false":
            return JSONResponse(await runs.so_far(tenant, stored))
        if not stored.background:
            raise RequestError(
                "only a background response can be streamed again (this one was not created with 'background': true)",
                param="stream",
            )
        if not stored.running and not await store.events_after(tenant, rid, -1):
            raise RequestError(
                f"the events of {rid} are no longer kept (they are kept {gateway.background_retention:g} s after it ended)",
                param="response_id",
                code="events_expired",
            )
        return sse_response(runs.follow(tenant, rid, after))

    async def cancel_response(request: Request, tenant: str) -> Response:
        rid = request.path_params["response_id"]
        stored = await store.get_response(tenant, rid)
        if stored is None:
            raise not_found("Response", rid, "response_id")
        if not stored.background:
            raise RequestError("only a background response can be cancelled", param="response_id")
        ended = await runs.cancel(tenant, rid)
        if ended is None:
            raise not_found("Response", rid, "response_id")
        return JSONResponse(await runs.so_far(tenant, ended))

    async def delete_response(request: Request, tenant: str) -> Response:
        rid = request.path_params["response_id"]
        if not await store.delete_response(tenant, rid):
            raise not_found("Response", rid, "response_id")
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    async def input_items(request: Request, tenant: str) -> Response:
        rid = request.path_params["response_id"]
        after, limit, order = _paging(request, "desc")
        stored = await store.get_response(tenant, rid)
        if stored is None:
            raise not_found("Response", rid, "response_id")
        return JSONResponse(_page_body(await store.page(tenant, stored.input_ids, after=after, limit=limit, order=order)))

    async def create_conversation(request: Request, tenant: str) -> Response:
        body = await _json_object(request)
        conversation = Conversation("conv_" + uuid.uuid4().hex, _metadata(body), int(time.time()))
        await store.create_conversation(tenant, conversation, _items(body), ttl=gateway.state.ttl)
        return JSONResponse(conversation.public())

    async def get_conversation(request: Request, tenant: str) -> Response:
        cid = request.path_params["conversation_id"]
        conversation = await store.get_conversation(tenant, cid)
        if conversation is None:
            raise not_found("Conversation", cid, "conversation_id")
        return JSONResponse(conversation.public())

    async def update_conversation(request: Request, tenant: str) -> Response:
        cid = request.path_params["conversation_id"]
        body = await _json_object(request)
        if "metadata" not in body:
            raise RequestError("'metadata' is required", param="metadata")
        conversation = await store.update_conversation(tenant, cid, _metadata(body))
        if conversation is None:
            raise not_found("Conversation", cid, "conversation_id")
        return JSONResponse(conversation.public())

    async def delete_conversation(request: Request, tenant: str) -> Response:
        cid = request.path_params["conversation_id"]
        if not await store.delete_conversation(tenant, cid):
            raise not_found("Conversation", cid, "conversation_id")
        return JSONResponse({"id": cid, "object": "conversation.deleted", "deleted": True})

    async def add_items(request: Request, tenant: str) -> Response:
        cid = request.path_params["conversation_id"]
        items = _items(await _json_object(request))
        if not await store.add_conversation_items(tenant, cid, items):
            raise not_found("Conversation", cid, "conversation_id")
        return JSONResponse(_page_body(Page(items, False)))

    async def list_items(request: Request, tenant: str) -> Response:
        cid = request.path_params["conversation_id"]
        after, limit, order = _paging(request, "desc")
        ids = await store.conversation_ids(tenant, cid)
        if ids is None:
            raise not_found("Conversation", cid, "conversation_id")
        return JSONResponse(_page_body(await store.page(tenant, ids, after=after, limit=limit, order=order)))

    async def get_item(request: Request, tenant: str) -> Response:
        cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
        ids = await store.conversation_ids(tenant, cid)
        if ids is None:
            raise not_found("Conversation", cid, "conversation_id")
        found = await store.items(tenant, [item_id]) if item_id in ids else []
        if not found:
            raise not_found("Item", item_id, "item_id")
        return JSONResponse(found[0])

    async def delete_item(request: Request, tenant: str) -> Response:
        cid, item_id = request.path_params["conversation_id"], request.path_params["item_id"]
        conversation = await store.get_conversation(tenant, cid)
        if conversation is None:
            raise not_found("Conversation", cid, "conversation_id")
        if not await store.delete_conversation_item(tenant, cid, item_id):
            raise not_found("Item", item_id, "item_id")
        return JSONResponse(conversation.public())

    return [
        Route("/v1/responses/{response_id}", endpoint(get_response), methods=["GET"]),
        Route("/v1/responses/{response_id}", endpoint(delete_response), methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", endpoint(input_items), methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", endpoint(cancel_response), methods=["POST"]),
        Route("/v1/conversations", endpoint(create_conversation), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", endpoint(get_conversation), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}", endpoint(update_conversation), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}", endpoint(delete_conversation), methods=["DELETE"]),
        Route("/v1/conversations/{conversation_id}/items", endpoint(add_items), methods=["POST"]),
        Route("/v1/conversations/{conversation_id}/items", endpoint(list_items), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/items/{item_id}", endpoint(get_item), methods=["GET"]),
        Route("/v1/conversations/{conversation_id}/items/{item_id}", endpoint(delete_item), methods=["DELETE"]),
    ]
